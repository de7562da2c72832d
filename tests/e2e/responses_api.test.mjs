// The Responses API and streamed tool calls through the official openai client:
// responses.create / stream / retrieve / delete against strata-demo (a continued response is a
// prefix-cache hit), every new field's bad input, and, on a scripted model that writes a Hermes
// tool call (lib/scripted_model.mjs), tool calls streamed as deltas to the chat stream helper,
// as function_call items to responses.stream and as tool_use input deltas to the Anthropic
// client's messages.stream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, waitNoUsedBlocks, SOURCE } from './lib/server.mjs';
import { scriptedModel, SCRIPTED_CALL, SCRIPTED_TEXT } from './lib/scripted_model.mjs';

const KEY = 'e2e-responses';
let demo, scripted, client, sclient;

before(async () => {
  demo = await startServer(['--api-key', KEY, '--max-model-len', '1024', '--responses-store-ttl', '600']);
  client = new OpenAI({ baseURL: demo.url + '/v1', apiKey: KEY, maxRetries: 0 });
  scripted = await startServer(['--model', scriptedModel(SOURCE), '--served-model-name', 'scripted']);
  sclient = new OpenAI({ baseURL: scripted.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  assert.equal(await demo.stop(), 0);
  assert.equal(await scripted.stop(), 0);
});

const LONG = 'And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, ' +
  'When any man of you bring an offering unto the LORD, ye shall bring your offering of the cattle.';
const TOOLS = [{ type: 'function', name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } } } }];

// The terminal event of a Responses stream and every event's type, in order.
async function collect(stream) {
  const types = [];
  let last = null;
  let seq = -1;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1, `sequence_number of ${ev.type}`);
    seq = ev.sequence_number;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') last = ev.response;
  }
  return { types, last };
}

test('responses.create: text input, usage, retrieve and delete', async () => {
  const r = await client.responses.create({ model: 'strata-demo', input: LONG, max_output_tokens: 8, temperature: 0,
    instructions: 'Answer in the style of the King James Bible.', metadata: { run: 'e2e' } });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.ok(r.output_text.length > 0, 'the SDK joins the output text');
  assert.equal(r.instructions, 'Answer in the style of the King James Bible.');
  assert.deepEqual(r.metadata, { run: 'e2e' });
  assert.ok(r.usage.input_tokens > 30);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');

  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text, r.output_text);
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404 && e.message.includes(r.id));
});

test('responses.stream continues a stored response as a prefix-cache hit', async () => {
  const first = await client.responses.create({ model: 'strata-demo', input: LONG, max_output_tokens: 6, temperature: 0 });
  const stream = client.responses.stream({ model: 'strata-demo', previous_response_id: first.id, max_output_tokens: 6,
    temperature: 0, input: [{ role: 'user', content: [{ type: 'input_text', text: 'And what said Moses?' }] }] });
  const deltas = [];
  stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
  const { types, last } = await collect(stream);
  assert.deepEqual(types.slice(0, 4),
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.ok(types.includes('response.output_text.delta'));
  assert.deepEqual(types.slice(-4),
    ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', last.status === 'completed' ? 'response.completed' : 'response.incomplete']);
  assert.equal(last.previous_response_id, first.id);
  assert.equal(last.output[0].content[0].text, deltas.join(''));
  assert.ok(last.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens);
  assert.ok(last.usage.input_tokens_details.cached_tokens >= 32,
    `the stored conversation's prefix is cached: ${JSON.stringify(last.usage)}`);
  // A stream that ends with response.completed also gives the SDK's finalResponse.
  const text = await client.responses.create({ model: 'strata-demo', previous_response_id: last.id, input: 'Amen.',
    max_output_tokens: 4, temperature: 0 });
  assert.equal(text.previous_response_id, last.id);
  assert.ok(text.usage.input_tokens_details.cached_tokens > last.usage.input_tokens_details.cached_tokens);
  assert.equal(await waitNoUsedBlocks(demo.url, { Authorization: `Bearer ${KEY}` }), 0);
});

test('input items: messages, function calls and their outputs, reasoning', async () => {
  const r = await client.responses.create({
    model: 'strata-demo', max_output_tokens: 4, temperature: 0, instructions: 'Be brief.',
    input: [
      { role: 'developer', content: 'You may call tools.' },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Weather in Paris?' }] },
      { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'I need the weather tool.' }] },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '18 C and sunny' },
      { role: 'assistant', content: [{ type: 'output_text', text: 'It is 18 C.' }] },
      { role: 'user', content: 'Thanks.' },
    ],
  });
  assert.equal(r.output[0].type, 'message');
  // Everything above went through the template: the prompt holds the tool output.
  assert.ok(r.usage.input_tokens > 40, JSON.stringify(r.usage));
});

test('store: false is not kept; an unknown previous_response_id is 404 naming it', async () => {
  const r = await client.responses.create({ model: 'strata-demo', input: 'In the beginning', max_output_tokens: 2, store: false });
  assert.equal(r.store, false);
  await assert.rejects(client.responses.create({ model: 'strata-demo', input: 'and', previous_response_id: r.id }),
    (e) => e instanceof OpenAI.NotFoundError && e.error.param === 'previous_response_id' && e.message.includes(r.id));
  await assert.rejects(client.responses.create({ model: 'strata-demo', input: 'x', previous_response_id: 'resp_missing' }),
    (e) => e.status === 404 && e.message.includes("'resp_missing'"));
});

test('bad input to /v1/responses answers 400 naming the field and value', async () => {
  const cases = [
    [{}, 'input', /input is required/],
    [{ input: [] }, 'input', /\[\]/],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }] }, 'input[0].content[0].type', /input_image/],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0].type', /item_reference/],
    [{ input: [{ type: 'function_call', call_id: 'c', name: 'f', arguments: '{oops' }] }, 'input[0].arguments', /\{oops/],
    [{ input: [{ type: 'function_call_output', output: 'x' }] }, 'input[0].call_id', /required/],
    [{ input: 'x', instructions: 7 }, 'instructions', /number 7/],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens', /got 0/],
    [{ input: 'x', temperature: 2.5 }, 'temperature', /2\.5/],
    [{ input: 'x', top_p: -1 }, 'top_p', /-1/],
    [{ input: 'x', store: 'no' }, 'store', /"no"/],
    [{ input: 'x', previous_response_id: 12 }, 'previous_response_id', /number 12/],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0].type', /web_search/],
    [{ input: 'x', tools: [{ type: 'function', description: 'no name' }] }, 'tools[0].name', /required/],
    [{ input: 'x', tool_choice: { type: 'function' }, tools: TOOLS }, 'tool_choice.name', /name/],
    [{ input: 'x', text: { format: { type: 'xml' } } }, 'text.format.type', /xml/],
    [{ input: 'x', text: { format: { type: 'json_schema', schema: {} } } }, 'text.format.name', /needs a name/],
    [{ input: 'x', reasoning: { effort: 'extreme' } }, 'reasoning.effort', /extreme/],
    [{ input: 'x', truncation: 'never' }, 'truncation', /never/],
    [{ input: 'x', background: true }, 'background', /not supported/],
    [{ input: 'x', tools: TOOLS }, 'tools', /does not render tools/],
  ];
  for (const [body, param, re] of cases) {
    await assert.rejects(client.responses.create({ model: 'strata-demo', ...body }),
      (e) => {
        assert.equal(e.status, 400, `${JSON.stringify(body)}: ${e.message}`);
        assert.equal(e.error?.param, param, `${JSON.stringify(body)}: ${e.message}`);
        assert.match(e.message, re);
        return true;
      });
  }
  await assert.rejects(client.responses.create({ model: 'gpt-9', input: 'x' }), (e) => e.status === 404 && /gpt-9/.test(e.message));
  // Streamed requests are refused the same way, before any event.
  await assert.rejects(async () => { for await (const _ of await client.responses.create({ model: 'strata-demo', input: 'x', stream: true, temperature: 9 })); },
    (e) => e.status === 400 && e.error.param === 'temperature');
});

test('scripted model: chat stream helper assembles tool calls streamed as deltas', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: TOOLS[0].parameters } }];
  const stream = sclient.chat.completions.stream({ model: 'scripted', messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools, max_tokens: 40, temperature: 0 });
  const toolDeltas = [];
  stream.on('chunk', (c) => { for (const t of c.choices[0]?.delta?.tool_calls ?? []) toolDeltas.push(t); });
  const final = await stream.finalChatCompletion();
  const msg = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, SCRIPTED_CALL.content);
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].type, 'function');
  assert.match(msg.tool_calls[0].id, /^call_/);
  assert.equal(msg.tool_calls[0].function.name, SCRIPTED_CALL.name);
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), SCRIPTED_CALL.arguments);
  // Incremental: the id and name once, first; the arguments in several pieces.
  assert.ok(toolDeltas.length >= 4, `${toolDeltas.length} tool-call deltas`);
  assert.equal(toolDeltas[0].id, msg.tool_calls[0].id);
  assert.equal(toolDeltas[0].function.name, SCRIPTED_CALL.name);
  assert.ok(toolDeltas.slice(1).every((t) => t.index === 0 && t.id === undefined && t.function.name === undefined));

  // The same request unstreamed: the same call, whole.
  const whole = await sclient.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools, max_tokens: 40, temperature: 0 });
  assert.equal(whole.choices[0].message.tool_calls[0].function.arguments, msg.tool_calls[0].function.arguments);
  // Without tools the model answers text.
  const plain = await sclient.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'hi' }], max_tokens: 20 });
  assert.equal(plain.choices[0].message.content, SCRIPTED_TEXT);
});

test('scripted model: responses.stream streams a function_call item, then continues with its output', async () => {
  const stream = sclient.responses.stream({ model: 'scripted', input: 'Weather in Paris?', tools: TOOLS, max_output_tokens: 40 });
  const argDeltas = [];
  stream.on('response.function_call_arguments.delta', (e) => argDeltas.push(e.delta));
  const { types, last } = await collect(stream);
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(types.includes('response.function_call_arguments.done'));
  const final = await stream.finalResponse();
  assert.deepEqual(final.output.map((o) => o.type), ['message', 'function_call']);
  assert.equal(final.output[0].content[0].text, SCRIPTED_CALL.content);
  const call = final.output[1];
  assert.equal(call.name, SCRIPTED_CALL.name);
  assert.match(call.call_id, /^call_/);
  assert.deepEqual(JSON.parse(call.arguments), SCRIPTED_CALL.arguments);
  assert.ok(argDeltas.length >= 3, `${argDeltas.length} argument deltas`);
  assert.equal(argDeltas.join(''), call.arguments);
  assert.equal(last.id, final.id);

  const next = await sclient.responses.create({ model: 'scripted', previous_response_id: final.id, tools: TOOLS,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '18 C' }], max_output_tokens: 40 });
  assert.equal(next.status, 'completed');
  assert.ok(next.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(next.usage));
});

test('scripted model: the Anthropic stream helper gets tool_use input as it is written', async () => {
  const anthropic = new Anthropic({ baseURL: scripted.url, apiKey: 'unused', maxRetries: 0 });
  const stream = anthropic.messages.stream({ model: 'scripted', max_tokens: 40, messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools: [{ name: 'get_weather', description: 'Weather of a city', input_schema: TOOLS[0].parameters }] });
  const pieces = [];
  stream.on('inputJson', (partial) => pieces.push(partial));
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  assert.deepEqual(final.content.map((b) => b.type), ['text', 'tool_use']);
  assert.equal(final.content[0].text, SCRIPTED_CALL.content);
  assert.equal(final.content[1].name, SCRIPTED_CALL.name);
  assert.match(final.content[1].id, /^toolu_/);
  assert.deepEqual(final.content[1].input, SCRIPTED_CALL.arguments);
  assert.ok(pieces.length >= 3, `${pieces.length} input_json_delta pieces`);
  assert.deepEqual(JSON.parse(pieces.join('')), SCRIPTED_CALL.arguments);
});
