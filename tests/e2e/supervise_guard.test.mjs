// strata serve --supervise under abuse: a burst of 300 simultaneous requests is answered in full
// (200, or 429/503 with Retry-After; none reset); the child's loopback port honors no forged
// X-Strata-* header; a request that crashes the engine twice is quarantined (500
// request_quarantined) while the server keeps serving, and an identical one is refused at once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer } from './lib/server.mjs';

const MARKER = 'POISON-XYZ';
let server;
let port;

before(async () => {
  server = await startServer(['--supervise', '--header-timeout', '4', '--max-restarts-per-minute', '10'],
                             { env: { STRATA_TEST_CRASH_MARKER: MARKER } });
  port = Number(new URL(server.url).port);
});
after(async () => { assert.equal(await server.stop(), 0); });

// One request on its own connection; resolves with the raw answer (or the socket error).
function rawPost(toPort, path, body) {
  return new Promise((resolve) => {
    let text = '';
    const sock = net.connect(toPort, '127.0.0.1', () => sock.write(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`));
    sock.on('data', (d) => { text += d.toString(); });
    sock.on('error', (e) => resolve({ text, error: e.code ?? String(e) }));
    sock.on('close', () => resolve({ text, error: null }));
  });
}

async function health() {
  const res = await fetch(server.url + '/health');
  return { status: res.status, body: await res.json() };
}

async function complete(prompt) {
  const res = await fetch(server.url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt, max_tokens: 2 }),
  });
  return { status: res.status, json: await res.json() };
}

test('300 simultaneous requests: every one gets an HTTP answer', { timeout: 60000 }, async () => {
  const body = JSON.stringify({ prompt: 'Blessed are the', max_tokens: 2 });
  const answers = await Promise.all(Array.from({ length: 300 }, () => rawPost(port, '/v1/completions', body)));
  const tally = {};
  for (const a of answers) {
    assert.equal(a.error, null, `a connection failed: ${a.error} after ${JSON.stringify(a.text.slice(0, 100))}`);
    const status = Number(a.text.match(/^HTTP\/1\.1 (\d{3}) /)?.[1]);
    tally[status] = (tally[status] ?? 0) + 1;
    const [head, payload] = [a.text.slice(0, a.text.indexOf('\r\n\r\n')), a.text.slice(a.text.indexOf('\r\n\r\n') + 4)];
    assert.ok([200, 429, 503].includes(status), `unexpected answer: ${JSON.stringify(a.text.slice(0, 300))}`);
    if (status === 200) {
      assert.equal(JSON.parse(payload).usage.completion_tokens, 2);
    } else {
      assert.match(head, /\r\nRetry-After: \d+/i, `${status} without Retry-After`);
      assert.ok(JSON.parse(payload).error.message.length > 0);
    }
  }
  assert.ok((tally[200] ?? 0) >= 100, `answers: ${JSON.stringify(tally)}`);
  assert.equal((await complete('Afterwards')).status, 200);
});

test('the child port does not honor forged X-Strata-* headers', async () => {
  const ports = [...server.stderr().matchAll(/serves on 127\.0\.0\.1:(\d+)/g)].map((m) => m[1]);
  assert.ok(ports.length >= 1, server.stderr());
  const child = `http://127.0.0.1:${ports.at(-1)}`;
  const forged = { 'content-type': 'application/json', 'X-Strata-Response-Id': 'forged', 'X-Strata-Created': '12345' };
  const res = await fetch(child + '/v1/completions', {
    method: 'POST', headers: forged, body: JSON.stringify({ prompt: 'Hello', max_tokens: 2 }),
  });
  const c = await res.json();
  assert.equal(res.status, 200, JSON.stringify(c));
  assert.notEqual(c.id, 'forged');
  assert.match(c.id, /^cmpl-/);
  assert.notEqual(c.created, 12345);

  const sres = await fetch(child + '/v1/chat/completions', {
    method: 'POST', headers: { ...forged, 'X-Strata-Stream-Parts': '1' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, stream: true }),
  });
  assert.equal(sres.status, 200);
  const raw = await sres.text();
  assert.doesNotMatch(raw, /: strata-part/);
  assert.doesNotMatch(raw, /forged/);
  assert.match(raw, /data: \[DONE\]/);
  const ids = new Set([...raw.matchAll(/^data: (\{.*\})$/gm)].map((m) => JSON.parse(m[1]).id));
  assert.equal(ids.size, 1);
  assert.match([...ids][0], /^chatcmpl-/);
});

test('a request that crashes the engine twice is quarantined; the server keeps serving', { timeout: 90000 }, async () => {
  const before = await health();
  assert.equal(before.status, 200);
  const restarts0 = before.body.supervisor.restarts;
  const poisoned = { prompt: `Tell me about ${MARKER} please`, max_tokens: 2 };

  const t0 = Date.now();
  const p = await fetch(server.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(poisoned) });
  const pj = await p.json();
  assert.equal(p.status, 500, JSON.stringify(pj));
  assert.equal(pj.error.code, 'request_quarantined');
  assert.equal(pj.error.type, 'server_error');
  assert.match(pj.error.message, /crashed twice/);
  assert.match(server.stderr(), /crashed 2 times under this request: quarantined/);
  const elapsed = Date.now() - t0;

  // A normal request waits for the restarted engine and is served.
  const n = await complete('A normal request');
  assert.equal(n.status, 200, JSON.stringify(n.json));
  assert.equal(n.json.usage.completion_tokens, 2);
  const h = await health();
  assert.equal(h.status, 200, JSON.stringify(h.body));
  assert.equal(h.body.supervisor.engine_up, true);
  assert.equal(h.body.supervisor.restarts, restarts0 + 2, 'the engine crashed twice, no more');
  assert.match(h.body.supervisor.last_exit, /signal 6/);
  const m = await (await fetch(server.url + '/metrics')).text();
  assert.match(m, /^strata_supervisor_quarantined_total 1$/m);
  assert.match(m, /^strata_supervisor_restarts_total 2$/m);

  // The identical request is refused at once, without reaching the engine.
  const t1 = Date.now();
  const again = await fetch(server.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(poisoned) });
  const aj = await again.json();
  assert.equal(again.status, 500);
  assert.equal(aj.error.code, 'request_quarantined');
  assert.ok(Date.now() - t1 < 1000, `the quarantined request took ${Date.now() - t1} ms (the first took ${elapsed} ms)`);
  await new Promise((r) => setTimeout(r, 300));
  const h2 = await health();
  assert.equal(h2.status, 200);
  assert.equal(h2.body.supervisor.restarts, restarts0 + 2, 'no restart for the quarantined request');
  assert.equal(h2.body.supervisor.engine_pid, h.body.supervisor.engine_pid);
  assert.equal((await complete('Still serving')).status, 200);
});

// The streamed relay (Supervisor::stream_worker) answers with the same code as the plain one.
test('a streamed request that crashes the engine twice is quarantined with its code',
  { timeout: 90000 }, async () => {
    const body = JSON.stringify({ prompt: `Stream ${MARKER}`, max_tokens: 2, stream: true });
    const res = await fetch(server.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const j = await res.json();
    assert.equal(res.status, 500, JSON.stringify(j));
    assert.match(j.error.message, /crashed twice/);
    assert.equal(j.error.code, 'request_quarantined', JSON.stringify(j));
  });
