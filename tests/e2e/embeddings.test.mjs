// /v1/embeddings through the official openai client (embeddings.create, which asks for base64
// by default and decodes it, and encoding_format "float") against the sentence-transformers
// goldens of tests/data/embedding/qwen3-embed-tiny; `dimensions`, the instruction prompt, token
// input, bad input naming its field, generation refused on an embedding model and embeddings
// refused on a generation model; `strata embed` prints the same vectors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { startServer, SOURCE, BINARY } from './lib/server.mjs';

const DIR = SOURCE + '/tests/data/embedding/qwen3-embed-tiny';
const G = JSON.parse(readFileSync(DIR + '/embedding_goldens.json', 'utf8'));
let emb, demo, client;

before(async () => {
  emb = await startServer(['--model', DIR, '--max-batch-tokens', '32']);
  client = new OpenAI({ baseURL: emb.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  demo = await startServer([]);
});
after(async () => {
  assert.equal(await emb.stop(), 0);
  assert.equal(await demo.stop(), 0);
});

function maxNormGap(got, ref) {
  assert.equal(got.length, ref.length);
  let gap = 0, scale = 0;
  for (let i = 0; i < ref.length; ++i) {
    gap = Math.max(gap, Math.abs(got[i] - ref[i]));
    scale = Math.max(scale, Math.abs(ref[i]));
  }
  return gap / scale;
}

const plain = G.cases.filter((c) => c.prompt_name === null);
const query = G.cases.filter((c) => c.prompt_name === 'query');

test('embeddings.create (base64, the client default) matches sentence-transformers', async () => {
  const r = await client.embeddings.create({ model: 'qwen3-embed-tiny', input: plain.map((c) => c.text) });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, plain.length);
  let worst = 0;
  r.data.forEach((d, i) => {
    assert.equal(d.index, i);
    assert.equal(d.object, 'embedding');
    worst = Math.max(worst, maxNormGap(d.embedding, plain[i].embedding));
  });
  assert.ok(worst <= 1e-4, `max-norm gap ${worst}`);
  const tokens = plain.reduce((n, c) => n + c.input_ids.length, 0);
  assert.equal(r.usage.prompt_tokens, tokens);
  assert.equal(r.usage.total_tokens, tokens);
});

test('encoding_format float, the query prompt by prompt_name and dimensions', async () => {
  const r = await client.embeddings.create({ model: 'qwen3-embed-tiny', input: query.map((c) => c.text),
    encoding_format: 'float', prompt_name: 'query' });
  r.data.forEach((d, i) => assert.ok(maxNormGap(d.embedding, query[i].embedding) <= 1e-4, `query case ${i}`));
  // The literal prompt text is the same request.
  const lit = await client.embeddings.create({ model: 'qwen3-embed-tiny', input: query[0].text,
    encoding_format: 'float', prompt: G.query_prompt });
  assert.deepEqual(lit.data[0].embedding, r.data[0].embedding);
  for (const c of G.dimensions_cases) {
    const t = await client.embeddings.create({ model: 'qwen3-embed-tiny', input: c.text, dimensions: c.dimensions });
    assert.equal(t.data[0].embedding.length, c.dimensions);
    assert.ok(maxNormGap(t.data[0].embedding, c.embedding) <= 1e-4, 'dimensions case');
  }
});

test('token id input embeds as its text does', async () => {
  const r = await client.embeddings.create({ model: 'qwen3-embed-tiny', input: [plain[0].input_ids, plain[1].input_ids],
    encoding_format: 'float' });
  assert.ok(maxNormGap(r.data[0].embedding, plain[0].embedding) <= 1e-4);
  assert.ok(maxNormGap(r.data[1].embedding, plain[1].embedding) <= 1e-4);
});

test('bad input is a 400 naming the field; generation is refused', async () => {
  const bad = [
    [{ model: 'qwen3-embed-tiny', input: '' }, 'input'],
    [{ model: 'qwen3-embed-tiny', input: ['a', 7] }, 'input[1]'],
    [{ model: 'qwen3-embed-tiny', input: 'a', dimensions: 65 }, 'dimensions'],
    [{ model: 'qwen3-embed-tiny', input: 'a', encoding_format: 'int8' }, 'encoding_format'],
    [{ model: 'qwen3-embed-tiny', input: 'a', prompt_name: 'passage' }, 'prompt_name'],
  ];
  for (const [body, param] of bad) {
    await assert.rejects(client.embeddings.create(body), (e) => {
      assert.equal(e.status, 400, JSON.stringify(body));
      assert.equal(e.param, param, e.message);
      return true;
    });
  }
  await assert.rejects(client.embeddings.create({ model: 'other', input: 'a' }), (e) => e.status === 404);
  await assert.rejects(client.completions.create({ model: 'qwen3-embed-tiny', prompt: 'a', max_tokens: 2 }),
    (e) => { assert.equal(e.status, 400); assert.match(e.message, /embeddings/); return true; });
  const gen = new OpenAI({ baseURL: demo.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  await assert.rejects(gen.embeddings.create({ model: 'strata-demo', input: 'a' }),
    (e) => { assert.equal(e.status, 400); assert.match(e.message, /--task embed/); return true; });
  // The server is still up and answers.
  const ok = await client.embeddings.create({ model: 'qwen3-embed-tiny', input: 'a', encoding_format: 'float' });
  assert.equal(ok.data.length, 1);
});

test('strata embed prints the same vectors', () => {
  const out = execFileSync(BINARY, ['embed', '--model', DIR, '--prompt-name', 'query', '--threads', '2',
    query[0].text, query[1].text], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = out.trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(lines.length, 2);
  assert.ok(maxNormGap(lines[0], query[0].embedding) <= 1e-4);
  assert.ok(maxNormGap(lines[1], query[1].embedding) <= 1e-4);
});
