// The Redis KV tier and shared checkpoints across replicas, on loopback: a redis-server and
// strata-demo replicas on the CPU, all started here. A 2,000-token prompt served by replica A
// is a Redis hit on replica B; corrupt values are misses; Redis stopped mid-run is served
// around and picked up again; a replica killed mid-stream is resumed on another from its
// checkpoint in Redis; a wrong password or an unreachable URL fails at start naming the flag.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, metrics, BINARY, DEMO } from './lib/server.mjs';
import { HAVE_REDIS, startRedis, freePort } from './lib/redis.mjs';

const skip = HAVE_REDIS ? false : 'redis-server / redis-cli are not installed (scripts/install-deps.sh installs them)';
const PASSWORD = 'e2e-secret';

// n prompt token ids, distinct per seed (the demo model's vocabulary is larger than 3,000).
const prompt = (n, seed) => Array.from({ length: n }, (_, i) => 3 + ((i + seed * 977) * 7919 + 13) % 3000);

// A streamed completion: its text, the milliseconds to the first token and the usage.
async function complete(url, body) {
  const t0 = performance.now();
  const res = await fetch(url + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'strata-demo', temperature: 0, stream: true, stream_options: { include_usage: true }, ...body }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  const decoder = new TextDecoder();
  let buf = '';
  let text = '';
  let ttft = null;
  let usage = null;
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const d = JSON.parse(event.slice(6));
      assert.equal(d.error, undefined, JSON.stringify(d.error));
      const piece = d.choices?.[0]?.text ?? '';
      if (piece && ttft === null) ttft = performance.now() - t0;
      text += piece;
      if (d.usage) usage = d.usage;
    }
  }
  return { text, ttft, usage, cached: usage?.prompt_tokens_details?.cached_tokens ?? 0 };
}

async function waitFor(what, fn, timeoutMs = 20000) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > timeoutMs) throw new Error('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const redisMetric = async (url, result) => (await metrics(url)).value('strata_kv_redis_blocks_total', `result="${result}"`);

const replica = (redisUrl, extra = []) => startServer(['--model', DEMO, '--kv-redis-url', redisUrl, ...extra]);

test('a prompt replica A computed is a Redis-tier hit on replica B', { skip, timeout: 120000 }, async () => {
  const redis = await startRedis({ password: PASSWORD });
  const a = await replica(redis.url);
  const b = await replica(redis.url);
  try {
    const body = { prompt: prompt(2000, 1), max_tokens: 16 };
    const cold = await complete(a.url, body);
    assert.equal(cold.cached, 0);
    // A shares the prompt's blocks when the request ends: 125 full blocks of 16 tokens.
    await waitFor('A to write its blocks to Redis', async () => (await redisMetric(a.url, 'written')) >= 125);
    const hit = await complete(b.url, body);
    assert.ok(hit.cached >= 1984, `replica B cached_tokens ${hit.cached}, expected >= 1984`);
    assert.equal(hit.text, cold.text, 'a Redis hit gives the cold run\'s tokens');
    const m = await metrics(b.url);
    assert.ok(m.value('strata_kv_tier_hit_blocks_total', 'tier="redis"') >= 124, m.text);
    assert.ok(m.value('strata_kv_redis_blocks_total', 'result="read"') >= 124);
    assert.equal(m.value('strata_kv_redis_blocks_total', 'result="corrupt"'), 0);
    // A cold run on B of another prompt of the same length, for the TTFT ratio.
    const coldB = await complete(b.url, { prompt: prompt(2000, 2), max_tokens: 16 });
    assert.equal(coldB.cached, 0);
    console.log(`# TTFT, 2,000-token prompt on replica B: Redis hit ${hit.ttft.toFixed(1)} ms, cold ${coldB.ttft.toFixed(1)} ms, ` +
                `ratio hit/cold ${(hit.ttft / coldB.ttft).toFixed(3)} (A cold ${cold.ttft.toFixed(1)} ms)`);

    // Every value corrupted in Redis: a third replica finds the keys, rejects every value, and
    // computes the prompt cold with the same tokens.
    const keys = redis.cli('--scan', '--pattern', 'strata:kv:*').split('\n').filter(Boolean);
    assert.ok(keys.length >= 125, `keys in Redis: ${keys.length}`);
    for (const k of keys) redis.cli('SETRANGE', k, '200', 'garbage');
    const c = await replica(redis.url);
    try {
      const again = await complete(c.url, body);
      assert.equal(again.cached, 0, 'corrupt blocks are misses');
      assert.equal(again.text, cold.text);
      assert.ok((await redisMetric(c.url, 'corrupt')) >= 1);
    } finally {
      await c.stop();
    }
  } finally {
    await a.stop();
    await b.stop();
    await redis.stop();
  }
});

test('Redis stopped mid-run: replicas keep serving; back: the tier resumes', { skip, timeout: 120000 }, async () => {
  const redis = await startRedis();
  const a = await replica(redis.url);
  const b = await replica(redis.url);
  try {
    const first = await complete(a.url, { prompt: prompt(600, 3), max_tokens: 8 });
    await waitFor('the first write', async () => (await redisMetric(a.url, 'written')) >= 37);
    await redis.stop();
    // Served from A's own pool, and cold on B: no client sees an error.
    const again = await complete(a.url, { prompt: prompt(600, 3), max_tokens: 8 });
    assert.equal(again.text, first.text);
    assert.ok(again.cached >= 592);
    const onB = await complete(b.url, { prompt: prompt(600, 3), max_tokens: 8 });
    assert.equal(onB.text, first.text);
    assert.equal(onB.cached, 0);
    const fresh = await complete(a.url, { prompt: prompt(600, 4), max_tokens: 8 });
    assert.equal(fresh.cached, 0);
    const mb = await metrics(b.url);
    assert.ok(mb.value('strata_kv_redis_lookups_total', 'result="error"') >= 1, 'B counts its failed lookup');
    await waitFor('A to count its failed writes', async () => (await redisMetric(a.url, 'write_error')) >= 1);
    assert.equal((await metrics(a.url)).value('strata_kv_redis_connected'), 0);

    // Back (empty: no persistence): after the retry interval both replicas use it again.
    const back = await startRedis({ port: redis.port });
    try {
      await new Promise((r) => setTimeout(r, 2200));  // past the replicas' retry intervals
      const before = await redisMetric(a.url, 'written');
      const p = { prompt: prompt(600, 5), max_tokens: 8 };
      const cold = await complete(a.url, p);
      await waitFor('A to write again', async () => (await redisMetric(a.url, 'written')) >= before + 37);
      const hit = await complete(b.url, p);
      assert.ok(hit.cached >= 592, `B cached ${hit.cached} after Redis came back`);
      assert.equal(hit.text, cold.text);
      assert.ok((await metrics(a.url)).value('strata_kv_redis_reconnects_total') >= 1);
      assert.equal((await metrics(a.url)).value('strata_kv_redis_connected'), 1);
    } finally {
      await back.stop();
    }
  } finally {
    await a.stop();
    await b.stop();
  }
});

test('a stream whose replica is killed resumes on another from its checkpoint in Redis', { skip, timeout: 120000 }, async () => {
  const redis = await startRedis();
  const flags = ['--checkpoint-every', '8', '--checkpoint-store', 'redis'];
  const a = await replica(redis.url, flags);
  const b = await replica(redis.url, flags);
  try {
    const body = { prompt: prompt(300, 6), max_tokens: 256, ignore_eos: true };
    const reference = await complete(b.url, body);  // uninterrupted; its checkpoint is removed at the end
    assert.equal(redis.cli('--scan', '--pattern', 'strata:ckpt:*'), '', 'a finished request leaves no checkpoint');
    // On A: killed (SIGKILL) once it has streamed past a few checkpoints.
    const res = await fetch(a.url + '/v1/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'strata-demo', temperature: 0, stream: true, ...body }),
    });
    let chunks = 0;
    try {
      for await (const chunk of res.body) {
        chunks += (new TextDecoder().decode(chunk).match(/data: /g) ?? []).length;
        if (chunks >= 40) {
          a.proc.kill('SIGKILL');
          break;
        }
      }
    } catch { /* the connection dies with the replica */ }
    assert.ok(chunks >= 40, `A streamed ${chunks} chunks before the kill`);
    await waitFor('a checkpoint in Redis', async () => redis.cli('--scan', '--pattern', 'strata:ckpt:*') !== '', 5000);
    const resumed = await complete(b.url, body);
    assert.equal(resumed.text, reference.text, 'the resumed stream is exactly the uninterrupted one');
    assert.match(b.stderr(), /resumes from its checkpoint after \d+ generated tokens/);
  } finally {
    await a.stop();
    await b.stop();
    await redis.stop();
  }
});

test('a wrong password or an unreachable URL fails at start naming --kv-redis-url', { skip, timeout: 60000 }, async () => {
  const redis = await startRedis({ password: PASSWORD });
  try {
    const run = (url) => spawnSync(BINARY, ['serve', '--model', DEMO, '--port', '0', '--threads', '1', '--kv-redis-url', url],
      { encoding: 'utf8', timeout: 30000 });
    const wrong = run(`redis://:not-it@127.0.0.1:${redis.port}/0`);
    assert.notEqual(wrong.status, 0);
    assert.match(wrong.stderr, /--kv-redis-url: redis:\/\/:\*\*\*@127\.0\.0\.1:\d+\/0: AUTH failed/);
    assert.doesNotMatch(wrong.stderr, /not-it/, 'the password is not logged');
    const none = run(`redis://127.0.0.1:${redis.port}/0`);
    assert.notEqual(none.status, 0);
    assert.match(none.stderr, /--kv-redis-url: .*NOAUTH/);
    const closed = await freePort();
    const unreachable = run(`redis://127.0.0.1:${closed}/0`);
    assert.notEqual(unreachable.status, 0);
    assert.match(unreachable.stderr, new RegExp(`--kv-redis-url: redis://127\\.0\\.0\\.1:${closed}/0: cannot connect`));
    const bad = run('http://127.0.0.1:1');
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /--kv-redis-url: Redis URL 'http:\/\/127\.0\.0\.1:1': not a redis:\/\/ URL/);
  } finally {
    await redis.stop();
  }
});
