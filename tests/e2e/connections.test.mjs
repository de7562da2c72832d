// Connection screening: slow clients (a header line every 2 s, a body byte every 500 ms) hold
// no worker, so ordinary requests are answered at their usual speed while the slow ones get 408
// after --header-timeout; absurd Content-Length values and oversized heads are answered at once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, waitNoUsedBlocks, metrics } from './lib/server.mjs';

const HEADER_TIMEOUT_S = 4;
const MAX_BODY = 65536;
let server;
let port;

before(async () => {
  server = await startServer(['--header-timeout', String(HEADER_TIMEOUT_S), '--max-body-bytes', String(MAX_BODY)]);
  port = Number(new URL(server.url).port);
});
after(async () => { assert.equal(await server.stop(), 0); });

// A raw connection: writes `head`, then `drip(i)` every `everyMs` until the server closes it.
// Resolves on close with what came back and when (ms since the connection opened).
function rawConnection(head, { drip = null, everyMs = 0 } = {}) {
  let connected;
  const ready = new Promise((r) => { connected = r; });
  const done = new Promise((resolve) => {
    const t0 = Date.now();
    let text = '';
    let firstByteMs = null;
    let timer = null;
    const sock = net.connect(port, '127.0.0.1', () => {
      sock.write(head);
      if (drip) {
        let i = 0;
        timer = setInterval(() => { if (!sock.destroyed) sock.write(drip(i++)); }, everyMs);
      }
      connected();
    });
    sock.on('data', (d) => {
      firstByteMs ??= Date.now() - t0;
      text += d.toString();
    });
    const end = (err) => {
      clearInterval(timer);
      connected();
      resolve({ text, firstByteMs, closedMs: Date.now() - t0, error: err?.code ?? null });
    };
    sock.on('error', end);
    sock.on('close', () => end());
  });
  return { ready, done };
}

function parseAnswer(text) {
  const at = text.indexOf('\r\n\r\n');
  const status = Number(text.match(/^HTTP\/1\.1 (\d{3}) /)?.[1]);
  let json = null;
  try { json = JSON.parse(text.slice(at + 4)); } catch { /* not JSON */ }
  return { status, head: text.slice(0, at), json };
}

// Three ordinary requests one after another; each must be answered within 2 s.
async function ordinaryRequests() {
  const times = [];
  for (let i = 0; i < 3; ++i) {
    const t0 = Date.now();
    const res = await fetch(server.url + '/v1/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'In the beginning', max_tokens: 2 }),
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.equal(body.usage.completion_tokens, 2);
    times.push(Date.now() - t0);
  }
  for (const ms of times) assert.ok(ms < 2000, `an ordinary request took ${ms} ms while slow clients were connected (${times})`);
  return times;
}

function expect408(results, what) {
  for (const r of results) {
    assert.equal(r.error, null, `${what}: ${r.error}`);
    const a = parseAnswer(r.text);
    assert.equal(a.status, 408, `${what}: ${JSON.stringify(r.text.slice(0, 200))}`);
    assert.match(a.json.error.message, /--header-timeout/);
    // Answered once the timeout passed (counted from the connection opening), not before and not much later.
    assert.ok(r.firstByteMs >= HEADER_TIMEOUT_S * 1000 - 300 && r.firstByteMs < HEADER_TIMEOUT_S * 1000 + 3000,
              `${what}: answered after ${r.firstByteMs} ms`);
  }
}

test('80 connections sending a header line every 2 s do not delay other requests, and get 408', { timeout: 30000 }, async () => {
  const t0 = Date.now();
  const slow = Array.from({ length: 80 }, () => rawConnection('POST /v1/completions HTTP/1.1\r\nHost: x\r\n',
    { drip: (i) => `X-Slow-${i}: ${'a'.repeat(10)}\r\n`, everyMs: 2000 }));
  await Promise.all(slow.map((s) => s.ready));
  await ordinaryRequests();
  assert.ok(Date.now() - t0 < HEADER_TIMEOUT_S * 1000 - 500, 'the ordinary requests ran while the slow connections were open');
  expect408(await Promise.all(slow.map((s) => s.done)), 'slow headers');
});

test('80 connections sending a body byte every 500 ms do not delay other requests, and get 408', { timeout: 30000 }, async () => {
  const t0 = Date.now();
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n';
  const slow = Array.from({ length: 80 }, () => rawConnection(head, { drip: () => ' ', everyMs: 500 }));
  await Promise.all(slow.map((s) => s.ready));
  await ordinaryRequests();
  assert.ok(Date.now() - t0 < HEADER_TIMEOUT_S * 1000 - 500, 'the ordinary requests ran while the slow connections were open');
  expect408(await Promise.all(slow.map((s) => s.done)), 'slow body');
  assert.equal(await waitNoUsedBlocks(server.url), 0);
});

test('absurd Content-Length values and an oversized head are answered at once', async () => {
  const rejectedBefore = (await metrics(server.url)).value('strata_http_rejected_connections_total');
  const cases = [
    ['99999999999999999999', 413, /larger than --max-body-bytes/],
    ['-1', 400, /Content-Length must be a non-negative integer, got '-1'/],
    ['abc', 400, /Content-Length must be a non-negative integer, got 'abc'/],
    [String(MAX_BODY + 1), 413, /--max-body-bytes/],
  ];
  for (const [length, status, pattern] of cases) {
    // Headers only: the body never comes, so only the gate's own answer can end this quickly.
    const c = rawConnection(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`);
    const r = await c.done;
    assert.equal(r.error, null, `Content-Length ${length}: ${r.error}`);
    const a = parseAnswer(r.text);
    assert.equal(a.status, status, `Content-Length ${length}: ${JSON.stringify(r.text.slice(0, 200))}`);
    assert.match(a.json.error.message, pattern);
    assert.ok(r.closedMs < 1000, `Content-Length ${length}: answered and closed after ${r.closedMs} ms`);
  }
  const big = rawConnection(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(70 << 10)}\r\n\r\n`);
  const r = await big.done;
  assert.equal(parseAnswer(r.text).status, 431, JSON.stringify(r.text.slice(0, 200)));
  assert.ok(r.closedMs < 1000, `an oversized head was answered after ${r.closedMs} ms`);
  // The five answers the gate gave itself are counted on /metrics.
  const rejectedAfter = (await metrics(server.url)).value('strata_http_rejected_connections_total');
  assert.equal(rejectedAfter - rejectedBefore, cases.length + 1);
  await ordinaryRequests();
});
