// Tool-call formats beyond Hermes, through the official openai client: a scripted model
// (lib/scripted_model.mjs) that writes its call in Qwen3-Coder's XML, detected from its chat
// template; the call's parameters stream as tool_calls deltas the chat stream helper assembles,
// typed by the request's tool schema. And reasoning_effort's bad values answer 400 naming it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, SOURCE } from './lib/server.mjs';
import { scriptedModel, SCRIPTED_XML_CALL, SCRIPTED_TEXT } from './lib/scripted_model.mjs';

let server, client;
const TOOLS = [{ type: 'function', function: { name: 'get_weather', parameters: {
  type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } } } }];
const ASK = [{ role: 'user', content: 'Weather in Paris?' }];

before(async () => {
  server = await startServer(['--model', scriptedModel(SOURCE, 'qwen3_coder'), '--served-model-name', 'scripted']);
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { assert.equal(await server.stop(), 0); });

test('Qwen3-Coder XML: the stream helper assembles typed arguments streamed per parameter', async () => {
  const stream = client.chat.completions.stream({ model: 'scripted', messages: ASK, tools: TOOLS, max_tokens: 40, temperature: 0 });
  const toolDeltas = [];
  stream.on('chunk', (c) => { for (const t of c.choices[0]?.delta?.tool_calls ?? []) toolDeltas.push(t); });
  const final = await stream.finalChatCompletion();
  const msg = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, SCRIPTED_XML_CALL.content);
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].function.name, SCRIPTED_XML_CALL.name);
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), SCRIPTED_XML_CALL.arguments);
  assert.ok(toolDeltas.length >= 3, `${toolDeltas.length} tool-call deltas`);
  assert.equal(toolDeltas[0].function.name, SCRIPTED_XML_CALL.name);
  assert.ok(toolDeltas.slice(1).every((t) => t.index === 0 && t.id === undefined));

  const whole = await client.chat.completions.create({ model: 'scripted', messages: ASK, tools: TOOLS, max_tokens: 40, temperature: 0 });
  assert.equal(whole.choices[0].message.tool_calls[0].function.arguments, msg.tool_calls[0].function.arguments);
  // Without the schema's integer, days stays the text the model wrote.
  const untyped = await client.chat.completions.create({ model: 'scripted', messages: ASK, max_tokens: 40, temperature: 0,
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }] });
  assert.deepEqual(JSON.parse(untyped.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris', days: '3' });
});

test('reasoning_effort: accepted values pass, others answer 400 naming the field', async () => {
  const ok = await client.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 20, reasoning_effort: 'low' });
  assert.equal(ok.choices[0].message.content, SCRIPTED_TEXT);
  await assert.rejects(
    client.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'hi' }], reasoning_effort: 'extreme' }),
    (e) => e.status === 400 && e.error.param === 'reasoning_effort' && /extreme/.test(e.error.message));
  await assert.rejects(
    client.responses.create({ model: 'scripted', input: 'hi', reasoning: { effort: 'max' } }),
    (e) => e.status === 400 && e.error.param === 'reasoning.effort' && /max/.test(e.error.message));
});
