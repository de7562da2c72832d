// strata serve --supervise: kill -9 of the engine process mid-generation. Every stream (chat,
// completions, Anthropic messages; greedy, seeded, with logprobs) and a non-streamed request in
// flight complete with exactly the output of an uninterrupted server, chunk ids unchanged;
// /health reports the restart. The supervised server keeps KV tiers (host and disk) and
// checkpoints on. On the demo model (full attention), a sliding-window model
// (gemma3-tiny) and a hybrid (qwen35-tiny, recurrent state): the tiny ones generate longer, so
// the kill still lands mid-stream.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, tinyModelWithTokenizer } from './lib/server.mjs';

let MAX_TOKENS = 256;
let PLAIN_TOKENS = 512;  // the non-streamed request
// The Anthropic stream (greedy, no ignore_eos there): a prompt whose answer runs past the kill.
let MESSAGES_PROMPT = 'Write about the sea and the ships upon it.';
const KILL_AFTER_CHUNKS = 40;  // past the first checkpoint (every 32 tokens under --supervise)

// Each request: how to run it and what it returns ({ text, ids, chunks }).
function requests(client, url, progress) {
  const chat = (i, extra) => async () => {
    const s = await client.chat.completions.create({
      model: 'strata-demo', messages: [{ role: 'user', content: `Tell me a long story about ${extra.topic}.` }],
      max_tokens: MAX_TOKENS, ignore_eos: true, stream: true, ...extra.params,
    });
    let text = '';
    const ids = new Set();
    for await (const c of s) {
      ids.add(c.id);
      text += c.choices[0]?.delta?.content ?? '';
      progress[i] += 1;
    }
    return { text, ids: [...ids] };
  };
  const completion = (i, prompt, params) => async () => {
    const s = await client.completions.create({
      model: 'strata-demo', prompt, max_tokens: MAX_TOKENS, ignore_eos: true, stream: true, ...params,
    });
    let text = '';
    const tokens = [];
    const ids = new Set();
    for await (const c of s) {
      ids.add(c.id);
      text += c.choices[0]?.text ?? '';
      tokens.push(...(c.choices[0]?.logprobs?.tokens ?? []));
      progress[i] += 1;
    }
    return { text, tokens, ids: [...ids] };
  };
  const messages = (i) => async () => {
    const res = await fetch(url + '/v1/messages', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'strata-demo', max_tokens: MAX_TOKENS, stream: true, temperature: 0,
        messages: [{ role: 'user', content: MESSAGES_PROMPT }],
      }),
    });
    assert.equal(res.status, 200);
    const decoder = new TextDecoder();
    let buf = '';
    let text = '';
    const events = [];
    const ids = new Set();
    for await (const part of res.body) {
      buf += decoder.decode(part, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, at);
        buf = buf.slice(at + 2);
        const data = block.split('\n').find((l) => l.startsWith('data: '));
        if (!data) continue;
        const ev = JSON.parse(data.slice(6));
        events.push(ev.type);
        if (ev.type === 'message_start') ids.add(ev.message.id);
        if (ev.type === 'content_block_delta') {
          text += ev.delta.text ?? '';
          progress[i] += 1;
        }
      }
    }
    return { text, ids: [...ids], events: events.filter((t) => t !== 'content_block_delta') };
  };
  const plain = async () => {
    const c = await client.completions.create({
      model: 'strata-demo', prompt: 'The history of the world, in brief:', max_tokens: PLAIN_TOKENS, ignore_eos: true,
      temperature: 0,
    });
    return { text: c.choices[0].text, finish: c.choices[0].finish_reason, tokens: c.usage.completion_tokens, ids: [c.id] };
  };
  return [
    chat(0, { topic: 'a lighthouse', params: { temperature: 0 } }),
    chat(1, { topic: 'a dragon', params: { temperature: 0.9, top_p: 0.95, seed: 1234 } }),
    completion(2, 'In the beginning God created', { temperature: 0 }),
    completion(3, 'def fibonacci(n):', { temperature: 0, logprobs: 0 }),
    messages(4),
    plain,
  ];
}
const N_STREAMS = 5;

async function runAll(url, progress = new Array(N_STREAMS).fill(0)) {
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  return Promise.all(requests(client, url, progress).map((f) => f()));
}

async function health(url) {
  const res = await fetch(url + '/health');
  return { status: res.status, body: await res.json() };
}

async function waitFor(cond, timeoutMs, what) {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeoutMs) throw new Error('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const MODELS = [
  { label: 'the demo model', maxTokens: 256, plainTokens: 512 },
  { label: 'gemma3-tiny (sliding window)', model: 'gemma3-tiny', maxTokens: 3000, plainTokens: 3500 },
  { label: 'qwen35-tiny (hybrid)', model: 'qwen35-tiny', maxTokens: 3000, plainTokens: 3500, messagesPrompt: 'Write about the mountains.' },
];

for (const spec of MODELS) {
test(`kill -9 of the engine process mid-generation, ${spec.label}: every request completes with the uninterrupted output`, { timeout: 180000 }, async () => {
  MAX_TOKENS = spec.maxTokens;
  PLAIN_TOKENS = spec.plainTokens;
  MESSAGES_PROMPT = spec.messagesPrompt ?? 'Write about the sea and the ships upon it.';
  const model = spec.model ? ['--model', tinyModelWithTokenizer(spec.model), '--served-model-name', 'strata-demo'] : [];
  // The uninterrupted run: a plain server, the same requests at once.
  const plainServer = await startServer(['--max-num-seqs', '8', ...model]);
  let expected;
  try {
    expected = await runAll(plainServer.url);
  } finally {
    await plainServer.stop();
  }
  for (const e of expected.slice(0, N_STREAMS)) assert.ok(e.text.length > 0);
  assert.equal(expected[3].tokens.length, MAX_TOKENS);

  const dir = mkdtempSync(path.join(tmpdir(), 'strata-supervise-'));
  const server = await startServer(['--supervise', '--max-num-seqs', '8', '--kv-disk-dir', dir, '--kv-host-bytes', String(64 << 20), ...model]);
  try {
    const before = await health(server.url);
    assert.equal(before.status, 200);
    assert.equal(before.body.supervisor.restarts, 0);
    const pid = before.body.supervisor.engine_pid;
    assert.ok(Number.isInteger(pid) && pid !== server.proc.pid, JSON.stringify(before.body));

    const progress = new Array(N_STREAMS).fill(0);
    const running = runAll(server.url, progress);
    running.catch(() => {});
    await waitFor(() => progress.every((n) => n >= KILL_AFTER_CHUNKS), 60000, 'every stream to deliver some tokens');
    process.kill(pid, 'SIGKILL');
    const atKill = [...progress];

    // While it is down /health says so; it comes back with one restart.
    await waitFor(async () => (await health(server.url)).body.supervisor.restarts === 1, 60000, 'the restart');
    const got = await running;
    const after = await health(server.url);
    assert.equal(after.status, 200);
    assert.equal(after.body.status, 'ok');
    assert.notEqual(after.body.supervisor.engine_pid, pid);
    assert.match(after.body.supervisor.last_exit, /signal 9/);
    assert.ok(after.body.supervisor.last_restart > 0);

    for (let i = 0; i < N_STREAMS; ++i) {
      assert.ok(progress[i] > atKill[i], `stream ${i} was still generating when the engine died`);
      assert.equal(got[i].text, expected[i].text, `stream ${i}: text`);
      assert.equal(got[i].ids.length, 1, `stream ${i}: one response id across the restart`);
    }
    assert.deepEqual(got[3].tokens, expected[3].tokens, 'logprobs stream: tokens');
    assert.deepEqual(got[4].events, expected[4].events, 'messages stream: event sequence');
    for (const k of ['text', 'finish', 'tokens']) assert.deepEqual(got[5][k], expected[5][k], `non-streamed request: ${k}`);
    // Every request but the one with logprobs (never checkpointed) resumed from its checkpoint
    // (written after 32 tokens) rather than starting over.
    for (const i of [0, 1, 2, 4, 5]) {
      const id = got[i].ids[0];
      assert.match(server.stderr(), new RegExp(`request ${id} resumes from its checkpoint after \\d+ generated tokens`),
                   `request ${i} (${id}) did not resume from a checkpoint`);
    }

    const m = await (await fetch(server.url + '/metrics')).text();
    assert.match(m, /^strata_supervisor_restarts_total 1$/m);
    assert.match(m, /^strata_supervisor_engine_up 1$/m);
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  assert.equal(server.proc.exitCode, 0);
});
}

test('/health answers 503 with the reason while the engine process is down', { timeout: 120000 }, async () => {
  const server = await startServer(['--supervise']);
  try {
    const pid = (await health(server.url)).body.supervisor.engine_pid;
    process.kill(pid, 'SIGKILL');
    // Loading the model takes the restarted engine process a while: /health says it is down.
    let sawDown = null;
    await waitFor(async () => {
      const h = await health(server.url);
      if (h.status === 503) sawDown = h.body;
      return h.body.supervisor.restarts === 1 && h.status === 200;
    }, 60000, 'the restart');
    assert.ok(sawDown, '/health never answered 503 while the engine process was down');
    assert.equal(sawDown.status, 'error');
    assert.match(sawDown.message, /restarting \(killed by signal 9/);
    assert.equal(sawDown.supervisor.engine_up, false);
    assert.equal(sawDown.supervisor.engine_pid, null);
    const c = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
    const r = await c.completions.create({ model: 'strata-demo', prompt: 'Hello', max_tokens: 4, temperature: 0 });
    assert.equal(r.usage.completion_tokens, 4);
  } finally {
    await server.stop();
  }
  assert.equal(server.proc.exitCode, 0);
});
