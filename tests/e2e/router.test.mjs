// strata router over strata-demo replicas on loopback, all started here: prefix-aware routing
// against round-robin on conversations (Redis tier off: only a replica's own pool can hit), and
// kill -9 of the replica serving most of 8 streams (checkpoints every 8 tokens in Redis): every
// stream completes through another replica with exactly the uninterrupted text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { startServer, metrics, BINARY, DEMO } from './lib/server.mjs';
import { HAVE_REDIS, startRedis } from './lib/redis.mjs';

async function startRouter(replicas, extra = []) {
  const args = ['router', '--port', '0', '--health-interval', '0.2', ...replicas.flatMap((r) => ['--replica', r.url]), ...extra];
  const proc = spawn(BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d.toString(); });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) resolve(m[1]);
    });
    proc.on('exit', (code) => reject(new Error(`router exited with ${code}:\n${stderr}`)));
  });
  return { url, proc, stderr: () => stderr, stop: () => { proc.kill('SIGTERM'); } };
}

// A streamed chat completion: text, ms to the first token, cached prompt tokens.
async function chat(url, body) {
  const t0 = performance.now();
  const res = await fetch(url + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'strata-demo', temperature: 0, stream: true, stream_options: { include_usage: true }, ...body }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  const decoder = new TextDecoder();
  let buf = '', text = '', ttft = null, usage = null;
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const d = JSON.parse(event.slice(6));
      assert.equal(d.error, undefined, JSON.stringify(d.error));
      const piece = d.choices?.[0]?.delta?.content ?? '';
      if (piece && ttft === null) ttft = performance.now() - t0;
      text += piece;
      if (d.usage) usage = d.usage;
    }
  }
  return { text, ttft, usage, cached: usage?.prompt_tokens_details?.cached_tokens ?? 0, prompt: usage?.prompt_tokens ?? 0 };
}

const SYSTEMS = [
  'You are a careful scribe of the old books. Answer in the manner of the King James Bible, with verse and chapter, and keep every answer short and plain.',
  'You are a maintainer of the Python manual. Answer each question with the name of the module, the function and one line of example code, nothing more.',
  'You are a teller of fortunes from the old fortune files. Answer each question with one fortune, a proverb or a short joke, and never explain it.',
  'You are a ship captain writing the log of a long voyage. Answer each question as an entry in the log with the day, the weather and the course.',
];
const QUESTIONS = ['Who led the children of Israel?', 'What is a list comprehension?', 'What will tomorrow bring?',
  'Where are we sailing?', 'Tell me more.', 'Why is that so?', 'And after that?', 'Say it again in other words.',
  'What did the others say?', 'How does it end?'];

// 20 conversations of 10 turns (200 requests), each turn of all conversations sent together;
// route(c) gives the base URL for conversation c's request at turn t. Returns hit figures.
async function conversations(route, seed) {
  const convs = Array.from({ length: 20 }, (_, c) => [
    { role: 'system', content: SYSTEMS[c % SYSTEMS.length] },
  ]);
  let hitTokens = 0, idealTokens = 0, ttft = 0, n = 0;
  const last = Array(20).fill(0);
  for (let t = 0; t < 10; t++) {
    const results = await Promise.all(convs.map(async (m, c) => {
      m.push({ role: 'user', content: `(${seed}.${c}) ${QUESTIONS[(t + c) % QUESTIONS.length]}` });
      return chat(route(c, t), { messages: m, max_tokens: 8 });
    }));
    results.forEach((r, c) => {
      convs[c].push({ role: 'assistant', content: r.text });
      ttft += r.ttft ?? 0;
      n += 1;
      // Ideal: the previous turn's prompt, in full blocks, is cached.
      if (t > 0) {
        const ideal = Math.floor((last[c] - 1) / 16) * 16;
        idealTokens += ideal;
        hitTokens += Math.min(r.cached, ideal);
      }
      last[c] = r.prompt;
    });
  }
  return { hitRate: hitTokens / idealTokens, meanTtft: ttft / n };
}

test('prefix-aware routing keeps conversations on the replica holding their prefix', { timeout: 240000 }, async () => {
  const replicas = await Promise.all([0, 1, 2].map(() => startServer(['--model', DEMO])));
  const router = await startRouter(replicas, ['--load-slack', '8']);
  try {
    const routed = await conversations(() => router.url, 1);
    let i = 0;
    const rr = await conversations(() => replicas[i++ % 3].url, 2);
    console.log(`# 200 requests, 20 conversations x 10 turns: router prefix hit rate ${routed.hitRate.toFixed(3)} of ideal, ` +
                `mean TTFT ${routed.meanTtft.toFixed(1)} ms; round-robin ${rr.hitRate.toFixed(3)}, ${rr.meanTtft.toFixed(1)} ms`);
    assert.ok(routed.hitRate >= 0.9, `router hit rate ${routed.hitRate} < 0.9 of ideal`);
    assert.ok(rr.hitRate < routed.hitRate, 'round-robin hits less');
    const m = await (await fetch(router.url + '/metrics')).text();
    assert.match(m, /strata_router_requests_total\{route="prefix"\} [1-9]/);
    // Every replica got a share.
    for (const r of replicas) {
      const served = (await metrics(r.url)).value('strata_requests_total');
      assert.ok(Number.isNaN(served) || served > 0, `replica ${r.url} served ${served}`);
    }
    const sessions = await Promise.all([0, 1, 2, 3].map(() => fetch(router.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json', 'x-session-id': 'conv-42' },
      body: JSON.stringify({ model: 'strata-demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    }).then((r) => r.status)));
    assert.deepEqual(sessions, [200, 200, 200, 200]);
    assert.match(await (await fetch(router.url + '/metrics')).text(), /strata_router_requests_total\{route="session"\} 4/);
  } finally {
    router.stop();
    await Promise.all(replicas.map((r) => r.stop()));
  }
});

test('kill -9 of the replica serving most streams: every stream completes exactly through another',
  { skip: HAVE_REDIS ? false : 'redis-server is not installed', timeout: 240000 }, async () => {
    const redis = await startRedis();
    const flags = ['--model', DEMO, '--kv-redis-url', redis.url, '--checkpoint-every', '8', '--checkpoint-store', 'redis'];
    const replicas = await Promise.all([0, 1, 2].map(() => startServer(flags)));
    const router = await startRouter(replicas);
    try {
      const bodies = Array.from({ length: 8 }, (_, i) => ({
        messages: [{ role: 'user', content: `Stream ${i}: tell me a long story about the sea, ship ${i * 7}.` }],
        max_tokens: 3000, ignore_eos: true,
      }));
      const reference = await Promise.all(bodies.map((b) => chat(router.url, b)));
      // The kill is decided in a process of its own: this one's event loop is busy reading the
      // streams. Once all 8 are in flight (the router's gauges), 300 ms on, the replica with the
      // most of them is killed.
      const pids = Object.fromEntries(replicas.map((r) => [r.url, r.proc.pid]));
      const killerScript = `
        const pids = ${JSON.stringify(pids)};
        const inFlight = async () => {
          const m = await (await fetch(${JSON.stringify(router.url)} + '/metrics')).text();
          return Object.keys(pids).map((u) => [u, Number(m.split('\\n').find((l) => l.startsWith('strata_router_replica_in_flight{replica="' + u + '"}')).split(' ').pop())]);
        };
        (async () => {
          for (;;) {
            const f = await inFlight();
            if (f.reduce((a, [, n]) => a + n, 0) >= 8) break;
            await new Promise((r) => setTimeout(r, 10));
          }
          await new Promise((r) => setTimeout(r, 300));
          const f = (await inFlight()).sort((a, b) => b[1] - a[1]);
          process.kill(pids[f[0][0]], 'SIGKILL');
          console.log(JSON.stringify({ url: f[0][0], streams: f[0][1] }));
        })();`;
      const killerProc = spawn(process.execPath, ['-e', killerScript], { stdio: ['ignore', 'pipe', 'inherit'] });
      let killerOut = '';
      killerProc.stdout.on('data', (d) => { killerOut += d; });
      const killerDone = new Promise((r) => killerProc.on('exit', r));
      const resumed = await Promise.all(bodies.map((b) => chat(router.url, b)));
      await killerDone;
      const killed = JSON.parse(killerOut);
      assert.ok(killed.streams >= 1, 'the killed replica was serving streams');
      resumed.forEach((r, i) => assert.equal(r.text, reference[i].text, `stream ${i} is exactly the uninterrupted one`));
      const m = await (await fetch(router.url + '/metrics')).text();
      const n = Number(m.split('\n').find((l) => l.startsWith('strata_router_resumed_streams_total')).split(' ').pop());
      assert.ok(n >= killed.streams, `resumed ${n} streams, the killed replica served ${killed.streams}`);
      console.log(`# killed a replica serving ${killed.streams} of 8 streams; ${n} resumed through others, all exact`);
    } finally {
      router.stop();
      await Promise.all(replicas.map((r) => r.stop()));
      await redis.stop();
    }
  });
