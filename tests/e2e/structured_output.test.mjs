// Structured output through the official clients: response_format json_schema on chat (plain and
// streamed) and json_object, vLLM's structured_outputs / guided_* on completions, forced tool
// calls (tool_choice required and a named function, plain and streamed; Anthropic tool_choice
// any and tool) on strata-demo served with a chat template that renders tools in the Hermes
// format (the model never calls a tool unless forced). Every output is checked by
// python3-jsonschema (Draft 2020-12); forced spans are filled (usage.fill); bad input answers
// 400 naming the field and the server keeps answering.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, copyFileSync, writeFileSync, readFileSync, symlinkSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, DEMO } from './lib/server.mjs';

let demo, tools;
let client, toolClient, anthropic;

// strata-demo with a chat template that renders tools and shows Hermes <tool_call> calls.
function toolsModel() {
  const dir = path.join(tmpdir(), `strata-e2e-tools-${process.getuid?.() ?? 0}-${process.pid}`);
  mkdirSync(dir, { recursive: true });
  for (const f of ['config.json', 'generation_config.json', 'tokenizer.json']) copyFileSync(path.join(DEMO, f), path.join(dir, f));
  if (!existsSync(path.join(dir, 'model.safetensors'))) symlinkSync(path.join(DEMO, 'model.safetensors'), path.join(dir, 'model.safetensors'));
  const cfg = JSON.parse(readFileSync(path.join(DEMO, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = [
    "{%- if tools %}{{ '<|im_start|>system\\nCall a tool as <tool_call>\\n{\"name\": ..., \"arguments\": ...}\\n</tool_call>\\n<tools>' + (tools | tojson) + '</tools><|im_end|>\\n' }}{%- endif %}",
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}",
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
  ].join('');
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
  return dir;
}

// python3-jsonschema's verdicts on [schema, instance] pairs: '' for valid, else the errors.
function validate(pairs) {
  const script = `
import json, sys, jsonschema
out = []
for schema, inst in json.load(sys.stdin):
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    out.append("; ".join(sorted(e.message for e in v.iter_errors(inst))))
print(json.dumps(out))`;
  const r = spawnSync('python3', ['-c', script], { input: JSON.stringify(pairs), encoding: 'utf8' });
  assert.equal(r.status, 0, 'python3-jsonschema oracle: ' + r.stderr);
  return JSON.parse(r.stdout);
}
function assertValid(schema, instance) {
  assert.equal(validate([[schema, instance]])[0], '', JSON.stringify(instance));
}

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    tribe: { enum: ['Judah', 'Levi', 'Dan'] },
  },
  required: ['name', 'age', 'tribe'],
  additionalProperties: false,
};
const WEATHER = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const TIME = {
  type: 'object',
  properties: { zone: { type: 'string', pattern: '^[A-Z][a-z]{2,8}$' }, day: { type: 'string', format: 'date' } },
  required: ['zone', 'day'],
  additionalProperties: false,
};
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: WEATHER } },
  { type: 'function', function: { name: 'get_time', description: 'Time in a zone', parameters: TIME, strict: true } },
];
const MSG = [{ role: 'user', content: 'Who led the children of Israel? Answer as JSON.' }];

before(async () => {
  demo = await startServer(['--max-model-len', '2048']);
  tools = await startServer(['--model', toolsModel(), '--served-model-name', 'tools', '--max-model-len', '2048']);
  client = new OpenAI({ baseURL: demo.url + '/v1', apiKey: 'x', maxRetries: 0 });
  toolClient = new OpenAI({ baseURL: tools.url + '/v1', apiKey: 'x', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: tools.url, apiKey: 'x', maxRetries: 0 });
});
after(async () => {
  assert.equal(await demo.stop(), 0);
  assert.equal(await tools.stop(), 0);
});

const jsonSchemaFormat = { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } };

test('response_format json_schema: sampled chat outputs parse and validate', async () => {
  const outs = [];
  for (let seed = 1; seed <= 6; seed++) {
    const r = await client.chat.completions.create({ model: 'strata-demo', messages: MSG, max_tokens: 120, temperature: 1, seed,
      response_format: jsonSchemaFormat });
    assert.equal(r.choices[0].finish_reason, 'stop');
    outs.push(JSON.parse(r.choices[0].message.content));
  }
  assert.deepEqual(validate(outs.map((o) => [PERSON, o])), outs.map(() => ''));
});

test('response_format json_schema streams as usual', async () => {
  const stream = await client.chat.completions.create({ model: 'strata-demo', messages: MSG, max_tokens: 120, temperature: 1,
    seed: 11, response_format: jsonSchemaFormat, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, chunks = 0, usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    text += c.choices[0].delta.content ?? '';
    finish = c.choices[0].finish_reason ?? finish;
    chunks++;
  }
  assert.equal(finish, 'stop');
  assert.ok(chunks > 3, 'streamed in pieces');
  assert.ok(usage && usage.completion_tokens > 0);
  assertValid(PERSON, JSON.parse(text));
});

test('json_object and vLLM structured_outputs / guided_* constrain chat and completions', async () => {
  const obj = await client.chat.completions.create({ model: 'strata-demo', messages: MSG, max_tokens: 200, temperature: 0.7,
    seed: 2, response_format: { type: 'json_object' } });
  if (obj.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(obj.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(!Array.isArray(v));
  } else {
    assert.match(obj.choices[0].message.content, /^\{/);
  }
  const choices = ['Moses', 'Aaron', 'Joshua'];
  for (const body of [{ structured_outputs: { choice: choices } }, { guided_choice: choices }]) {
    const c = await client.completions.create({ model: 'strata-demo', prompt: 'The leader was', max_tokens: 16, temperature: 1,
      seed: 4, ...body });
    assert.ok(choices.includes(c.choices[0].text), c.choices[0].text);
    assert.equal(c.choices[0].finish_reason, 'stop');
  }
  const re = await client.completions.create({ model: 'strata-demo', prompt: 'Chapter and verse:', max_tokens: 16, temperature: 1,
    seed: 5, structured_outputs: { regex: '[A-Z][a-z]{2,6} [0-9]{1,2}:[0-9]{1,2}' } });
  assert.match(re.choices[0].text, /^[A-Z][a-z]{2,6} [0-9]{1,2}:[0-9]{1,2}$/);
  const gj = await client.completions.create({ model: 'strata-demo', prompt: 'JSON:', max_tokens: 120, temperature: 1, seed: 6,
    guided_json: PERSON });
  assert.equal(gj.choices[0].finish_reason, 'stop');
  assertValid(PERSON, JSON.parse(gj.choices[0].text));
});

function checkCall(call, names) {
  assert.equal(call.type, 'function');
  assert.ok(names.includes(call.function.name), call.function.name);
  const schema = TOOLS.find((t) => t.function.name === call.function.name).function.parameters;
  assertValid(schema, JSON.parse(call.function.arguments));
}

test('tool_choice required forces a call in the model\'s format; its arguments validate', async () => {
  for (let seed = 1; seed <= 4; seed++) {
    const r = await toolClient.chat.completions.create({ model: 'tools', messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: TOOLS, tool_choice: 'required', max_tokens: 150, temperature: 1, seed });
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, 'tool_calls');
    assert.equal(ch.message.tool_calls.length, 1);
    checkCall(ch.message.tool_calls[0], ['get_weather', 'get_time']);
    // The call's frame and keys are forced: token fill appends them without sampling.
    assert.ok(r.usage.fill && r.usage.fill.tokens > 0 && r.usage.fill.spans > 0, JSON.stringify(r.usage));
  }
});

test('a named function is the one called, plain and streamed', async () => {
  const named = { type: 'function', function: { name: 'get_time' } };
  const r = await toolClient.chat.completions.create({ model: 'tools', messages: [{ role: 'user', content: 'Time?' }], tools: TOOLS,
    tool_choice: named, max_tokens: 150, temperature: 1, seed: 9 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  checkCall(r.choices[0].message.tool_calls[0], ['get_time']);
  const stream = toolClient.chat.completions.stream({ model: 'tools', messages: [{ role: 'user', content: 'Weather?' }], tools: TOOLS,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 150, temperature: 1, seed: 3 });
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  checkCall(final.choices[0].message.tool_calls[0], ['get_weather']);
});

test('Anthropic tool_choice any and tool force a tool_use block whose input validates', async () => {
  const atools = TOOLS.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
  const any = await anthropic.messages.create({ model: 'tools', max_tokens: 150, temperature: 1, tools: atools,
    tool_choice: { type: 'any' }, messages: [{ role: 'user', content: 'Weather in Paris?' }] });
  assert.equal(any.stop_reason, 'tool_use');
  const use = any.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(any.content));
  assertValid(atools.find((t) => t.name === use.name).input_schema, use.input);
  const one = await anthropic.messages.create({ model: 'tools', max_tokens: 150, temperature: 1, tools: atools,
    tool_choice: { type: 'tool', name: 'get_time' }, messages: [{ role: 'user', content: 'Time?' }] });
  const use2 = one.content.find((b) => b.type === 'tool_use');
  assert.equal(use2.name, 'get_time');
  assertValid(TIME, use2.input);
});

test('Responses API: text.format json_schema validates; tool_choice required and named force a function_call', async () => {
  for (let seed = 1; seed <= 3; seed++) {
    const r = await client.responses.create({ model: 'strata-demo', input: 'Who led the children of Israel? Answer as JSON.',
      max_output_tokens: 120, temperature: 1, seed,
      text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } } });
    assert.equal(r.text.format.type, 'json_schema');
    if (r.status === 'completed') assertValid(PERSON, JSON.parse(r.output_text));
  }
  const obj = await client.responses.create({ model: 'strata-demo', input: 'JSON please', max_output_tokens: 60, temperature: 0,
    text: { format: { type: 'json_object' } } });
  if (obj.status === 'completed') assert.equal(typeof JSON.parse(obj.output_text), 'object');
  const rtools = TOOLS.map((t) => ({ type: 'function', name: t.function.name, description: t.function.description,
    parameters: t.function.parameters, strict: t.function.strict ?? false }));
  const req = await toolClient.responses.create({ model: 'tools', input: 'Weather in Paris?', tools: rtools, tool_choice: 'required',
    max_output_tokens: 150, temperature: 1 });
  const call = req.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(req.output));
  assertValid(TOOLS.find((t) => t.function.name === call.name).function.parameters, JSON.parse(call.arguments));
  const named = await toolClient.responses.create({ model: 'tools', input: 'Time?', tools: rtools,
    tool_choice: { type: 'function', name: 'get_time' }, max_output_tokens: 150, temperature: 1 });
  const call2 = named.output.find((o) => o.type === 'function_call');
  assert.equal(call2.name, 'get_time');
  assertValid(TIME, JSON.parse(call2.arguments));
  await assert.rejects(client.responses.create({ model: 'strata-demo', input: 'x',
    text: { format: { type: 'json_schema', name: 'bad', schema: { type: 'object', properties: { a: { type: 'nope' } } } } } }),
  (e) => e.status === 400 && e.error.param.startsWith('text.format'));
  await assert.rejects(toolClient.responses.create({ model: 'tools', input: 'x', tools: rtools,
    tool_choice: { type: 'function', name: 'missing' } }), (e) => e.status === 400 && e.error.param === 'tool_choice');
});

test('bad constraints answer 400 naming the field; the server keeps serving', async () => {
  const base = { model: 'strata-demo', messages: MSG, max_tokens: 8 };
  const cases = [
    [{ guided_json: '{"type": "object",' }, 'guided_json', /invalid JSON/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', frobnicate: 1 } } } },
      'response_format.json_schema.schema', /frobnicate/],
    [{ structured_outputs: { regex: '(ab' } }, 'structured_outputs.regex', /regex/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', items: { type: 'string' }, minItems: 50000 } } } },
      'response_format.json_schema.schema', /limit|max_repeat|exceed/i],
    [{ response_format: { type: 'xml' } }, 'response_format.type', /xml/],
    [{ guided_regex: 'a+', guided_choice: ['a'] }, 'guided_choice', /both constrain/],
    [{ structured_outputs: { structural_tag: 'x' } }, 'structured_outputs.structural_tag', /not supported/],
  ];
  for (const [extra, param, re] of cases) {
    await assert.rejects(client.chat.completions.create({ ...base, ...extra }), (e) => {
      assert.equal(e.status, 400, JSON.stringify(extra));
      assert.equal(e.error.param, param, JSON.stringify(e.error));
      assert.match(e.error.message, re);
      return true;
    });
  }
  await assert.rejects(toolClient.chat.completions.create({ model: 'tools', messages: MSG, max_tokens: 8, tools: TOOLS,
    tool_choice: 'required', response_format: jsonSchemaFormat }), (e) => e.status === 400 && e.error.param === 'response_format.json_schema.schema');
  await assert.rejects(client.chat.completions.create({ ...base, tools: TOOLS, tool_choice: 'required' }),
    (e) => e.status === 400 && e.error.param === 'tools');
  const ok = await client.chat.completions.create({ ...base, temperature: 0 });
  assert.equal(ok.choices.length, 1);
  const ok2 = await toolClient.chat.completions.create({ model: 'tools', messages: MSG, max_tokens: 4, temperature: 0 });
  assert.equal(ok2.choices.length, 1);
});
