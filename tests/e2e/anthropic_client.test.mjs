// The official @anthropic-ai/sdk client against strata-demo: messages plain and streamed,
// count_tokens, stop sequences (stop_reason and the matched stop_sequence).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, waitNoUsedBlocks } from './lib/server.mjs';

const KEY = 'e2e-anthropic';
let server;
let client;

before(async () => {
  server = await startServer(['--api-key', KEY, '--max-model-len', '2048']);
  client = new Anthropic({ baseURL: server.url, apiKey: KEY, maxRetries: 0 });
});
after(async () => {
  assert.equal(await server.stop(), 0, 'clean exit on SIGTERM');
});

const PROMPT = 'And the LORD spake unto Moses, saying,';
const base = { model: 'strata-demo', max_tokens: 40, temperature: 0, messages: [{ role: 'user', content: PROMPT }] };

// A streamed message: the text as streamed and the SDK's final message.
async function streamed(params) {
  const stream = client.messages.stream(params);
  let text = '';
  stream.on('text', (t) => { text += t; });
  const final = await stream.finalMessage();
  return { text, final };
}

test('messages.create, then the same request streamed gives the same message', async () => {
  const r = await client.messages.create(base);
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.model, 'strata-demo');
  assert.match(r.id, /^msg_/);
  assert.equal(r.content.length, 1);
  assert.equal(r.content[0].type, 'text');
  assert.ok(r.content[0].text.length > 0);
  assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason), r.stop_reason);
  assert.equal(r.stop_sequence, null);
  assert.ok(r.usage.input_tokens > 0);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 40);

  const { text, final } = await streamed(base);
  assert.equal(text, r.content[0].text);
  assert.equal(final.content[0].text, r.content[0].text);
  assert.equal(final.stop_reason, r.stop_reason);
  assert.equal(final.usage.output_tokens, r.usage.output_tokens);
  assert.notEqual(final.id, r.id);
  assert.equal(await waitNoUsedBlocks(server.url, { 'x-api-key': KEY }), 0);
});

test('messages.countTokens: stable, and larger for a longer conversation', async () => {
  const short = await client.messages.countTokens({ model: 'strata-demo', messages: base.messages });
  assert.ok(short.input_tokens > 0, JSON.stringify(short));
  const again = await client.messages.countTokens({ model: 'strata-demo', messages: base.messages });
  assert.equal(again.input_tokens, short.input_tokens);
  const longer = await client.messages.countTokens({
    model: 'strata-demo',
    messages: [...base.messages, { role: 'assistant', content: 'Speak unto the children of Israel.' }, { role: 'user', content: 'And then?' }],
  });
  assert.ok(longer.input_tokens > short.input_tokens, `${longer.input_tokens} <= ${short.input_tokens}`);
  const withSystem = await client.messages.countTokens({ model: 'strata-demo', system: 'You are a scribe.', messages: base.messages });
  assert.ok(withSystem.input_tokens > short.input_tokens);
  // The count is the prompt a generation reads (cached or not).
  const r = await client.messages.create({ ...base, max_tokens: 1 });
  const u = r.usage;
  assert.equal(u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0), short.input_tokens);
});

test('stop sequences: stop_reason stop_sequence names the matched string, plain and streamed', async () => {
  const full = (await client.messages.create(base)).content[0].text;
  assert.ok(full.length > 30, JSON.stringify(full));
  const at = Math.floor(full.length / 2);
  const stop = full.slice(at, at + 5);
  const expected = full.slice(0, full.indexOf(stop));
  const params = { ...base, stop_sequences: ['zzzz-never', stop] };

  const r = await client.messages.create(params);
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, stop);
  assert.equal(r.content[0].text, expected);
  assert.ok(r.usage.output_tokens < 40);

  const { text, final } = await streamed(params);
  assert.equal(text, expected, 'the stop string never reaches the stream');
  assert.equal(final.stop_reason, 'stop_sequence');
  assert.equal(final.stop_sequence, stop);
  assert.equal(final.content[0].text, expected);
  assert.equal(final.usage.output_tokens, r.usage.output_tokens);
});

test('errors come back as the SDK\'s error classes', async () => {
  await assert.rejects(client.messages.create({ ...base, temperature: 1.5 }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && /temperature/.test(e.message));
  const wrongKey = new Anthropic({ baseURL: server.url, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create(base), (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
});
