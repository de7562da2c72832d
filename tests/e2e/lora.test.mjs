// LoRA adapters through the official openai client: strata-demo served with two PEFT adapters
// (--lora a=... --lora b=...); a request naming an adapter as its model runs on it, requests for
// the base and both adapters run at once, and each answer equals its PEFT oracle's greedy ids
// (tests/data/reference/lora); /v1/models lists the adapters with their parent; unknown names
// answer 404 and bad flags stop the server at start naming the flag.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { startServer, SOURCE, BINARY } from './lib/server.mjs';

const LORA = SOURCE + '/tests/data/reference/lora';
const ORACLE = JSON.parse(readFileSync(LORA + '/lora_logits.json', 'utf8'));
const BASE = JSON.parse(readFileSync(SOURCE + '/tests/data/reference/logits.json', 'utf8'))['strata-demo'];
let server, client, rt, rtClient;
const KEY = 'e2e-lora';

before(async () => {
  server = await startServer(['--lora', `a=${LORA}/strata-demo-a`, '--lora', `b=${LORA}/strata-demo-b`]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  rt = await startServer(['--allow-runtime-lora', '--lora-dir', LORA, '--api-key', KEY]);
  rtClient = new OpenAI({ baseURL: rt.url + '/v1', apiKey: KEY, maxRetries: 0 });
});
after(async () => {
  assert.equal(await server.stop(), 0);
  assert.equal(await rt.stop(), 0);
});

async function admin(url, path, body, key = KEY) {
  const r = await fetch(url + path, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

async function greedy(model, prompt) {
  const r = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0, ignore_eos: true,
    return_tokens_as_token_ids: true, logprobs: 0 });
  return r.choices[0].logprobs.tokens.map((t) => Number(t.slice('token_id:'.length)));
}

test('each adapter answers as PEFT does, batched with the base model', async () => {
  const jobs = [];
  for (let i = 0; i < ORACLE['strata-demo:a'].cases.length; i++) {
    for (const v of ['a', 'b']) {
      const c = ORACLE[`strata-demo:${v}`].cases[i];
      jobs.push(greedy(v, c.prompt_ids).then((ids) => assert.deepEqual(ids, c.greedy_ids, `adapter ${v} case ${i}`)));
    }
    const b = BASE.cases[i];
    jobs.push(greedy('strata-demo', b.prompt_ids).then((ids) => assert.deepEqual(ids, b.greedy_ids.slice(0, 16), `base case ${i}`)));
  }
  await Promise.all(jobs);
  // The adapters change the answer: they are applied, not ignored.
  assert.notDeepEqual(ORACLE['strata-demo:a'].cases[0].greedy_ids, BASE.cases[0].greedy_ids.slice(0, 16));
});

test('models.list shows the adapters with their parent; unknown names are 404', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, ['strata-demo', 'a', 'b']);
  const a = await client.models.retrieve('a');
  assert.equal(a.parent, 'strata-demo');
  await assert.rejects(client.completions.create({ model: 'c', prompt: 'x', max_tokens: 2 }),
    (e) => { assert.equal(e.status, 404); assert.equal(e.param, 'model'); return true; });
  const chat = await client.chat.completions.create({ model: 'b', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 });
  assert.equal(chat.model, 'b');
});

test('load and unload at run time; a request in flight finishes on an unloaded adapter', async () => {
  const c = ORACLE['strata-demo:a'].cases[1];
  let r = await admin(rt.url, '/v1/load_lora_adapter', { lora_name: 'late', lora_path: 'strata-demo-a' });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.ok((await rtClient.models.list()).data.some((m) => m.id === 'late' && m.parent === 'strata-demo'));
  const ids = (await rtClient.completions.create({ model: 'late', prompt: c.prompt_ids, max_tokens: 16, temperature: 0,
    ignore_eos: true, return_tokens_as_token_ids: true, logprobs: 0 })).choices[0].logprobs.tokens.map((t) => Number(t.slice(9)));
  assert.deepEqual(ids, c.greedy_ids);
  // A long stream on the adapter, then unload while it runs: it completes; new requests are refused.
  const stream = await rtClient.completions.create({ model: 'late', prompt: c.prompt_ids, max_tokens: 200, temperature: 0,
    ignore_eos: true, stream: true });
  const it = stream[Symbol.asyncIterator]();
  await it.next();
  r = await admin(rt.url, '/v1/unload_lora_adapter', { lora_name: 'late' });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  let n = 1;
  for (let x = await it.next(); !x.done; x = await it.next()) n += x.value.choices.length ? 1 : 0;
  assert.ok(n >= 150, `the stream went on after the unload (${n} chunks)`);
  await assert.rejects(rtClient.completions.create({ model: 'late', prompt: 'x', max_tokens: 2 }), (e) => e.status === 404);
  // Bad input: each a clear error, the server keeps serving.
  for (const [path, body, status, param] of [
    ['/v1/load_lora_adapter', { lora_name: 'x', lora_path: '../lora/strata-demo-a/../../..' }, 400, 'lora_path'],
    ['/v1/load_lora_adapter', { lora_name: 'x', lora_path: '/etc' }, 400, 'lora_path'],
    ['/v1/load_lora_adapter', { lora_name: 'x', lora_path: 'nope' }, 400, 'lora_path'],
    ['/v1/load_lora_adapter', { lora_name: 'x', lora_path: 'llama3-tiny-a' }, 400, 'lora_path'],
    ['/v1/load_lora_adapter', { lora_path: 'strata-demo-a' }, 400, 'lora_name'],
    ['/v1/load_lora_adapter', { lora_name: 'strata-demo', lora_path: 'strata-demo-a' }, 400, 'lora_name'],
    ['/v1/unload_lora_adapter', { lora_name: 'never' }, 404, 'lora_name'],
  ]) {
    const res = await admin(rt.url, path, body);
    assert.equal(res.status, status, `${path} ${JSON.stringify(body)}: ${JSON.stringify(res.body)}`);
    assert.equal(res.body.error.param, param, JSON.stringify(res.body));
  }
  assert.equal((await admin(rt.url, '/v1/load_lora_adapter', { lora_name: 'x', lora_path: 'strata-demo-b' }, 'wrong')).status, 401);
  assert.equal((await admin(server.url, '/v1/load_lora_adapter', { lora_name: 'x', lora_path: 'strata-demo-b' }, 'unused')).status, 403);
  const ok = await rtClient.completions.create({ model: 'strata-demo', prompt: 'And', max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('a bad --lora stops the server at start naming it', () => {
  for (const [flag, needle] of [['nodir', /--lora must be NAME=DIR/], [`x=${LORA}/nope`, /adapter_config\.json/],
    [`x=${LORA}/llama3-tiny-a`, /lora_A/]]) {
    const r = spawnSync(BINARY, ['serve', '--port', '0', '--lora', flag], { encoding: 'utf8', timeout: 60000 });
    assert.notEqual(r.status, 0, flag);
    assert.match(r.stderr, needle, r.stderr);
  }
});
