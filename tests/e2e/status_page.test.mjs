// The page at / in headless Chromium: it loads without the API key, shows the status once the
// key is typed in, sends a chat message and shows the answer as it streams. A screenshot is kept
// in <build>/Testing/artifacts/status_page.png. Skipped, saying so, only when no Chromium is
// installed (Debian: apt-get install chromium; scripts/install-deps.sh installs it).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, BINARY } from './lib/server.mjs';
import { BrowserGone, findChromium, launch } from './lib/browser.mjs';

const KEY = 'page-key';
const chromium = findChromium();
const SKIP = chromium ? false : 'chromium is not installed (apt-get install chromium): the browser test of the page cannot run';
let server, browser;

before(async () => {
  if (SKIP) return;
  server = await startServer(['--api-key', KEY, '--max-model-len', '1024']);
  browser = await launch(chromium);
});
after(async () => {
  try {
    if (browser) await browser.close();
  } finally {
    if (server) assert.equal(await server.stop(), 0);
  }
});

test('the page loads, shows status and streams a chat answer', { skip: SKIP }, async () => {
  try {
    await pageSession();
  } catch (e) {
    // A browser that dies under the test says nothing of the page: once more in a new one.
    if (!(e instanceof BrowserGone)) throw e;
    console.log(`# chromium went away (${e.message.split('\n')[0]}); once more with a new browser`);
    await browser.close();
    browser = await launch(chromium);
    await pageSession();
  }
});

async function pageSession() {
  // The HTML is public; the API calls it makes are not.
  const html = await fetch(server.url + '/');
  assert.equal(html.status, 200);
  assert.match(html.headers.get('content-type'), /text\/html/);
  assert.equal((await fetch(server.url + '/status')).status, 401);

  const { page } = browser;
  await page.goto(server.url + '/');
  await page.waitFor(`document.getElementById('state').textContent === 'enter the API key'`);
  await page.eval(`(() => { const k = document.getElementById('key'); k.value = ${JSON.stringify(KEY)};
                            k.dispatchEvent(new Event('change')); })()`);
  await page.waitFor(`document.getElementById('state').textContent === 'strata-demo on cpu'`);
  const status = await page.eval(`document.getElementById('status').innerText`);
  for (const want of ['strata-demo', 'KV pool', '0 used', 'requests', 'TTFT', 'TPOT']) assert.ok(status.includes(want), `${want} in\n${status}`);

  // Count the answer's updates while it streams: more than one means it streamed.
  await page.eval(`(() => {
    window.__updates = 0;
    new MutationObserver(() => { if (document.getElementById('answer')) window.__updates++; })
      .observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
    document.getElementById('max').value = '24';
    document.getElementById('temp').value = '0';
    document.getElementById('prompt').focus();
  })()`);
  await page.send('Input.insertText', { text: 'And the LORD spake unto Moses, saying,' });
  await page.eval(`document.getElementById('send').click()`);
  await page.waitFor(`document.getElementById('answer')?.dataset.done === '1'`, 60000);
  const errors = await page.eval(`document.querySelectorAll('.msg.error').length`);
  assert.equal(errors, 0, await page.eval(`document.getElementById('log').innerText`));
  const answer = await page.eval(`document.getElementById('answer').textContent`);
  assert.ok(answer.trim().length > 0, 'an answer');
  const updates = await page.eval('window.__updates');
  assert.ok(updates >= 3, `the answer arrived in pieces (${updates} updates)`);
  assert.equal(await page.eval(`document.querySelector('.msg.user').textContent`), 'And the LORD spake unto Moses, saying,');
  // After the answer the status shows the tokens it generated.
  await page.waitFor(`/\\d+ prompt, [1-9]\\d* generated/.test(document.getElementById('status').innerText)`);

  const dir = path.join(path.dirname(BINARY), 'Testing', 'artifacts');
  mkdirSync(dir, { recursive: true });
  const png = await page.screenshot();
  assert.ok(png.length > 10000 && png.subarray(1, 4).toString() === 'PNG');
  writeFileSync(path.join(dir, 'status_page.png'), png);
}
