// Concurrency and prefix caching through the HTTP API, and tools on a model whose template
// renders them (random weights, the real Qwen3 tokenizer).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, waitNoUsedBlocks, metrics, qwen3SynthModel } from './lib/server.mjs';

let server;
let client;
before(async () => {
  server = await startServer(['--max-num-seqs', '32', '--max-model-len', '2048']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server.stop(); });

const PROMPTS = [
  'And the LORD spake unto Moses, saying,', 'In the beginning God created', 'Blessed are the meek:',
  'def fibonacci(n):', 'The quick brown fox', 'A fool and his money', 'for i in range(10):',
  'Love is patient,', 'import os\nimport sys\n', 'He that hath ears to hear,', 'class Stack:',
  'Do not put off till tomorrow', 'And it came to pass', 'The tuple type', 'Honour thy father',
  'You will meet a tall', 'Python is an', 'The wages of sin', 'Q: Why did the', 'Exceptions are',
];

test('32 concurrent streams produce exactly the tokens of each request alone (greedy)', async () => {
  const reqs = Array.from({ length: 32 }, (_, i) => ({
    model: 'strata-demo', prompt: PROMPTS[i % PROMPTS.length] + ' '.repeat(Math.floor(i / PROMPTS.length)),
    max_tokens: 24 + (i % 5) * 4, temperature: 0, logprobs: 0,
  }));
  const alone = [];
  for (const r of reqs) {
    const c = await client.completions.create(r);
    alone.push(c.choices[0].logprobs.tokens);
  }
  const together = await Promise.all(reqs.map(async (r) => {
    const stream = await client.completions.create({ ...r, stream: true });
    const tokens = [];
    for await (const chunk of stream) tokens.push(...(chunk.choices[0]?.logprobs?.tokens ?? []));
    return tokens;
  }));
  for (let i = 0; i < reqs.length; ++i) assert.deepEqual(together[i], alone[i], `request ${i}`);
  assert.equal(await waitNoUsedBlocks(server.url), 0);
});

test('a second request sharing a 1,000-token prefix is served from the cache', async () => {
  const prefix = Array.from({ length: 1000 }, (_, i) => 100 + ((i * 7919) % 3900));
  const first = await client.completions.create({ model: 'strata-demo', prompt: [...prefix, 11, 12], max_tokens: 2, temperature: 0 });
  assert.ok(first.usage.prompt_tokens_details.cached_tokens < 992);
  const second = await client.completions.create({ model: 'strata-demo', prompt: [...prefix, 13, 14, 15], max_tokens: 2, temperature: 0 });
  assert.equal(second.usage.prompt_tokens, 1003);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens >= 992, JSON.stringify(second.usage));
  const m = await metrics(server.url);
  assert.ok(m.value('strata_cached_prompt_tokens_total') >= 992);
  assert.equal(m.usedBlocks, 0);
});

test('tools reach a template that renders them; the model answers', async () => {
  const dir = qwen3SynthModel();
  const q = await startServer(['--model', dir, '--served-model-name', 'qwen3-synth', '--max-model-len', '4096']);
  try {
    const c = new OpenAI({ baseURL: q.url + '/v1', apiKey: 'x', maxRetries: 0 });
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const messages = [{ role: 'user', content: 'Weather in Paris?' }];
    const plain = await c.chat.completions.create({ model: 'qwen3-synth', messages, max_tokens: 4, temperature: 0 });
    const withTools = await c.chat.completions.create({ model: 'qwen3-synth', messages, tools, tool_choice: 'auto', max_tokens: 4, temperature: 0 });
    assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 30, 'the tool schema is in the prompt');
    assert.ok(['stop', 'length', 'tool_calls'].includes(withTools.choices[0].finish_reason));
    const tok = await (await fetch(q.url + '/tokenize', { method: 'POST', body: JSON.stringify({ messages, tools }) })).json();
    assert.equal(tok.count, withTools.usage.prompt_tokens);
    // Previous tool calls and results go back through the template.
    const followUp = await c.chat.completions.create({
      model: 'qwen3-synth', max_tokens: 2, tools,
      messages: [...messages,
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '18 C' }],
    });
    assert.equal(followUp.choices.length, 1);
    // A forced call has its own output format: a response_format beside it is refused.
    await assert.rejects(c.chat.completions.create({ model: 'qwen3-synth', messages, tools, tool_choice: 'required', max_tokens: 2,
      response_format: { type: 'json_object' } }), (e) => e.status === 400 && e.error.param === 'response_format');
    assert.equal(await waitNoUsedBlocks(q.url), 0);
  } finally {
    await q.stop();
  }
});

test('a full queue answers 429 with Retry-After; the rest are served', async () => {
  const s = await startServer(['--max-num-seqs', '1', '--max-queued', '1']);
  try {
    const body = JSON.stringify({ prompt: 'In the beginning', max_tokens: 200, ignore_eos: true });
    const results = await Promise.all(Array.from({ length: 6 }, () =>
      fetch(s.url + '/v1/completions', { method: 'POST', body }).then(async (r) => ({ status: r.status, retry: r.headers.get('retry-after'), json: await r.json() }))));
    const rejected = results.filter((r) => r.status === 429);
    assert.ok(rejected.length >= 1, JSON.stringify(results.map((r) => r.status)));
    for (const r of rejected) {
      assert.equal(r.retry, '1');
      assert.equal(r.json.error.type, 'rate_limit_error');
    }
    for (const r of results.filter((x) => x.status !== 429)) {
      assert.equal(r.status, 200);
      assert.equal(r.json.usage.completion_tokens, 200);
    }
    assert.equal(await waitNoUsedBlocks(s.url), 0);
  } finally {
    await s.stop();
  }
});
