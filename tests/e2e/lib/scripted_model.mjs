// A model that writes a fixed answer, for tests of output that random or small trained models
// never write (tool calls). It is a real qwen3 checkpoint read by the ordinary loader: its
// layers are zero, so each position's output depends on its own token only, and lm_head maps
// each token of a script to the next one (a bigram chain). The tokenizer is strata-demo's
// with the script's pieces added as tokens; the chat template ends the prompt with <|call|>
// when tools are given (the answer is a Hermes tool call) and with <|say|> otherwise.
import { mkdirSync, readFileSync, writeFileSync, existsSync, copyFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const SAY = ['<|say|>', 'Hello', ' from', ' the', ' script.'];
const CALL = ['<|call|>', 'Checking.', '<tool_call>', '\n{"name": "', 'get_weather', '", "arguments": ', '{"city": "',
  'Par', 'is", "', 'unit": "cel', 'sius"}', '}\n', '</tool_call>'];
// The same call in Qwen3-Coder's XML, its days a number only through the tool's schema.
const XML_CALL = ['<|call|>', 'Checking.', '<tool_call>', '\n<function=', 'get_weather', '>\n<parameter=', 'city',
  '>\nPar', 'is\n</parameter>\n', '<parameter=', 'days', '>\n3\n</parameter>\n', '</function>\n</tool_call>'];
const CALLS = {
  hermes: { call: CALL, doc: '{#- Tool calls are written <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call> #}' },
  qwen3_coder: { call: XML_CALL, doc: '{#- Tool calls are written <tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call> #}' },
};
// What a client sees: the text of SAY, and CALL's call.
export const SCRIPTED_TEXT = SAY.slice(1).join('');
export const SCRIPTED_CALL = { name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' }, content: 'Checking.' };
export const SCRIPTED_XML_CALL = { name: 'get_weather', arguments: { city: 'Paris', days: 3 }, content: 'Checking.' };

const HIDDEN = 64;

function safetensors(tensors) {
  const header = {};
  let offset = 0;
  for (const [name, { shape, data }] of Object.entries(tensors)) {
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let h = JSON.stringify(header);
  while ((h.length + 8) % 8 !== 0) h += ' ';
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  return Buffer.concat([len, Buffer.from(h), ...Object.values(tensors).map((t) => Buffer.from(t.data.buffer))]);
}

// format: the tool-call format the call is written in (hermes or qwen3_coder); the chat template
// shows it, so the server detects it.
export function scriptedModel(source, format = 'hermes') {
  const { call: CALL_CHAIN, doc } = CALLS[format];
  const dir = path.join(tmpdir(), `strata-e2e-scripted-${process.getuid?.() ?? 0}${format === 'hermes' ? '' : '-' + format}`);
  if (existsSync(path.join(dir, 'model.safetensors'))) return dir;
  mkdirSync(dir, { recursive: true });
  const demo = path.join(source, 'models', 'strata-demo');
  const tok = JSON.parse(readFileSync(path.join(demo, 'tokenizer.json'), 'utf8'));
  const EOS = 2;  // <|im_end|>
  const ids = new Map();
  let next = Object.keys(tok.model.vocab).length;
  for (const piece of [...SAY, ...CALL_CHAIN]) {
    if (ids.has(piece)) throw new Error(`script piece ${JSON.stringify(piece)} repeats`);
    ids.set(piece, next);
    tok.added_tokens.push({ id: next, content: piece, single_word: false, lstrip: false, rstrip: false, normalized: false,
      special: piece === '<|say|>' || piece === '<|call|>' });
    next++;
  }
  const vocab = next;
  writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));
  const template = [
    doc,
    "{%- if tools %}{{ '<|im_start|>system\\n<tools>' + (tools | tojson) + '</tools><|im_end|>\\n' }}{%- endif %}",
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}",
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- if tools %}{{ '<|call|>' }}{%- else %}{{ '<|say|>' }}{%- endif %}{%- endif %}",
  ].join('');
  const cfg = JSON.parse(readFileSync(path.join(demo, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = template;
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg, null, 2));
  copyFileSync(path.join(demo, 'generation_config.json'), path.join(dir, 'generation_config.json'));
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', attention_bias: false, bos_token_id: 0, eos_token_id: EOS,
    head_dim: 16, hidden_act: 'silu', hidden_size: HIDDEN, intermediate_size: 128, max_position_embeddings: 4096,
    num_attention_heads: 4, num_hidden_layers: 1, num_key_value_heads: 2, rms_norm_eps: 1e-6,
    rope_parameters: { rope_theta: 10000.0, rope_type: 'default' }, tie_word_embeddings: false, vocab_size: vocab,
  }, null, 2));

  // Chain token k has embedding e_k; lm_head row of its successor is 10 e_k, so after the final
  // norm (x / rms(x) = 8 e_k) the successor's logit is 80 and every other one 0.
  const embed = new Float32Array(vocab * HIDDEN);
  const head = new Float32Array(vocab * HIDDEN);
  let k = 0;
  for (const chain of [SAY, CALL_CHAIN]) {
    const seq = [...chain.map((p) => ids.get(p)), EOS];
    for (let i = 0; i + 1 < seq.length; i++, k++) {
      embed[seq[i] * HIDDEN + k] = 1;
      head[seq[i + 1] * HIDDEN + k] = 10;
    }
  }
  if (k > HIDDEN) throw new Error('the script is longer than the hidden size');
  const zeros = (...shape) => ({ shape, data: new Float32Array(shape.reduce((a, b) => a * b, 1)) });
  const ones = (n) => ({ shape: [n], data: new Float32Array(n).fill(1) });
  const t = { 'model.embed_tokens.weight': { shape: [vocab, HIDDEN], data: embed } };
  const p = 'model.layers.0.';
  t[p + 'input_layernorm.weight'] = ones(HIDDEN);
  t[p + 'self_attn.q_proj.weight'] = zeros(64, HIDDEN);
  t[p + 'self_attn.k_proj.weight'] = zeros(32, HIDDEN);
  t[p + 'self_attn.v_proj.weight'] = zeros(32, HIDDEN);
  t[p + 'self_attn.o_proj.weight'] = zeros(HIDDEN, 64);
  t[p + 'self_attn.q_norm.weight'] = ones(16);
  t[p + 'self_attn.k_norm.weight'] = ones(16);
  t[p + 'post_attention_layernorm.weight'] = ones(HIDDEN);
  t[p + 'mlp.gate_proj.weight'] = zeros(128, HIDDEN);
  t[p + 'mlp.up_proj.weight'] = zeros(128, HIDDEN);
  t[p + 'mlp.down_proj.weight'] = zeros(HIDDEN, 128);
  t['model.norm.weight'] = ones(HIDDEN);
  t['lm_head.weight'] = { shape: [vocab, HIDDEN], data: head };
  writeFileSync(path.join(dir, 'model.safetensors'), safetensors(t));
  return dir;
}
