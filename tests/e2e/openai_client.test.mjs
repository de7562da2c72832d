// The official openai client against strata-demo: chat, completions, streaming, logprobs,
// stop strings (and their usage), abort mid-stream, models.retrieve; Anthropic Messages over
// fetch; tokenize/detokenize.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, waitNoUsedBlocks } from './lib/server.mjs';

const KEY = 'e2e-secret';
const AUTH = { Authorization: `Bearer ${KEY}` };
let server;
let client;

before(async () => {
  server = await startServer(['--api-key', KEY, '--max-model-len', '2048']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: KEY, maxRetries: 0 });
});
after(async () => {
  assert.equal(await server.stop(), 0, 'clean exit on SIGTERM');
});

const PROMPT = 'And the LORD spake unto Moses, saying,';

test('models list names the served model', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['strata-demo']);
});

test('models.retrieve returns the card; a wrong id is NotFoundError', async () => {
  const card = await client.models.retrieve('strata-demo');
  assert.equal(card.id, 'strata-demo');
  assert.equal(card.object, 'model');
  assert.equal(typeof card.owned_by, 'string');
  assert.equal(card.max_model_len, 2048);
  await assert.rejects(client.models.retrieve('gpt-9'),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /gpt-9/.test(e.message));
});

test('chat completion, then the same request streamed gives the same text', async () => {
  const req = { model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }], max_tokens: 24, temperature: 0 };
  const r = await client.chat.completions.create(req);
  const msg = r.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.refusal, null);
  assert.ok(msg.content.length > 0);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 24);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);

  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    role ??= c.delta.role;
    text += c.delta.content ?? '';
    finish ??= c.finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, msg.content);
  assert.equal(finish, r.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
});

test('completions: text prompt, token-id prompt, streaming', async () => {
  const r = await client.completions.create({ model: 'strata-demo', prompt: PROMPT, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  const text = r.choices[0].text;
  assert.ok(text.length > 0);
  const tok = await (await fetch(server.url + '/tokenize', { method: 'POST', headers: AUTH, body: JSON.stringify({ prompt: PROMPT }) })).json();
  assert.equal(tok.count, tok.tokens.length);
  const byIds = await client.completions.create({ model: 'strata-demo', prompt: tok.tokens, max_tokens: 16, temperature: 0 });
  assert.equal(byIds.choices[0].text, text);
  const detok = await (await fetch(server.url + '/detokenize', { method: 'POST', headers: AUTH, body: JSON.stringify({ tokens: tok.tokens }) })).json();
  assert.equal(detok.prompt, PROMPT);
  const stream = await client.completions.create({ model: 'strata-demo', prompt: PROMPT, max_tokens: 16, temperature: 0, stream: true });
  let streamed = '';
  for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, text);
});

test('logprobs: chat format and completions format with echo', async () => {
  const r = await client.chat.completions.create({
    model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }], max_tokens: 8, temperature: 0,
    logprobs: true, top_logprobs: 3, ignore_eos: true,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 8);
  for (const e of content) {
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.logprob <= 0);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
  }
  assert.equal(content.map((e) => e.token).join(''), r.choices[0].message.content);

  const c = await client.completions.create({ model: 'strata-demo', prompt: PROMPT, max_tokens: 4, temperature: 0, logprobs: 2, echo: true, ignore_eos: true });
  const lp = c.choices[0].logprobs;
  assert.ok(c.choices[0].text.startsWith(PROMPT));
  assert.equal(lp.tokens.length, c.usage.prompt_tokens + 4);
  assert.equal(lp.token_logprobs[0], null);
  for (let i = 1; i < lp.tokens.length; ++i) assert.ok(lp.token_logprobs[i] <= 0);
  assert.equal(lp.tokens.join(''), c.choices[0].text);
  for (let i = 1; i < lp.text_offset.length; ++i) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
});

test('return_tokens_as_token_ids names logprob tokens by id, the same ids as the tokens', async () => {
  const base = { model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }], max_tokens: 6, temperature: 0,
    logprobs: true, top_logprobs: 2, ignore_eos: true };
  const plain = await client.chat.completions.create(base);
  const byId = await client.chat.completions.create({ ...base, return_tokens_as_token_ids: true });
  assert.equal(byId.choices[0].message.content, plain.choices[0].message.content);
  const ids = byId.choices[0].logprobs.content.map((e) => e.token);
  assert.equal(ids.length, 6);
  for (const t of ids) assert.match(t, /^token_id:\d+$/);
  const res = await fetch(server.url + '/detokenize', {
    method: 'POST', headers: { ...AUTH, 'Content-Type': 'application/json' },
    body: JSON.stringify({ tokens: ids.map((t) => Number(t.slice(9))) }),
  });
  assert.equal(res.status, 200);
  assert.equal((await res.json()).prompt, plain.choices[0].message.content);

  const c = await client.completions.create({ model: 'strata-demo', prompt: PROMPT, max_tokens: 4, temperature: 0, logprobs: 1,
    ignore_eos: true, return_tokens_as_token_ids: true });
  for (const t of c.choices[0].logprobs.tokens) assert.match(t, /^token_id:\d+$/);
  const bad = await fetch(server.url + '/v1/completions', {
    method: 'POST', headers: { ...AUTH, 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: PROMPT, max_tokens: 1, return_tokens_as_token_ids: 'yes' }),
  });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'return_tokens_as_token_ids');
});

test('stop strings end the text and never leak into the stream', async () => {
  const base = { model: 'strata-demo', prompt: PROMPT, max_tokens: 40, temperature: 0, ignore_eos: true };
  const full = (await client.completions.create(base)).choices[0].text;
  assert.ok(full.length > 12, full);
  const stop = full.slice(8, 12);
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...base, stop: [stop, 'zzzz-never'] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const stream = await client.completions.create({ ...base, stop, stream: true });
  let streamed = '';
  let finish = null;
  for await (const chunk of stream) {
    streamed += chunk.choices[0]?.text ?? '';
    finish ??= chunk.choices[0]?.finish_reason ?? null;
  }
  assert.equal(streamed, expected);
  assert.equal(finish, 'stop');
  assert.equal(await waitNoUsedBlocks(server.url, AUTH), 0);
});

test('with a stop string, completion_tokens counts the tokens up to the stop, every time', async () => {
  const base = { model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }], max_tokens: 40, temperature: 0, ignore_eos: true };
  const full = (await client.chat.completions.create(base)).choices[0].message.content;
  assert.ok(full.length > 30, full);
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 5);
  const expected = full.slice(0, full.indexOf(stop));

  // With logprobs: one entry per generated token; the last one completes the stop string.
  const lp = await client.chat.completions.create({ ...base, stop, logprobs: true });
  assert.equal(lp.choices[0].message.content, expected);
  assert.equal(lp.choices[0].finish_reason, 'stop');
  const tokens = lp.choices[0].logprobs.content.map((e) => e.token);
  assert.equal(lp.usage.completion_tokens, tokens.length);
  assert.ok(tokens.length < 40);
  const generated = tokens.join('');
  assert.ok(generated.startsWith(expected + stop), JSON.stringify({ generated, expected, stop }));
  assert.ok(!generated.slice(0, generated.length - tokens.at(-1).length).includes(stop), 'no token counted after the one that completed the stop');

  const counts = [];
  for (let i = 0; i < 5; ++i) {
    const r = await client.chat.completions.create({ ...base, stop });
    assert.equal(r.choices[0].message.content, expected);
    counts.push(r.usage.completion_tokens);
  }
  const together = await Promise.all(Array.from({ length: 5 }, () => client.chat.completions.create({ ...base, stop })));
  counts.push(...together.map((r) => r.usage.completion_tokens));
  const stream = await client.chat.completions.create({ ...base, stop, stream: true, stream_options: { include_usage: true } });
  let streamedText = '';
  for await (const chunk of stream) {
    if (chunk.usage) counts.push(chunk.usage.completion_tokens);
    streamedText += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(streamedText, expected);
  assert.deepEqual(counts, new Array(11).fill(tokens.length), `completion_tokens per request: ${counts}`);
});

test('abort mid-stream frees the request', async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model: 'strata-demo', messages: [{ role: 'user', content: PROMPT }], max_tokens: 1500, ignore_eos: true, stream: true },
    { signal: controller.signal });
  let n = 0;
  try {
    for await (const chunk of stream) {
      if (++n === 5) controller.abort();
    }
  } catch (e) {
    assert.equal(e.name, 'APIUserAbortError');
  }
  assert.ok(n < 100, `the stream ended at the abort (${n} chunks read)`);
  assert.equal(await waitNoUsedBlocks(server.url, AUTH), 0);
  const m = await (await fetch(server.url + '/metrics', { headers: AUTH })).text();
  assert.match(m, /strata_requests_finished_total\{[^}]*reason="cancelled"\} [1-9]/);
});

test('tools on a template without tools are refused, naming the field', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: 'strata-demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4,
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
    }),
    (e) => e.status === 400 && e.error.param === 'tools');
});

test('Anthropic Messages over fetch, plain and streaming', async () => {
  const body = { model: 'strata-demo', max_tokens: 12, system: 'Answer.', messages: [{ role: 'user', content: PROMPT }], temperature: 0 };
  const headers = { 'x-api-key': KEY, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' };
  const res = await fetch(server.url + '/v1/messages', { method: 'POST', headers, body: JSON.stringify(body) });
  assert.equal(res.status, 200);
  const msg = await res.json();
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason));
  assert.ok(msg.usage.output_tokens >= 1);

  const sres = await fetch(server.url + '/v1/messages', { method: 'POST', headers, body: JSON.stringify({ ...body, stream: true }) });
  assert.match(sres.headers.get('content-type'), /text\/event-stream/);
  const raw = await sres.text();
  const events = [...raw.matchAll(/^event: (\w+)\ndata: (.*)$/gm)].map((m) => ({ name: m[1], data: JSON.parse(m[2]) }));
  const names = events.map((e) => e.name);
  assert.equal(names[0], 'message_start');
  assert.ok(names.includes('ping'));
  assert.equal(names.at(-1), 'message_stop');
  assert.equal(names.at(-2), 'message_delta');
  for (const e of events) assert.equal(e.data.type, e.name);
  const text = events.filter((e) => e.name === 'content_block_delta').map((e) => e.data.delta.text).join('');
  assert.equal(text, msg.content[0].text);

  const bad = await fetch(server.url + '/v1/messages', { method: 'POST', headers, body: JSON.stringify({ model: 'strata-demo', messages: body.messages }) });
  assert.equal(bad.status, 400);
  const err = await bad.json();
  assert.equal(err.type, 'error');
  assert.equal(err.error.type, 'invalid_request_error');
  assert.match(err.error.message, /max_tokens/);
});
