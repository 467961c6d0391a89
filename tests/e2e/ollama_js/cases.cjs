// The `ollama` npm package as its users call it, against the server at argv[2]. Each case's
// findings go out as one JSON object on stdout; tests/e2e/test_ollama_js.py asserts on them, so
// a failure there says which case and what came back. An exception is a failure of the whole run.
"use strict";

const { Ollama } = require("ollama");

const SCHEMA = {
  type: "object",
  properties: { city: { enum: ["Paris", "Rome"] } },
  required: ["city"],
  additionalProperties: false,
};
const PARIS = { city: "Paris" };
const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};

async function joined(stream, piece) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return { text: parts.map(piece).join(""), dones: parts.map((part) => part.done), last: parts[parts.length - 1] };
}

function done(part) {
  const keys = ["done_reason", "total_duration", "load_duration", "prompt_eval_count", "eval_count", "eval_duration"];
  return Object.fromEntries(keys.map((key) => [key, part[key]]));
}

async function chat(api) {
  const messages = [{ role: "user", content: "Hello" }];
  const request = { model: "tiny", messages, options: { num_predict: 5, seed: 1 } };
  const whole = await api.chat(request);
  const streamed = await joined(await api.chat({ ...request, stream: true }), (part) => part.message.content);
  const last = done(streamed.last);
  return { whole: whole.message.content, role: whole.message.role, done: done(whole), ...streamed, last };
}

async function generate(api) {
  const options = { num_predict: 4, temperature: 0 };
  const request = { model: "tiny", prompt: "Once upon", system: "Be brief.", options };
  const whole = await api.generate(request);
  const streamed = await joined(await api.generate({ ...request, stream: true }), (part) => part.response);
  return { whole: whole.response, done: done(whole), ...streamed, last: done(streamed.last) };
}

async function tools(api) {
  const question = [{ role: "user", content: "Weather in Paris?" }];
  const ask = { model: "tiny", messages: question, options: { num_predict: 8 } };
  const bare = await api.chat(ask);
  const first = await api.chat({ ...ask, tools: [WEATHER_TOOL] });
  // The history a caller sends back: the call and the tool's answer.
  const history = [
    { role: "user", content: "Weather?" },
    { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: PARIS } }] },
    { role: "tool", content: "sunny", tool_name: "get_weather" },
  ];
  const turn = { model: "tiny", tools: [WEATHER_TOOL], options: { num_predict: 3 } };
  const again = await api.chat({ ...turn, messages: history });
  const asked = await api.chat({ ...turn, messages: history.slice(0, 1) });
  return {
    calls: first.message.tool_calls || [],
    prompt_tokens: { bare: bare.prompt_eval_count, tools: first.prompt_eval_count },
    history_tokens: { asked: asked.prompt_eval_count, answered: again.prompt_eval_count },
  };
}

async function format(api) {
  const reply = await api.chat({
    model: "tiny",
    messages: [{ role: "user", content: "Where?" }],
    format: SCHEMA,
    options: { num_predict: 40 },
  });
  return { content: reply.message.content };
}

async function embeddings(api) {
  const embed = await api.embed({ model: "tiny", input: ["hello world", "the sea"] });
  const legacy = await api.embeddings({ model: "tiny", prompt: "hello world" });
  return { embeddings: embed.embeddings, prompt_eval_count: embed.prompt_eval_count, legacy: legacy.embedding };
}

async function models(api) {
  const listed = await api.list();
  const name = listed.models[0].model;
  const shown = await api.show({ model: name });
  const running = await api.ps();
  const version = await api.version();
  return {
    names: listed.models.map((model) => model.model),
    capabilities: shown.capabilities,
    format: shown.details.format,
    model_info_keys: Object.keys(shown.model_info || {}),
    running: running.models.map((row) => ({ expires_at: row.expires_at, context_length: row.context_length })),
    version: version.version,
  };
}

async function refusal(api) {
  try {
    await api.generate({ model: "tiny", prompt: "x", options: { mirostat: 2 } });
    return { refused: false };
  } catch (error) {
    return { refused: true, name: error.name, status_code: error.status_code, error: error.error };
  }
}

async function main() {
  const api = new Ollama({ host: process.argv[2] });
  const cases = { chat, generate, tools, format, embeddings, models, refusal };
  const found = {};
  for (const [name, run] of Object.entries(cases)) found[name] = await run(api);
  process.stdout.write(JSON.stringify(found));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
