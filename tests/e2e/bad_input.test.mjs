// Bad input: each case gets its error, and afterwards the server still answers and holds no
// KV block.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, waitNoUsedBlocks } from './lib/server.mjs';

const KEY = 'k-123';
const AUTH = { Authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
let server;

before(async () => {
  server = await startServer(['--api-key', KEY, '--max-body-bytes', '65536', '--max-model-len', '512']);
});
after(async () => { await server.stop(); });

async function post(path, body, headers = AUTH) {
  const res = await fetch(server.url + path, { method: 'POST', headers, body });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text, headers: res.headers };
}

// The server still generates, and no block is left referenced.
async function stillHealthy() {
  assert.equal((await fetch(server.url + '/health')).status, 200);
  const r = await post('/v1/completions', JSON.stringify({ prompt: 'In the beginning', max_tokens: 3 }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.completion_tokens >= 1, true);
  assert.equal(await waitNoUsedBlocks(server.url, AUTH), 0);
}

function expectError(r, status, param, pattern) {
  assert.equal(r.status, status, r.text);
  assert.ok(r.json?.error, r.text);
  assert.equal(typeof r.json.error.message, 'string');
  assert.ok('type' in r.json.error && 'param' in r.json.error && 'code' in r.json.error);
  if (param !== undefined) assert.equal(r.json.error.param, param);
  if (pattern) assert.match(r.json.error.message, pattern);
}

const msgs = [{ role: 'user', content: 'hi' }];

test('malformed JSON', async () => {
  expectError(await post('/v1/chat/completions', '{"messages": [ {"role": "user", '), 400, 'body', /not valid JSON/);
  await stillHealthy();
});

test('wrong types', async () => {
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, temperature: 'hot' })), 400, 'temperature', /"hot"/);
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: 'hi' })), 400, 'messages');
  expectError(await post('/v1/completions', JSON.stringify({ prompt: { text: 1 } })), 400, 'prompt');
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, n: 3 })), 400, 'n', /3/);
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, response_format: { type: 'json_object' } })), 400, 'response_format');
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }] })),
    400, 'messages[0].content[0].type', /image_url/);
  await stillHealthy();
});

test('unknown model', async () => {
  expectError(await post('/v1/chat/completions', JSON.stringify({ model: 'gpt-9', messages: msgs })), 404, 'model', /gpt-9/);
  await stillHealthy();
});

test('empty messages', async () => {
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: [] })), 400, 'messages', /at least one/);
  await stillHealthy();
});

test('invalid UTF-8', async () => {
  const body = Buffer.concat([Buffer.from('{"prompt": "abc'), Buffer.from([0xff, 0xfe]), Buffer.from('", "max_tokens": 2}')]);
  expectError(await post('/v1/completions', body), 400, 'body', /UTF-8 \(byte offset 15\)/);
  await stillHealthy();
});

test('oversized body answers 413', async () => {
  const big = JSON.stringify({ prompt: 'x'.repeat(70000), max_tokens: 1 });
  const r = await post('/v1/completions', big);
  assert.equal(r.status, 413);
  assert.match(r.json.error.message, /65536/);
  await stillHealthy();
});

test('max_tokens <= 0 or past the context', async () => {
  expectError(await post('/v1/completions', JSON.stringify({ prompt: 'hi', max_tokens: 0 })), 400, 'max_tokens', /got 0/);
  expectError(await post('/v1/completions', JSON.stringify({ prompt: 'hi', max_tokens: -5 })), 400, 'max_tokens', /-5/);
  const r = await post('/v1/completions', JSON.stringify({ prompt: [5, 6, 7], max_tokens: 510 }));
  expectError(r, 400, 'max_tokens', /prompt \(3 tokens\) \+ max_tokens \(510\).*512/);
  await stillHealthy();
});

test('missing or wrong API key', async () => {
  const body = JSON.stringify({ prompt: 'hi', max_tokens: 1 });
  expectError(await post('/v1/completions', body, { 'content-type': 'application/json' }), 401, undefined, /missing API key/);
  expectError(await post('/v1/completions', body, { Authorization: 'Bearer nope' }), 401, undefined, /invalid API key/);
  assert.equal((await fetch(server.url + '/metrics')).status, 401);
  assert.equal((await fetch(server.url + '/v1/models')).status, 401);
  const anth = await post('/v1/messages', JSON.stringify({ max_tokens: 1, messages: msgs }), { 'x-api-key': 'wrong' });
  assert.equal(anth.status, 401);
  assert.equal(anth.json.type, 'error');
  assert.equal(anth.json.error.type, 'authentication_error');
  assert.equal((await post('/v1/messages', JSON.stringify({ max_tokens: 1, messages: msgs }), { 'x-api-key': KEY })).status, 200);
  assert.equal((await fetch(server.url + '/health')).status, 200);  // health needs no key
  await stillHealthy();
});

function rawRequest(body) {
  return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n` +
         `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

test('a client that vanishes mid-stream is cancelled', async () => {
  const body = JSON.stringify({ prompt: 'And God said', max_tokens: 400, ignore_eos: true, stream: true });
  await new Promise((resolve, reject) => {
    const s = net.connect(new URL(server.url).port, '127.0.0.1', () => s.write(rawRequest(body)));
    let seen = '';
    s.on('data', (d) => {
      seen += d.toString();
      if ((seen.match(/data: /g) || []).length >= 3) { s.destroy(); resolve(); }
    });
    s.on('error', reject);
  });
  assert.equal(await waitNoUsedBlocks(server.url, AUTH), 0);
  const m = await (await fetch(server.url + '/metrics', { headers: AUTH })).text();
  assert.match(m, /strata_client_disconnects_total\{[^}]*\} [1-9]/);
  await stillHealthy();
});

test('a non-streaming client that vanishes is cancelled', async () => {
  const body = JSON.stringify({ prompt: 'And God said', max_tokens: 450, ignore_eos: true });
  const s = net.connect(new URL(server.url).port, '127.0.0.1', () => s.write(rawRequest(body)));
  await new Promise((r) => setTimeout(r, 150));
  s.destroy();
  assert.equal(await waitNoUsedBlocks(server.url, AUTH), 0);
  await stillHealthy();
});

test('200 concurrent connections opened and dropped', async () => {
  const port = new URL(server.url).port;
  const body = JSON.stringify({ prompt: 'Blessed are', max_tokens: 300, ignore_eos: true, stream: true });
  const sockets = await Promise.all(Array.from({ length: 200 }, (_, i) => new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => {
      if (i % 3 === 0) s.write(rawRequest(body));                  // a whole streaming request
      else if (i % 3 === 1) s.write(rawRequest(body).slice(0, 40)); // half a request
      resolve(s);                                                    // or nothing at all
    });
    s.on('error', () => resolve(s));
  })));
  await new Promise((r) => setTimeout(r, 200));
  for (const s of sockets) s.destroy();
  assert.equal(await waitNoUsedBlocks(server.url, AUTH, 20000), 0);
  await stillHealthy();
});
