#include "server/status_page.h"

namespace strata::server {

namespace {

using json = nlohmann::json;

json pool_json(const KvCacheStats& k) {
  return {{"blocks", k.n_blocks}, {"used", k.used}, {"cached", k.cached}, {"free", k.free}, {"pinned", k.pinned},
          {"evictions", k.evictions}};
}

json histogram_json(const LatencyHistogram& h) { return {{"count", h.count}, {"sum_ms", h.sum_ms}}; }

// One page, no build step. Text from the server and the user is set as textContent, never HTML.
const char* const kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>strata</title>
<style>
  :root { --fg: #1d2330; --muted: #69707d; --line: #dfe3ea; --accent: #2f6fdb; --bg: #f6f7f9; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
  header { display: flex; align-items: center; gap: 16px; padding: 12px 20px; background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { font-size: 18px; margin: 0; }
  header .state { color: var(--muted); font-size: 13px; }
  header label { margin-left: auto; font-size: 13px; color: var(--muted); }
  header input { font: inherit; padding: 4px 8px; border: 1px solid var(--line); border-radius: 6px; width: 220px; }
  main { display: grid; grid-template-columns: 340px 1fr; gap: 16px; padding: 16px 20px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 14px 16px; }
  h2 { font-size: 14px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 0 0 10px; }
  table { width: 100%; border-collapse: collapse; font-size: 14px; }
  td { padding: 3px 0; vertical-align: top; }
  td:first-child { color: var(--muted); width: 46%; }
  .bar { height: 8px; background: #eef1f5; border-radius: 4px; overflow: hidden; display: flex; margin-top: 4px; }
  .bar span { display: block; height: 100%; }
  #chat { display: flex; flex-direction: column; min-height: 70vh; }
  #log { flex: 1; overflow-y: auto; display: flex; flex-direction: column; gap: 10px; padding-bottom: 10px; }
  .msg { max-width: 80%; padding: 8px 12px; border-radius: 10px; white-space: pre-wrap; word-wrap: break-word; }
  .user { align-self: flex-end; background: var(--accent); color: #fff; }
  .assistant { align-self: flex-start; background: #eef1f5; }
  .assistant .thinking { color: var(--muted); font-style: italic; }
  .error { align-self: flex-start; background: #fdeaea; color: #8a1f1f; }
  form { display: flex; gap: 8px; border-top: 1px solid var(--line); padding-top: 10px; }
  textarea { flex: 1; font: inherit; padding: 8px; border: 1px solid var(--line); border-radius: 8px; resize: vertical; min-height: 44px; }
  button { font: inherit; padding: 0 18px; border: 0; border-radius: 8px; background: var(--accent); color: #fff; cursor: pointer; }
  button:disabled { opacity: .5; cursor: default; }
  .opts { font-size: 13px; color: var(--muted); display: flex; gap: 12px; align-items: center; margin-top: 6px; }
  .opts input { width: 64px; font: inherit; }
  @media (max-width: 800px) { main { grid-template-columns: 1fr; } }
</style>
</head>
<body>
<header>
  <h1>strata</h1><span class="state" id="state">connecting...</span>
  <label>API key <input id="key" type="password" autocomplete="off" placeholder="(none)"></label>
</header>
<main>
  <section>
    <h2>Status</h2>
    <table id="status"><tbody></tbody></table>
    <div class="bar" id="kvbar" title="KV blocks: used, cached, free"></div>
  </section>
  <section id="chat">
    <h2>Chat</h2>
    <div id="log"></div>
    <form id="form">
      <textarea id="prompt" placeholder="Send a message (Enter; Shift+Enter for a new line)"></textarea>
      <button id="send" type="submit">Send</button>
    </form>
    <div class="opts">
      <label>max tokens <input id="max" type="number" min="1" value="128"></label>
      <label>temperature <input id="temp" type="number" min="0" max="2" step="0.1" value="0.7"></label>
      <button id="clear" type="button" style="background:#8b93a1;padding:2px 10px">New chat</button>
    </div>
  </section>
</main>
<script>
'use strict';
const $ = (id) => document.getElementById(id);
const history = [];
let previous = null;

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = $('key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

function ms(v) { return v == null ? '-' : v < 10 ? v.toFixed(2) + ' ms' : v.toFixed(0) + ' ms'; }
function bytes(b) {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + ' ' + u[i];
}
// The mean over the last poll interval (cumulative sums differenced), else over all time.
function recent(now, old, key) {
  const c = now[key], o = old && old[key];
  if (o && c.count > o.count) return (c.sum_ms - o.sum_ms) / (c.count - o.count);
  if (o) return previous.recent && previous.recent[key];
  return c.count ? c.sum_ms / c.count : null;
}

function render(s) {
  const rows = [
    ['model', s.model], ['device', s.device || '-'], ['context', s.max_model_len + ' tokens'],
    ['engine', s.alive ? 'running' : 'stopped'],
    ['requests', s.requests.running + ' running, ' + s.requests.waiting + ' waiting, ' + s.requests.queued + ' queued'],
    ['KV pool', s.kv.used + ' used, ' + s.kv.cached + ' cached, ' + s.kv.free + ' free of ' + s.kv.blocks + ' blocks'],
    ['KV block', s.kv.block_size + ' tokens, ' + bytes(s.kv.bytes_per_token * s.kv.block_size)],
  ];
  if (s.kv_window) rows.push(['window pool', s.kv_window.used + ' used of ' + s.kv_window.blocks]);
  if (s.kv_quant) rows.push(['codec pool', s.kv_quant.used + ' used of ' + s.kv_quant.blocks]);
  if (s.kv_tiers) {
    rows.push(['host tier', s.kv_tiers.host_blocks + ' blocks, ' + bytes(s.kv_tiers.host_bytes) + ', ' + s.kv_tiers.host_hit_blocks + ' hits']);
    rows.push(['disk tier', s.kv_tiers.disk_blocks + ' blocks, ' + bytes(s.kv_tiers.disk_bytes) + ', ' + s.kv_tiers.disk_hit_blocks + ' hits']);
  } else {
    rows.push(['KV tiers', 'none']);
  }
  const r = { ttft: recent(s, previous, 'ttft'), inter_token: recent(s, previous, 'inter_token') };
  s.recent = r;
  rows.push(['TTFT (recent)', ms(r.ttft)], ['TPOT (recent)', ms(r.inter_token)]);
  rows.push(['tokens', s.tokens.prompt + ' prompt, ' + s.tokens.generated + ' generated, ' + s.tokens.prefix_hit + ' from cache']);
  rows.push(['preemptions', String(s.preemptions)]);
  const body = $('status').tBodies[0];
  body.replaceChildren(...rows.map(([k, v]) => {
    const tr = document.createElement('tr');
    for (const t of [k, v]) { const td = document.createElement('td'); td.textContent = t; tr.appendChild(td); }
    return tr;
  }));
  const total = Math.max(1, s.kv.blocks);
  $('kvbar').replaceChildren(...[[s.kv.used, '#2f6fdb'], [s.kv.cached, '#8fb3ef'], [s.kv.free, '#eef1f5']].map(([n, c]) => {
    const span = document.createElement('span');
    span.style.width = (100 * n / total) + '%';
    span.style.background = c;
    return span;
  }));
  previous = s;
}

async function poll() {
  try {
    const res = await fetch('/status', { headers: headers() });
    if (res.status === 401) { $('state').textContent = 'enter the API key'; return; }
    if (!res.ok) { $('state').textContent = 'status ' + res.status; return; }
    const s = await res.json();
    $('state').textContent = s.model + ' on ' + (s.device || '?');
    render(s);
  } catch (e) {
    $('state').textContent = 'server unreachable';
  }
}

function bubble(cls, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + cls;
  div.textContent = text;
  $('log').appendChild(div);
  $('log').scrollTop = $('log').scrollHeight;
  return div;
}

async function send(text) {
  history.push({ role: 'user', content: text });
  bubble('user', text);
  const out = bubble('assistant', '');
  out.id = 'answer';
  document.querySelectorAll('.assistant[data-done]').forEach((e) => e.removeAttribute('id'));
  const thinking = document.createElement('div');
  thinking.className = 'thinking';
  const content = document.createElement('span');
  out.append(thinking, content);
  $('send').disabled = true;
  let answer = '';
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(),
      body: JSON.stringify({ messages: history, stream: true, max_tokens: Number($('max').value) || 128,
                             temperature: Number($('temp').value) }),
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || ('HTTP ' + res.status));
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, nl);
        buf = buf.slice(nl + 2);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        const d = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (!d) continue;
        if (d.reasoning_content) thinking.textContent += d.reasoning_content;
        if (d.content) { answer += d.content; content.textContent = answer; }
        $('log').scrollTop = $('log').scrollHeight;
      }
    }
    history.push({ role: 'assistant', content: answer });
  } catch (e) {
    history.pop();
    out.remove();
    bubble('error', String(e.message || e));
  } finally {
    out.dataset.done = '1';
    $('send').disabled = false;
    poll();
  }
}

$('form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('prompt').value.trim();
  if (!text || $('send').disabled) return;
  $('prompt').value = '';
  send(text);
});
$('prompt').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('form').requestSubmit(); }
});
$('clear').addEventListener('click', () => { history.length = 0; $('log').replaceChildren(); });
$('key').addEventListener('change', poll);
poll();
setInterval(poll, 2000);
</script>
</body>
</html>
)HTML";

}  // namespace

json status_json(const StatusInfo& info, const EngineStats& e) {
  json j = {{"model", info.model}, {"device", info.device}, {"max_model_len", info.max_model_len}, {"alive", e.alive}};
  j["requests"] = {{"running", e.running}, {"waiting", e.waiting}, {"queued", e.queue_depth}};
  j["kv"] = pool_json(e.kv);
  j["kv"]["block_size"] = info.block_size;
  j["kv"]["bytes_per_token"] = info.kv_bytes_per_token;
  j["kv_window"] = e.kv_window.n_blocks > 0 ? pool_json(e.kv_window) : json(nullptr);
  j["kv_quant"] = e.kv_quant.n_blocks > 0 ? pool_json(e.kv_quant) : json(nullptr);
  if (e.kv_tiers.enabled) {
    const KvTierStats& t = e.kv_tiers;
    j["kv_tiers"] = {{"host_blocks", t.host_blocks}, {"host_bytes", t.host_bytes}, {"host_hit_blocks", t.host_hit_blocks},
                     {"disk_blocks", t.disk.blocks}, {"disk_bytes", t.disk.bytes}, {"disk_hit_blocks", t.disk_hit_blocks},
                     {"demoted_blocks", t.demoted_blocks}};
  } else {
    j["kv_tiers"] = nullptr;
  }
  j["tokens"] = {{"prompt", e.prompt_tokens}, {"generated", e.generated_tokens}, {"prefix_hit", e.prefix_hit_tokens}};
  j["steps"] = e.steps;
  j["preemptions"] = e.preemptions;
  j["ttft"] = histogram_json(e.ttft);
  j["inter_token"] = histogram_json(e.inter_token);
  return j;
}

const std::string& status_page_html() {
  static const std::string page(kPage);
  return page;
}

}  // namespace strata::server
