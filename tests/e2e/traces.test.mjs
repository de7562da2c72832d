// Per-request traces through the official openai client: X-Request-Id taken from the client
// or generated, echoed on every answer and in the request's log line; "strata": {"trace": true}
// adds the request's times (queued, prefilling, decoding), preemptions and cached/computed prompt
// tokens under usage.strata.trace.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './lib/server.mjs';

let server, client;
before(async () => {
  // One sequence at a time, so that a second request waits in the queue for the first.
  server = await startServer(['--max-model-len', '1024', '--max-num-seqs', '1']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { assert.equal(await server.stop(), 0); });

const PROMPT = 'And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them';

async function logged(id) {
  for (let i = 0; i < 50 && !server.stderr().includes(`id=${id} `); i++) await new Promise((r) => setTimeout(r, 20));
  return server.stderr().split('\n').find((l) => l.includes(`request id=${id} `)) ?? '';
}

test('X-Request-Id: the client\'s is echoed and logged; a bad one is replaced', async () => {
  const { data, response } = await client.chat.completions.create(
    { model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }], max_tokens: 4 },
    { headers: { 'X-Request-Id': 'e2e-trace-1' } }).withResponse();
  assert.equal(response.headers.get('x-request-id'), 'e2e-trace-1');
  assert.equal(data.usage.strata, undefined, 'no trace unless asked');
  const line = await logged('e2e-trace-1');
  assert.match(line, /method=POST path=\/v1\/chat\/completions status=200 finish=(length|stop) prompt_tokens=\d+ cached_tokens=\d+ computed_tokens=\d+ generated_tokens=\d+ prepare_ms=[\d.]+ queued_ms=[\d.]+ prefill_ms=[\d.]+ queued_prefill_ms=[\d.]+ decode_ms=[\d.]+ total_ms=[\d.]+ preemptions=0/);

  const bad = await fetch(server.url + '/v1/models', { headers: { 'X-Request-Id': 'no spaces allowed' } });
  const id = bad.headers.get('x-request-id');
  assert.match(id, /^req_[0-9a-f]{24}$/);
  assert.match(await logged(id), /method=GET path=\/v1\/models status=200/);
  // Errors carry one too.
  const err = await fetch(server.url + '/v1/chat/completions', { method: 'POST', body: '{"messages": 1}' });
  assert.equal(err.status, 400);
  assert.match(err.headers.get('x-request-id'), /^req_/);
});

test('strata.trace puts times and cached tokens under usage, streamed or not', async () => {
  const req = { model: 'strata-demo', messages: [{ role: 'user', content: PROMPT + ', twice' }], max_tokens: 5, temperature: 0, strata: { trace: true } };
  await client.chat.completions.create(req);
  const again = await client.chat.completions.create(req);
  const t = again.usage.strata.trace;
  assert.match(t.request_id, /^req_/);
  assert.equal(t.prompt_tokens, again.usage.prompt_tokens);
  assert.ok(t.cached_tokens >= 16, 'the repeated prompt is a prefix hit');
  assert.equal(t.cached_tokens, again.usage.prompt_tokens_details.cached_tokens);
  assert.equal(t.computed_tokens, t.prompt_tokens - t.cached_tokens);
  assert.equal(t.generated_tokens, again.usage.completion_tokens);
  for (const k of ['prepare_ms', 'queued_ms', 'prefill_ms', 'queued_prefill_ms', 'decode_ms', 'total_ms']) assert.ok(t[k] >= 0, k);
  assert.ok(Math.abs(t.queued_ms + t.prefill_ms - t.queued_prefill_ms) < 0.01, 'queued and prefill split queued_prefill');
  assert.ok(t.total_ms >= t.queued_prefill_ms + t.decode_ms - 0.01);
  assert.equal(t.preemptions, 0);

  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let usage = null;
  for await (const c of stream) if (c.usage) usage = c.usage;
  assert.ok(usage.strata.trace.decode_ms >= 0);
  const r = await client.responses.create({ model: 'strata-demo', input: PROMPT, max_output_tokens: 3, strata: { trace: true } });
  assert.equal(r.usage.strata.trace.prompt_tokens, r.usage.input_tokens);
  const m = await fetch(server.url + '/v1/messages', { method: 'POST', body: JSON.stringify({ max_tokens: 3, messages: [{ role: 'user', content: PROMPT }], strata: { trace: true } }) });
  assert.ok((await m.json()).usage.strata.trace.total_ms >= 0);

  await assert.rejects(client.chat.completions.create({ ...req, strata: { trace: 'yes' } }),
    (e) => e.status === 400 && e.error.param === 'strata.trace' && /"yes"/.test(e.message));
  await assert.rejects(client.responses.create({ model: 'strata-demo', input: 'x', strata: [] }),
    (e) => e.status === 400 && e.error.param === 'strata');
});

test('a request waiting for the only sequence slot counts that wait as queued, not prefill', async () => {
  const first = client.chat.completions.create({ model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }],
    max_tokens: 200, temperature: 0, ignore_eos: true, strata: { trace: true } });
  await new Promise((r) => setTimeout(r, 50));  // the first one is running
  const second = await client.chat.completions.create({ model: 'strata-demo', messages: [{ role: 'user', content: PROMPT + ', again' }],
    max_tokens: 2, temperature: 0, strata: { trace: true } });
  const a = (await first).usage.strata.trace, b = second.usage.strata.trace;
  console.log(`first: queued ${a.queued_ms} prefill ${a.prefill_ms} decode ${a.decode_ms}; second: queued ${b.queued_ms} prefill ${b.prefill_ms} ms`);
  // The second waited until the first's 200 tokens were decoded.
  assert.ok(b.queued_ms > 0.5 * a.decode_ms - 50, `queued ${b.queued_ms} ms while the first decoded for ${a.decode_ms} ms`);
  assert.ok(b.prefill_ms < b.queued_ms, `prefill ${b.prefill_ms} ms, queued ${b.queued_ms} ms`);
  assert.ok(a.queued_ms < a.prefill_ms + a.decode_ms);
});
