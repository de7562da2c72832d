// n > 1 and best_of through the official openai client: every choice present and complete,
// streamed chunks tagged by choice index, choice i seeded with seed + i, best_of ranking by
// cumulative logprob, constrained choices, one prefill shared by the choices (the metrics), an
// aborted stream freeing every choice, and the 400s naming n and best_of.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, metrics, waitNoUsedBlocks } from './lib/server.mjs';

let server, client;
before(async () => {
  server = await startServer(['--max-model-len', '4096']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { assert.equal(await server.stop(), 0); });

const MODEL = 'strata-demo';
const PROMPT = 'And the LORD spake unto Moses, saying,';
const chat = (extra) => ({ model: MODEL, messages: [{ role: 'user', content: PROMPT }], max_tokens: 8, ...extra });
const texts = (r) => r.choices.map((c) => c.message.content);

test('n=3 chat: choices 0..2, each complete, usage counts the prompt once', async () => {
  const one = await client.chat.completions.create(chat({ temperature: 0 }));
  const r = await client.chat.completions.create(chat({ n: 3, temperature: 1, seed: 11, ignore_eos: true, logprobs: true }));
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'length');
    assert.equal(c.logprobs.content.length, 8, 'each choice has its own logprobs');
    assert.ok(c.message.content.length > 0);
  }
  assert.ok(new Set(texts(r)).size > 1, `sampled choices differ: ${JSON.stringify(texts(r))}`);
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 24);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 24);

  // Greedy choices are all the same answer.
  const g = await client.chat.completions.create(chat({ n: 2, temperature: 0 }));
  assert.equal(g.choices.length, 2);
  assert.equal(g.choices[0].message.content, g.choices[1].message.content);
  assert.equal(g.choices[0].message.content, one.choices[0].message.content);
});

test('with a seed, choice i is the n=1 answer with seed + i, and repeats exactly', async () => {
  const req = chat({ n: 3, temperature: 1, seed: 1234, max_tokens: 12 });
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.deepEqual(texts(a), texts(b));
  for (let i = 0; i < 3; i++) {
    const single = await client.chat.completions.create({ ...req, n: 1, seed: 1234 + i });
    assert.equal(single.choices[0].message.content, a.choices[i].message.content, `choice ${i}`);
  }
});

test('n=3 streamed: chunks tagged by index, each choice ends once, same text as the body', async () => {
  const req = chat({ n: 3, temperature: 1, seed: 77, max_tokens: 10 });
  const body = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const content = ['', '', ''], finish = [null, null, null], roles = [0, 0, 0];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      assert.ok(c.index >= 0 && c.index < 3, `index ${c.index}`);
      if (c.delta.role) roles[c.index]++;
      content[c.index] += c.delta.content ?? '';
      if (c.finish_reason) {
        assert.equal(finish[c.index], null, 'one finish per choice');
        finish[c.index] = c.finish_reason;
      }
    }
  }
  assert.deepEqual(roles, [1, 1, 1]);
  assert.ok(finish.every((f) => f === 'stop' || f === 'length'), JSON.stringify(finish));
  assert.deepEqual(content, texts(body));
  assert.equal(usage.completion_tokens, body.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, body.usage.prompt_tokens);

  // The client's stream helper assembles every choice.
  const helper = client.chat.completions.stream(req);
  const done = await helper.finalChatCompletion();
  assert.deepEqual(texts(done), texts(body));
});

test('completions: best_of=3, n=2 returns the two candidates of highest cumulative logprob', async () => {
  const base = { model: MODEL, prompt: PROMPT, max_tokens: 10, temperature: 1, seed: 5, logprobs: 0 };
  const all = await client.completions.create({ ...base, n: 3 });
  const sum = (c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
  const ranked = [...all.choices].sort((x, y) => sum(y) - sum(x) || x.index - y.index);
  const best = await client.completions.create({ ...base, n: 2, best_of: 3 });
  assert.deepEqual(best.choices.map((c) => c.index), [0, 1]);
  assert.deepEqual(best.choices.map((c) => c.text), ranked.slice(0, 2).map((c) => c.text));
  assert.ok(sum(best.choices[0]) >= sum(best.choices[1]));
  // Every candidate was generated: usage counts them all.
  assert.equal(best.usage.completion_tokens, all.usage.completion_tokens);
  // Without logprobs asked, none are shown, and the ranking is the same.
  const quiet = await client.completions.create({ ...base, logprobs: undefined, n: 2, best_of: 3 });
  assert.equal(quiet.choices[0].logprobs, null);
  assert.deepEqual(quiet.choices.map((c) => c.text), best.choices.map((c) => c.text));

  const s = await client.completions.create({ ...base, logprobs: undefined, n: 2, stream: true });
  const got = ['', ''];
  for await (const chunk of s) for (const c of chunk.choices) got[c.index] += c.text;
  assert.deepEqual(got, all.choices.slice(0, 2).map((c) => c.text));
});

test('n>1 with response_format: every choice follows the schema', async () => {
  const schema = { type: 'object', properties: { tribe: { enum: ['Judah', 'Levi', 'Dan'] } }, required: ['tribe'], additionalProperties: false };
  const r = await client.chat.completions.create(chat({
    n: 4, temperature: 1, seed: 3, max_tokens: 32,
    response_format: { type: 'json_schema', json_schema: { name: 'tribe', schema, strict: true } } }));
  assert.equal(r.choices.length, 4);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'stop');
    assert.ok(['Judah', 'Levi', 'Dan'].includes(JSON.parse(c.message.content).tribe), c.message.content);
  }
});

test('n=4 computes the prompt once: the other choices are prefix-cache hits', async () => {
  const verse = 'And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, ';
  const prompt = `Nonce ${Date.now()}. ` + verse.repeat(16);
  const m0 = await metrics(server.url);
  const r = await client.completions.create({ model: MODEL, prompt, n: 4, max_tokens: 4, temperature: 1, seed: 9 });
  const m1 = await metrics(server.url);
  const P = r.usage.prompt_tokens;
  assert.ok(P > 300, `a long prompt: ${P} tokens`);
  const prompt_d = m1.value('strata_prompt_tokens_total') - m0.value('strata_prompt_tokens_total');
  const cached_d = m1.value('strata_cached_prompt_tokens_total') - m0.value('strata_cached_prompt_tokens_total');
  const computed = prompt_d - cached_d;
  console.log(`n=4, prompt ${P} tokens: prompt tokens counted ${prompt_d}, cached ${cached_d}, computed ${computed}`);
  assert.equal(prompt_d, 4 * P, 'each choice is one engine request over the prompt');
  // Each later choice recomputes at most the prompt's last, partial block (16 tokens).
  assert.ok(computed <= P + 3 * 16, `computed ${computed} tokens for a ${P}-token prompt`);
  assert.ok(cached_d >= 3 * (P - 16), `cached ${cached_d} tokens`);
  assert.equal(r.choices.length, 4);
});

test('bad n and best_of answer 400 naming the field', async () => {
  const bad = async (fn, param, re) => assert.rejects(fn(), (e) => e.status === 400 && e.error.param === param && (!re || re.test(e.message)));
  for (const n of [0, -1, '2', 129]) {
    await bad(() => client.chat.completions.create(chat({ n })), 'n', new RegExp(String(n)));
    await bad(() => client.completions.create({ model: MODEL, prompt: PROMPT, n }), 'n');
  }
  await bad(() => client.completions.create({ model: MODEL, prompt: PROMPT, n: 3, best_of: 2 }), 'best_of', /at least n/);
  await bad(() => client.completions.create({ model: MODEL, prompt: PROMPT, best_of: 2, stream: true }), 'best_of', /stream/);
  await bad(() => client.completions.create({ model: MODEL, prompt: PROMPT, best_of: 0 }), 'best_of');
  await bad(() => client.chat.completions.create(chat({ n: 128, max_tokens: 4000 })), 'n', /128.*4000/);
});

test('aborting an n=3 stream cancels every choice', async () => {
  const stream = await client.chat.completions.create(chat({ n: 3, max_tokens: 2000, ignore_eos: true, stream: true }));
  let chunks = 0;
  for await (const chunk of stream) {
    if (++chunks === 12) break;  // leaving the loop aborts the request
  }
  assert.equal(await waitNoUsedBlocks(server.url), 0, 'no KV block left referenced');
  const m = await metrics(server.url);
  assert.equal(m.value('strata_num_requests_running'), 0);
});
