// Bad input: each case gets its error, and afterwards the server still answers and holds no
// KV block. JSON nested past --max-json-depth (256) in any field, numbers past a double's range
// and out-of-range temperatures answer 400 naming the field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, waitNoUsedBlocks } from './lib/server.mjs';

const KEY = 'k-123';
const AUTH = { Authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
let server;

before(async () => {
  server = await startServer(['--api-key', KEY, '--max-body-bytes', '300000', '--max-model-len', '512']);
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
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, n: 0 })), 400, 'n', /got 0/);
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, response_format: { type: 'xml' } })), 400, 'response_format.type', /xml/);
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
  const big = JSON.stringify({ prompt: 'x'.repeat(310000), max_tokens: 1 });
  const r = await post('/v1/completions', big);
  assert.equal(r.status, 413);
  assert.match(r.json.error.message, /300000/);
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

test('the Bearer scheme is case-insensitive', async () => {
  const body = JSON.stringify({ prompt: 'hi', max_tokens: 1 });
  for (const scheme of ['bearer', 'BEARER', 'bEaReR']) {
    const r = await post('/v1/completions', body, { Authorization: `${scheme} ${KEY}`, 'content-type': 'application/json' });
    assert.equal(r.status, 200, `${scheme}: ${r.text}`);
  }
  expectError(await post('/v1/completions', body, { Authorization: `bearer ${KEY}x` }), 401, undefined, /invalid API key/);
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

// JSON nesting: past --max-json-depth (256) anywhere is refused before anything parses it.
const nested = (n) => '['.repeat(n) + ']'.repeat(n);
const DEPTH = /JSON nested deeper than 256 levels/;
const user = '[{"role": "user", "content": "hi"}]';

test('100,000 nested arrays, in each field, answer 400 naming the field', async () => {
  const deep = nested(100000);
  const cases = [
    ['/v1/chat/completions', deep, 'body', /at body\[0\]\[0\]/],
    ['/v1/chat/completions', `{"model": ${deep}, "messages": ${user}}`, 'model', /at model\[0\]/],
    ['/v1/chat/completions', `{"messages": ${deep}}`, 'messages', /at messages\[0\]/],
    ['/v1/chat/completions', `{"messages": ${user}, "max_tokens": ${deep}}`, 'max_tokens', /at max_tokens\[0\]/],
    ['/v1/chat/completions',
      `{"messages": ${user}, "tools": [{"type": "function", "function": {"name": "f", "parameters": ${deep}}}]}`,
      'tools', /at tools\[0\]\.function\.parameters\[0\]/],
    ['/v1/chat/completions', `{"messages": ${user}, "chat_template_kwargs": ${deep}}`, 'chat_template_kwargs',
      /at chat_template_kwargs\[0\]/],
    // Tool-call arguments given as a JSON string are checked as JSON too.
    ['/v1/chat/completions', JSON.stringify({
      messages: [
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: deep } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'ok' },
      ],
    }), 'messages[1].tool_calls[0].function.arguments', /at messages\[1\]\.tool_calls\[0\]\.function\.arguments\[0\]/],
    ['/detokenize', `{"tokens": ${deep}}`, 'tokens', /at tokens\[0\]/],
  ];
  for (const [path, body, param, where] of cases) {
    const t0 = Date.now();
    const r = await post(path, body);
    expectError(r, 400, param, DEPTH);
    assert.match(r.json.error.message, where, param);
    assert.ok(Date.now() - t0 < 2000, `${param}: answered in ${Date.now() - t0} ms`);
  }
  // Anthropic's error shape has no param: the message names the field.
  const r = await post('/v1/messages', `{"max_tokens": 4, "messages": ${user}, "tools": [{"name": "f", "input_schema": ${deep}}]}`);
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'invalid_request_error');
  assert.match(r.json.error.message, DEPTH);
  assert.match(r.json.error.message, /tools\[0\]\.input_schema/);
  await stillHealthy();
});

test('256 levels of nesting pass the depth check, 257 do not', async () => {
  // The whole body: 256 arrays are refused for not being an object, not for their depth.
  const at256 = await post('/v1/chat/completions', nested(256));
  assert.equal(at256.status, 400, at256.text);
  assert.doesNotMatch(at256.json.error.message, DEPTH);
  expectError(await post('/v1/chat/completions', nested(257)), 400, 'body', DEPTH);
  // In a field the body object is the first level: {"chat_template_kwargs": {"x": 254 arrays}} is 256.
  const kw = (n) => `{"messages": ${user}, "max_tokens": 1, "chat_template_kwargs": {"x": ${nested(n)}}}`;
  const ok = await post('/v1/chat/completions', kw(254));
  assert.ok(!DEPTH.test(ok.text), ok.text);
  assert.equal(ok.status, 200, ok.text);
  expectError(await post('/v1/chat/completions', kw(255)), 400, 'chat_template_kwargs', DEPTH);
  // A JSON string's own nesting counts from its start.
  const args = (n) => JSON.stringify({
    messages: [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: `{"a": ${nested(n)}}` } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'ok' },
    ],
    max_tokens: 1,
  });
  const a255 = await post('/v1/chat/completions', args(255));
  assert.ok(!DEPTH.test(a255.text), a255.text);
  assert.equal(a255.status, 200, a255.text);
  expectError(await post('/v1/chat/completions', args(256)), 400, 'messages[1].tool_calls[0].function.arguments', DEPTH);
  await stillHealthy();
});

test('numbers past a double and out-of-range temperatures answer 400 naming the field', async () => {
  // JSON.stringify cannot write 1e400: raw text.
  expectError(await post('/v1/chat/completions', `{"messages": ${user}, "temperature": 1e400}`), 400, 'temperature', /1e400 is out of range/);
  expectError(await post('/v1/chat/completions', `{"messages": ${user}, "max_tokens": 1e400}`), 400, 'max_tokens', /1e400 is out of range/);
  expectError(await post('/v1/completions', `{"prompt": "hi", "top_p": -1e400}`), 400, 'top_p', /out of range/);
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, temperature: 3.0 })), 400, 'temperature', /\[0, 2\]/);
  expectError(await post('/v1/chat/completions', JSON.stringify({ messages: msgs, temperature: -0.5 })), 400, 'temperature', /\[0, 2\]/);
  const atTwo = await post('/v1/chat/completions', JSON.stringify({ messages: msgs, temperature: 2, max_tokens: 1 }));
  assert.equal(atTwo.status, 200, atTwo.text);

  const anthropic = async (extra) => post('/v1/messages', JSON.stringify({ max_tokens: 1, messages: msgs, ...extra }));
  const anthropicError = (r, pattern) => {
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, pattern);
  };
  anthropicError(await anthropic({ temperature: 1.5 }), /temperature must be in \[0, 1\], got 1\.5/);
  anthropicError(await anthropic({ metadata: 'string' }), /metadata must be an object/);
  anthropicError(await post('/v1/messages', `{"max_tokens": 1, "messages": ${user}, "temperature": 1e400}`), /temperature.*out of range/);
  assert.equal((await anthropic({ temperature: 1 })).status, 200);
  assert.equal((await anthropic({ metadata: { user_id: 'u-1' } })).status, 200);
  await stillHealthy();
});
