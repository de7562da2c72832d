// Starts `strata serve` on a free loopback port and stops it; reads /metrics.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, existsSync, mkdirSync, copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

export const BINARY = process.env.STRATA_BINARY;
export const SOURCE = process.env.STRATA_SOURCE_DIR;
if (!BINARY || !SOURCE) throw new Error('set STRATA_BINARY and STRATA_SOURCE_DIR (tests/e2e/run.sh does)');
export const DEMO = path.join(SOURCE, 'models', 'strata-demo');

export async function startServer(args = [], { env = {} } = {}) {
  const proc = spawn(BINARY, ['serve', '--port', '0', '--threads', '2', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + stderr)), 60000);
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited with ${code}:\n${stderr}`)); });
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    url,
    proc,
    stderr: () => stderr,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      proc.kill('SIGTERM');
      const r = await exited;
      return r.code;
    },
  };
}

export async function metrics(url, headers = {}) {
  const res = await fetch(url + '/metrics', { headers });
  const text = await res.text();
  const value = (name, labels = '') => {
    for (const line of text.split('\n')) {
      if (line.startsWith(name + '{') && line.includes(labels)) return Number(line.split(' ').pop());
    }
    return NaN;
  };
  return { text, value, usedBlocks: value('strata_kv_blocks', 'state="used"') };
}

// Waits until no KV block is referenced (a cancelled request frees its blocks within a step).
export async function waitNoUsedBlocks(url, headers = {}, timeoutMs = 5000) {
  const t0 = Date.now();
  let used = NaN;
  while (Date.now() - t0 < timeoutMs) {
    used = (await metrics(url, headers)).usedBlocks;
    if (used === 0) return 0;
    await new Promise((r) => setTimeout(r, 50));
  }
  return used;
}

// A random-weight qwen3-shaped model with the real Qwen3 tokenizer and chat template.
export function qwen3SynthModel() {
  const dir = path.join(tmpdir(), `strata-e2e-qwen3-${process.getuid?.() ?? 0}`);
  if (existsSync(path.join(dir, 'model.safetensors'))) return dir;
  const tok = mkdtempSync(path.join(tmpdir(), 'strata-e2e-tok-'));
  const ref = path.join(SOURCE, 'tests', 'data', 'reference', 'tokenizers', 'qwen3');
  execFileSync('sh', ['-c', `xz -dc '${ref}/tokenizer.json.xz' > '${tok}/tokenizer.json'`]);
  copyFileSync(path.join(ref, 'tokenizer_config.json'), path.join(tok, 'tokenizer_config.json'));
  mkdirSync(dir, { recursive: true });
  execFileSync(BINARY, ['bench', 'synth-model', '--out', dir, '--preset', 'tiny', '--tokenizer', tok], { stdio: 'inherit' });
  return dir;
}

// A reference tiny checkpoint (tests/data/reference/models/NAME, vocabulary 512) served with a
// 512-token cut of the Llama-2 tokenizer: its specials, the 256 byte-fallback pieces and the
// merges whose parts and result fall below 512, so every text encodes; a plain chat template.
export function tinyModelWithTokenizer(name) {
  const dir = path.join(tmpdir(), `strata-e2e-${name}-${process.getuid?.() ?? 0}`);
  if (existsSync(path.join(dir, 'tokenizer_config.json'))) return dir;
  mkdirSync(dir, { recursive: true });
  const src = path.join(SOURCE, 'tests', 'data', 'reference', 'models', name);
  for (const f of ['config.json', 'generation_config.json', 'model.safetensors']) {
    copyFileSync(path.join(src, f), path.join(dir, f));
  }
  const ref = path.join(SOURCE, 'tests', 'data', 'reference', 'tokenizers', 'llama2');
  const tok = JSON.parse(execFileSync('xz', ['-dc', path.join(ref, 'tokenizer.json.xz')], { maxBuffer: 1 << 28 }).toString());
  const vocab = {};
  for (const [piece, id] of Object.entries(tok.model.vocab)) if (id < 512) vocab[piece] = id;
  const merges = [];
  for (const m of tok.model.merges) {
    const [a, b] = Array.isArray(m) ? m : m.split(' ');
    if (a in vocab && b in vocab && (a + b) in vocab) merges.push(m);
  }
  tok.model.vocab = vocab;
  tok.model.merges = merges;
  tok.added_tokens = tok.added_tokens.filter((t) => t.id < 512);
  writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));
  const cfg = JSON.parse(readFileSync(path.join(ref, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}" +
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}";
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg, null, 2));
  return dir;
}
