// Headless Chromium driven over the DevTools protocol (no npm package: the WebSocket of Node 22,
// or of Node 20 with --experimental-websocket, which run.sh passes). findChromium() returns
// null only when no Chromium binary is installed.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

export function findChromium() {
  const names = [process.env.STRATA_CHROMIUM, 'chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'];
  for (const name of names.filter(Boolean)) {
    try {
      return execFileSync('sh', ['-c', `command -v "${name}"`], { encoding: 'utf8' }).trim() || null;
    } catch { /* not this one */ }
  }
  return null;
}

// The browser process ended or its DevTools connection closed under a call.
export class BrowserGone extends Error {}

export async function launch(binary, { width = 1280, height = 900 } = {}) {
  if (typeof WebSocket === 'undefined') throw new Error('this Node.js has no WebSocket: run with --experimental-websocket (run.sh does)');
  const profile = mkdtempSync(path.join(tmpdir(), 'strata-chromium-'));
  const proc = spawn(binary, ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--no-default-browser-check', '--disable-extensions', `--user-data-dir=${profile}`, '--remote-debugging-port=0',
    `--window-size=${width},${height}`, 'about:blank'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  const wsUrl = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('chromium did not start:\n' + stderr)), 30000);
    proc.stderr.on('data', (d) => {
      stderr += d.toString();
      const m = stderr.match(/DevTools listening on (ws:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`chromium exited with ${code}:\n${stderr}`)); });
  });
  const ws = new WebSocket(wsUrl);
  await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = () => reject(new Error('cannot connect to ' + wsUrl)); });
  let nextId = 1;
  const pending = new Map();
  // A browser that goes away fails every call in flight and every later one (BrowserGone),
  // with what it printed, instead of leaving them waiting.
  let gone = null;
  const fail = (why) => {
    if (!gone) gone = new BrowserGone(`${why}\n${stderr.slice(-4000)}`);
    for (const p of pending.values()) p.reject(gone);
    pending.clear();
  };
  proc.on('exit', (code, signal) => fail(`chromium exited (code ${code}, signal ${signal})`));
  ws.onclose = () => fail('the DevTools connection closed');
  ws.onmessage = (m) => {
    const msg = JSON.parse(m.data);
    const p = msg.id && pending.get(msg.id);
    if (!p) return;
    pending.delete(msg.id);
    if (msg.error) p.reject(new Error(`${p.method}: ${msg.error.message}`));
    else p.resolve(msg.result);
  };
  const send = (method, params = {}, sessionId) => new Promise((resolve, reject) => {
    if (gone) return reject(gone);
    const id = nextId++;
    const timer = setTimeout(() => {
      pending.delete(id);
      reject(new Error(`${method}: no answer from chromium in 30 s`));
    }, 30000);
    pending.set(id, { resolve: (v) => { clearTimeout(timer); resolve(v); }, reject: (e) => { clearTimeout(timer); reject(e); }, method });
    ws.send(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }));
  });
  const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
  const page = {
    send: (method, params) => send(method, params, sessionId),
    // The value of a JavaScript expression in the page (awaited when it is a promise).
    async eval(expression) {
      const r = await page.send('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true });
      if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
      return r.result.value;
    },
    async goto(url) {
      await page.send('Page.enable');
      await page.send('Page.navigate', { url });
      await page.waitFor('document.readyState === "complete"');
    },
    async waitFor(expression, timeoutMs = 20000) {
      const t0 = Date.now();
      for (;;) {
        const v = await page.eval(expression);
        if (v) return v;
        if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${expression}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    async screenshot() {
      const { data } = await page.send('Page.captureScreenshot', { format: 'png' });
      return Buffer.from(data, 'base64');
    },
  };
  return {
    page,
    async close() {
      ws.onclose = null;
      try { ws.close(); } catch { /* closing anyway */ }
      proc.kill('SIGKILL');
      await new Promise((r) => (proc.exitCode !== null || proc.signalCode !== null ? r() : proc.on('exit', r)));
      // Chromium's helper processes may still be writing the profile for a moment after the
      // browser is gone: retried, and a profile left behind is not the page's failure.
      try {
        rmSync(profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
      } catch (e) {
        console.log(`# chromium profile ${profile} not removed: ${e.message}`);
      }
    },
  };
}
