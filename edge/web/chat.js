// The chat page: talks to this server's own API from the browser; the server renders nothing of the chat.
// Model output is untrusted: it becomes HTML only through marked then DOMPurify (code then highlighted by
// highlight.js, which escapes what it reads), and the page's CSP forbids inline script besides.
"use strict";

const KEY_STORAGE = "mlx-relay.api-key";
let chat = null;  // The conversation shown: {id, title, created, updated, model, messages}.
let cards = [];  // /v1/models' cards.
let running = null;  // The AbortController of the reply being streamed.

const $ = (id) => document.getElementById(id);

function headers(json = true) {
  const found = json ? { "content-type": "application/json" } : {};
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

const isSpeech = (card) => card.type === "speech-to-text";
const reads = (card, what) => Boolean(card && (card.input_modalities || []).includes(what));

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
  cards = (await response.json()).data;
  const select = $("model");
  select.replaceChildren();
  for (const card of cards.filter((card) => !isSpeech(card))) {
    const option = document.createElement("option");
    option.value = card.id;
    option.textContent = card.id;
    select.append(option);
  }
  $("mic").hidden = !cards.some(isSpeech);
  modelChosen();
  setStatus(`${select.options.length} model(s)`);
}

function modelChosen() {
  const card = cards.find((card) => card.id === $("model").value);
  // A fleet's card says what its model reads only once it is loaded: until then images are offered, and the
  // server refuses them by name if the model has no vision.
  $("attach").hidden = !card || (card.input_modalities !== undefined && !reads(card, "image"));
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function copyButton(label, text) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = label;
  button.setAttribute("aria-label", label === "Copy" ? "Copy message" : label);  // a name kept while it says "Copied"
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
    } catch (error) {
      button.textContent = "Copy failed";
      setStatus(`The clipboard refused the copy: ${error.message || error}`, true);
    }
    setTimeout(() => { button.textContent = label; }, 1500);
  });
  return button;
}

function renderMarkdown(element, text, final) {
  const html = marked.parse(text, { gfm: true, breaks: false });
  element.innerHTML = DOMPurify.sanitize(html, {
    FORBID_TAGS: ["img", "style", "form", "input", "button", "iframe", "svg", "math"],
    FORBID_ATTR: ["style"],
  });
  if (!final) return;
  for (const code of element.querySelectorAll("pre code")) {
    hljs.highlightElement(code);
    const source = code.textContent.replace(/\n$/, "");  // marked ends a block with a newline of its own.
    code.parentElement.before(copyButton("Copy code", () => source));
  }
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
  const calls = document.createElement("div");
  calls.className = "tool-calls";
  const meta = document.createElement("div");
  meta.className = "meta";
  const actions = document.createElement("div");
  actions.className = "actions";
  box.append(reasoning, content, calls, meta, actions);
  return { box, reasoning, reasoningBody, content, calls, meta, actions };
}

// The tool calls a reply asks for, shown as text: name and arguments (as JSON, indented where it parses).
// The page runs none of them.
function showToolCalls(element, calls) {
  element.replaceChildren(...calls.map((call) => {
    const box = document.createElement("div");
    box.className = "tool-call";
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = `Tool call: ${call.name}`;
    const args = document.createElement("pre");
    args.className = "arguments";
    try {
      args.textContent = JSON.stringify(JSON.parse(call.arguments), null, 2);
    } catch {
      args.textContent = call.arguments;  // still streaming, or not JSON: as sent
    }
    box.append(name, args);
    return box;
  }));
}

// A streamed `tool_calls` delta folded into the calls so far: the head names it, later pieces add arguments.
function addToolCallDelta(calls, deltas) {
  for (const piece of deltas) {
    const index = piece.index ?? calls.length;
    calls[index] = calls[index] || { name: "", arguments: "" };
    if (piece.function && piece.function.name) calls[index].name = piece.function.name;
    if (piece.function && piece.function.arguments) calls[index].arguments += piece.function.arguments;
  }
}

function actionButton(label, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = label;
  button.addEventListener("click", onClick);
  return button;
}

function showUser(message, index) {
  const box = addMessage("user");
  const text = document.createElement("div");
  text.className = "content";
  text.textContent = Store.text(message.content);
  box.append(text);
  if (typeof message.content !== "string") {
    const images = message.content.filter((part) => part.type === "image_url").map((part) => part.image_url.url);
    if (images.length) {
      const row = document.createElement("div");
      row.className = "thumbs";
      row.append(...images.map((url) => Media.thumbnail(url, null)));
      box.append(row);
    }
  }
  const actions = document.createElement("div");
  actions.className = "actions";
  actions.append(copyButton("Copy", () => Store.text(message.content)), actionButton("Edit", () => edit(index, box)));
  box.append(actions);
}

function showAssistant(message, index) {
  const view = assistantBox();
  renderMarkdown(view.content, message.content, true);
  view.reasoningBody.textContent = message.reasoning || "";
  view.reasoning.hidden = !message.reasoning;
  showToolCalls(view.calls, message.tool_calls || []);
  view.meta.textContent = message.meta || "";
  view.actions.append(copyButton("Copy", () => message.content));
  if (index === chat.messages.length - 1) view.actions.append(actionButton("Regenerate", regenerate));
}

function showChat() {
  $("conversation").replaceChildren();
  chat.messages.forEach((message, index) => (message.role === "user" ? showUser : showAssistant)(message, index));
}

// Edit a user turn in place; sending it drops every later turn and asks again from there.
function edit(index, box) {
  if (running) return;
  const message = chat.messages[index];
  const field = document.createElement("textarea");
  field.className = "edit";
  field.setAttribute("aria-label", "Edit message");
  field.value = Store.text(message.content);
  const save = actionButton("Send", () => {
    const text = field.value.trim();
    if (!text) return;
    const images = typeof message.content === "string" ? [] : message.content.filter((p) => p.type !== "text");
    chat.messages.splice(index);
    chat.messages.push({ role: "user", content: images.length ? [{ type: "text", text }, ...images] : text });
    showChat();
    generate();
  });
  const cancel = actionButton("Cancel", showChat);
  field.addEventListener("keydown", (event) => {
    if (event.key === "Escape") showChat();
  });
  box.replaceChildren(field, save, cancel);
  field.focus();
}

function regenerate() {
  if (running || chat.messages.at(-1)?.role !== "assistant") return;
  chat.messages.pop();
  showChat();
  generate();
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.messages.map(({ role, content }) => ({ role, content })));
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

function send(text) {
  const images = Media.take();
  const content = images.length
    ? [{ type: "text", text }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))]
    : text;
  chat.messages.push({ role: "user", content });
  if (chat.messages.length === 1) chat.title = text.slice(0, 60);
  showUser(chat.messages.at(-1), chat.messages.length - 1);
  generate();
}

async function generate() {
  const view = assistantBox();
  running = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const started = performance.now();
  let firstToken = null;
  let chunks = 0;
  let answer = "";
  let reasoning = "";
  const calls = [];
  let usage = null;
  let pending = false;
  let failed = false;
  const paint = (final = false) => {
    pending = false;
    renderMarkdown(view.content, answer, final);
    view.reasoningBody.textContent = reasoning;
    view.reasoning.hidden = reasoning === "";
    showToolCalls(view.calls, calls);
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
      if (delta.tool_calls) addToolCallDelta(calls, delta.tool_calls);
      if (delta.content || thought || delta.tool_calls) {
        if (firstToken === null) firstToken = performance.now();
        chunks += 1;
        answer += delta.content || "";
        reasoning += thought;
        if (!pending) {
          pending = true;
          requestAnimationFrame(() => paint());
        }
      }
    }
    view.meta.textContent = figures(started, firstToken, usage ? usage.completion_tokens : chunks);
  } catch (error) {
    if (error.name === "AbortError") {
      view.meta.textContent = `stopped. ${figures(started, firstToken, chunks)}`;
    } else {
      failed = true;
      const line = document.createElement("p");
      line.className = "error";
      line.textContent = String(error.message || error);
      view.box.append(line);
    }
  } finally {
    paint(true);
    running = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
  const said = answer || reasoning || calls.length;
  if (said) {
    const message = { role: "assistant", content: answer, reasoning, meta: view.meta.textContent };
    if (calls.length) message.tool_calls = calls.filter(Boolean);
    chat.messages.push(message);
  }
  await saveChat();
  // Redrawn with the reply's actions; a failed or empty reply keeps its box, saying why, until the next turn.
  if (!failed && said) showChat();
}

function figures(started, firstToken, tokens) {
  if (firstToken === null) return "no tokens";
  const elapsed = (performance.now() - firstToken) / 1000;
  const rate = elapsed > 0 && tokens > 1 ? ((tokens - 1) / elapsed).toFixed(1) : "–";
  return `${tokens} tokens · TTFT ${Math.round(firstToken - started)} ms · ${rate} tok/s`;
}

function newChat() {
  const now = Date.now();
  return { id: crypto.randomUUID(), title: "New chat", created: now, updated: now, messages: [] };
}

async function saveChat() {
  if (!chat.messages.length) return;
  chat.updated = Date.now();
  chat.model = $("model").value;
  await Store.put(chat);
  await listChats();
}

async function listChats() {
  const list = $("chats");
  const items = (await Store.all()).map((saved) => {
    const item = document.createElement("li");
    item.classList.toggle("current", saved.id === chat.id);
    const open = actionButton(saved.title, () => openChat(saved));
    open.className = "open";
    open.setAttribute("aria-current", String(saved.id === chat.id));
    const rename = actionButton("Rename", async () => {
      const title = prompt("Rename the conversation", saved.title);
      if (!title || !title.trim()) return;
      saved.title = title.trim();
      if (saved.id === chat.id) chat.title = saved.title;
      await Store.put(saved);
      await listChats();
    });
    const remove = actionButton("Delete", async () => {
      if (!confirm(`Delete "${saved.title}"?`)) return;
      await Store.remove(saved.id);
      if (saved.id === chat.id) startChat();
      await listChats();
    });
    rename.setAttribute("aria-label", `Rename ${saved.title}`);
    remove.setAttribute("aria-label", `Delete ${saved.title}`);
    item.append(open, rename, remove);
    return item;
  });
  list.replaceChildren(...items);
}

function openChat(saved) {
  if (running) running.abort();
  chat = saved;
  if ([...$("model").options].some((option) => option.value === saved.model)) $("model").value = saved.model;
  modelChosen();
  showChat();
  listChats();
}

function startChat() {
  if (running) running.abort();
  chat = newChat();
  Media.take();
  $("conversation").replaceChildren();
  listChats();
}

async function dictate() {
  const mic = $("mic");
  if (mic.getAttribute("aria-pressed") === "true") {
    Media.stopRecording();
    return;
  }
  const speech = cards.find(isSpeech);
  try {
    const recorded = Media.startRecording();
    mic.setAttribute("aria-pressed", "true");
    mic.textContent = "Stop mic";
    setStatus("Recording… press the button again to stop.");
    const audio = await Media.wav(await recorded);
    mic.setAttribute("aria-pressed", "false");
    mic.textContent = "Mic";
    setStatus("Transcribing…");
    const form = new FormData();
    form.append("file", audio, "speech.wav");
    form.append("model", speech.id);
    const response = await fetch("/v1/audio/transcriptions", { method: "POST", headers: headers(false), body: form });
    if (!response.ok) throw new Error(await errorText(response));
    const text = (await response.json()).text.trim();
    $("prompt").value = [$("prompt").value.trim(), text].filter(Boolean).join(" ");
    setStatus(`Transcribed ${audio.size} bytes of audio.`);
    $("prompt").focus();
  } catch (error) {
    mic.setAttribute("aria-pressed", "false");
    mic.textContent = "Mic";
    setStatus(String(error.message || error), true);
  }
}

function imagesFrom(transfer) {
  const files = [...(transfer ? transfer.files : [])].filter((file) => file.type.startsWith("image/"));
  return $("attach").hidden ? [] : files;
}

function wireComposer() {
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
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && running) running.abort();
  });
  $("stop").addEventListener("click", () => running && running.abort());
  $("attach").addEventListener("click", () => $("image-input").click());
  $("image-input").addEventListener("change", async () => {
    await Media.add($("image-input").files);
    $("image-input").value = "";
  });
  $("prompt").addEventListener("paste", (event) => {
    const files = imagesFrom(event.clipboardData);
    if (files.length) {
      event.preventDefault();
      Media.add(files);
    }
  });
  document.addEventListener("dragover", (event) => event.preventDefault());
  document.addEventListener("drop", (event) => {
    event.preventDefault();
    Media.add(imagesFrom(event.dataTransfer));
  });
  $("mic").addEventListener("click", dictate);
  $("model").addEventListener("change", modelChosen);
}

function init() {
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("rel", "noopener noreferrer nofollow");
      node.setAttribute("target", "_blank");
    }
  });
  wireComposer();
  Views.init();
  $("new-chat").addEventListener("click", startChat);
  $("export-md").addEventListener("click", () => Store.exportAs(chat, "md"));
  $("export-json").addEventListener("click", () => Store.exportAs(chat, "json"));
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("key").value.trim());
    $("key").value = "";
    loadModels();
    Views.keyGiven();
  });
  startChat();
  loadModels();
}

document.addEventListener("DOMContentLoaded", init);
