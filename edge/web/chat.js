// The chat page: talks to this server's own API from the browser; the server renders nothing of the chat.
// Model output is untrusted: it becomes HTML only through marked then DOMPurify, and the page's CSP
// forbids inline script besides.
"use strict";

const KEY_STORAGE = "mlx-relay.api-key";
const conversation = [];  // {role, content} in the browser only; "New chat" forgets it.
let running = null;  // The AbortController of the reply being streamed.

const $ = (id) => document.getElementById(id);

function headers() {
  const found = { "content-type": "application/json" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) found.authorization = `Bearer ${key}`;
  return found;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

function askForKey(message) {
  $("key-prompt").hidden = false;
  $("key-error").textContent = message || "";
  $("key").focus();
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (response.status === 401) {
    sessionStorage.removeItem(KEY_STORAGE);
    askForKey(sessionStorage.length === 0 ? await errorText(response) : "");
    return;
  }
  if (!response.ok) {
    setStatus(await errorText(response), true);
    return;
  }
  $("key-prompt").hidden = true;
  const select = $("model");
  select.replaceChildren();
  for (const model of (await response.json()).data) {
    const option = document.createElement("option");
    option.value = model.id;
    option.textContent = model.id;
    select.append(option);
  }
  setStatus(`${select.options.length} model(s)`);
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function renderMarkdown(element, text) {
  const html = marked.parse(text, { gfm: true, breaks: false });
  element.innerHTML = DOMPurify.sanitize(html, {
    FORBID_TAGS: ["img", "style", "form", "input", "button", "iframe", "svg", "math"],
    FORBID_ATTR: ["style"],
  });
}

function addMessage(role) {
  const box = document.createElement("div");
  box.className = `message ${role}`;
  box.dataset.role = role;
  $("conversation").append(box);
  return box;
}

function assistantBox() {
  const box = addMessage("assistant");
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  reasoning.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const reasoningBody = document.createElement("div");
  reasoningBody.className = "body";
  reasoning.append(summary, reasoningBody);
  const content = document.createElement("div");
  content.className = "content";
  const meta = document.createElement("div");
  meta.className = "meta";
  box.append(reasoning, content, meta);
  return { box, reasoning, reasoningBody, content, meta };
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...conversation);
  const body = { model: $("model").value, messages, stream: true, stream_options: { include_usage: true } };
  const temperature = parseFloat($("temperature").value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (!Number.isNaN(maxTokens)) body.max_tokens = maxTokens;
  return body;
}

// Each `data:` payload of an SSE body, as the bytes arrive.
async function* ssePayloads(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trimStart());
      if (data.length) yield data.join("\n");
    }
  }
}

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage("user").textContent = text;
  const view = assistantBox();
  running = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const started = performance.now();
  let firstToken = null;
  let chunks = 0;
  let answer = "";
  let reasoning = "";
  let usage = null;
  let pending = false;
  const paint = () => {
    pending = false;
    renderMarkdown(view.content, answer);
    view.reasoningBody.textContent = reasoning;
    view.reasoning.hidden = reasoning === "";
  };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: running.signal,
    });
    if (response.status === 401) askForKey(await errorText(response));
    if (!response.ok) throw new Error(await errorText(response));
    for await (const payload of ssePayloads(response)) {
      if (payload === "[DONE]") break;
      const chunk = JSON.parse(payload);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) continue;
      const thought = delta.reasoning_content || delta.reasoning || "";
      if (delta.content || thought) {
        if (firstToken === null) firstToken = performance.now();
        chunks += 1;
        answer += delta.content || "";
        reasoning += thought;
        if (!pending) {
          pending = true;
          requestAnimationFrame(paint);
        }
      }
    }
    view.meta.textContent = figures(started, firstToken, usage ? usage.completion_tokens : chunks);
  } catch (error) {
    if (error.name === "AbortError") {
      view.meta.textContent = `stopped. ${figures(started, firstToken, chunks)}`;
    } else {
      const line = document.createElement("p");
      line.className = "error";
      line.textContent = String(error.message || error);
      view.box.append(line);
    }
  } finally {
    paint();
    if (answer) conversation.push({ role: "assistant", content: answer });
    running = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

function figures(started, firstToken, tokens) {
  if (firstToken === null) return "no tokens";
  const elapsed = (performance.now() - firstToken) / 1000;
  const rate = elapsed > 0 && tokens > 1 ? ((tokens - 1) / elapsed).toFixed(1) : "–";
  return `${tokens} tokens · TTFT ${Math.round(firstToken - started)} ms · ${rate} tok/s`;
}

function init() {
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("rel", "noopener noreferrer nofollow");
      node.setAttribute("target", "_blank");
    }
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || running) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => running && running.abort());
  $("new-chat").addEventListener("click", () => {
    if (running) running.abort();
    conversation.length = 0;
    $("conversation").replaceChildren();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("key").value.trim());
    $("key").value = "";
    loadModels();
  });
  loadModels();
}

document.addEventListener("DOMContentLoaded", init);
