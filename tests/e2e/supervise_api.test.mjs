// The newer endpoints through strata serve --supervise: the page at / is public there too,
// /status and /v1/responses (streamed and not, continued by previous_response_id) reach the
// engine process, X-Request-Id comes back, and n > 1 answers whole (streamed: 400).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './lib/server.mjs';

const KEY = 'sup-key';
let server, client;
before(async () => {
  server = await startServer(['--supervise', '--api-key', KEY]);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: KEY, maxRetries: 0 });
});
after(async () => { assert.equal(await server.stop(), 0); });

test('page, status and the Responses API behind the supervisor', { timeout: 120000 }, async () => {
  const page = await fetch(server.url + '/');
  assert.equal(page.status, 200);
  assert.match(await page.text(), /<title>strata<\/title>/);
  assert.equal((await fetch(server.url + '/status')).status, 401);
  const st = await fetch(server.url + '/status', { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(st.status, 200);
  assert.equal((await st.json()).model, 'strata-demo');

  const input = 'And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, ' +
    'When any man of you bring an offering unto the LORD';
  const { data: first, response } = await client.responses.create({ model: 'strata-demo', input, max_output_tokens: 6, temperature: 0 },
    { headers: { 'X-Request-Id': 'sup-1' } }).withResponse();
  assert.equal(response.headers.get('x-request-id'), 'sup-1');
  assert.match(first.id, /^resp_/);
  const stream = client.responses.stream({ model: 'strata-demo', previous_response_id: first.id, input: 'Amen.', max_output_tokens: 6, temperature: 0 });
  let last = null;
  let text = '';
  for await (const ev of stream) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') last = ev.response;
  }
  assert.ok(last, 'the stream ended with its closing event');
  assert.equal(last.output[0].content[0].text, text);
  assert.ok(last.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(last.usage));
});

test('n > 1 behind the supervisor: choices answer whole, a streamed n > 1 is refused naming n', { timeout: 120000 }, async () => {
  const req = { model: 'strata-demo', messages: [{ role: 'user', content: 'And the LORD spake unto Moses, saying,' }],
    max_tokens: 6, temperature: 1, seed: 21, n: 3 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
  await assert.rejects(client.chat.completions.create({ ...req, stream: true }),
    (e) => e.status === 400 && e.error.param === 'n' && /--supervise/.test(e.message));
});
