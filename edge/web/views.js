// The page's other views beside the chat: the models (state, memory, load, unload, drain) and the live view
// (live.js). Each polls the server while it is shown and the tab is visible, and stops when either ends.
// The admin routes need the API key: a 401 asks for it (chat.js's prompt) and retries the action once given.
"use strict";

const Views = (() => {
  const POLL_MS = 1500;
  let shown = "chat";
  let timer = null;
  let generation = 0;  // Each start of polling; an older loop's tick ends at its next turn.
  let pendingAction = null;  // The admin action a 401 stopped, retried once a key is given.

  const bytes = (n) => {
    if (n === undefined || n === null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let size = n;
    let unit = 0;
    while (size >= 1024 && unit < units.length - 1) {
      size /= 1024;
      unit += 1;
    }
    return `${size.toFixed(unit ? 1 : 0)} ${units[unit]}`;
  };

  async function getJson(path) {
    const response = await fetch(path, { headers: headers() });
    if (response.status === 401) {
      askForKey(await errorText(response));
      return null;
    }
    // /health answers 503 with its body while a model is unavailable: still worth showing.
    if (!response.ok && response.status !== 503) throw new Error(await errorText(response));
    return response.json();
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function stateText(card, health) {
    const state = card.state || (health && health.state) || "unknown";
    if (state !== "loading" || !card.loading) return state;
    return `loading (${card.loading.phase}, ${Math.round(card.loading.elapsed_s || 0)} s)`;
  }

  function defaultsText(defaults) {
    const pairs = Object.entries(defaults || {});
    return pairs.length ? pairs.map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ") : "–";
  }

  function ttlText(card) {
    if (card.pinned) return "pinned";
    if (!card.ttl) return "none";
    return card.ttl_left === undefined ? `${card.ttl} s when loaded` : `${Math.round(card.ttl_left)} s`;
  }

  // Memory: a fleet's planned footprint of the model (weights and its KV), else the one model's weights.
  function memoryText(name, stats) {
    if (stats.models) {
      const footprint = stats.models[name] && stats.models[name].footprint;
      return footprint ? bytes(footprint.bytes) : "not placed yet";
    }
    return stats.admission ? `${bytes(stats.admission.weights_bytes)} weights` : "–";
  }

  async function admin(name, verb) {
    const run = async () => {
      $("models-status").textContent = `${verb} ${name}…`;
      const response = await fetch(`/admin/models/${name.split("/").map(encodeURIComponent).join("/")}/${verb}`, {
        method: "POST", headers: headers(), body: "{}",
      });
      if (response.status === 401) {
        pendingAction = run;
        askForKey(await errorText(response));
        $("models-status").textContent = `${verb} ${name}: the server asks for an API key.`;
        return;
      }
      if (!response.ok) throw new Error(await errorText(response));
      const card = await response.json();
      $("models-status").textContent = `${verb} ${name}: ${card.state || "done"}.`;
      await refreshModels();
    };
    try {
      await run();
    } catch (error) {
      $("models-status").textContent = `${verb} ${name} failed: ${error.message || error}`;
    }
  }

  function modelRow(card, stats, health) {
    const row = document.createElement("tr");
    row.dataset.model = card.id;
    const state = stateText(card, health);
    const actions = document.createElement("td");
    for (const [label, verb] of [["Load", "load"], ["Unload", "unload"], ["Drain", "drain"]]) {
      const button = actionButton(label, () => admin(card.id, verb));
      button.setAttribute("aria-label", `${label} ${card.id}`);
      actions.append(button);
    }
    row.append(
      cell(card.id, "name"), cell(state, `state state-${state.split(" ")[0]}`), cell(memoryText(card.id, stats)),
      cell(card.context_window ? `${card.context_window} tokens` : "–"), cell(defaultsText(card.defaults)),
      cell(ttlText(card)), actions,
    );
    return row;
  }

  async function refreshModels() {
    const [models, stats, health] = await Promise.all([getJson("/v1/models"), getJson("/stats"), getJson("/health")]);
    if (!models || !stats || !health) return;
    // Aliases and adapters name the model they run on (`parent`): one row per configured model.
    const own = models.data.filter((card) => !card.parent);
    const healthOf = (name) => (Array.isArray(health.models) ? health.models.find((m) => m.id === name) : health.models[name]);
    replaceRows($("models-table").tBodies[0], own.map((card) => modelRow(card, stats, healthOf(card.id))));
  }

  // Rows are replaced only when what they say changed, so a focused button keeps its focus between polls.
  function replaceRows(body, rows) {
    const said = (list) => list.map((row) => `${row.dataset.model}:${row.textContent}`).join("\n");
    if (said([...body.rows]) !== said(rows)) body.replaceChildren(...rows);
  }

  const refreshers = { models: refreshModels, live: () => Live.refresh(getJson) };

  async function tick(started) {
    timer = null;
    const refresh = refreshers[shown];
    if (started !== generation || !refresh || document.visibilityState !== "visible") return;
    try {
      await refresh();
    } catch (error) {
      $(`${shown}-status`).textContent = String(error.message || error);
    }
    if (started === generation && document.visibilityState === "visible") timer = setTimeout(tick, POLL_MS, started);
  }

  function stop() {
    generation += 1;
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  function poll() {
    stop();
    tick(generation);
  }

  function show(name) {
    shown = name;
    for (const view of ["chat", "models", "live"]) {
      $(`${view}-view`).hidden = view !== name;
      $(`tab-${view}`).setAttribute("aria-selected", String(view === name));
    }
    poll();
  }

  // The key prompt was answered: refresh what is shown and retry the action a 401 stopped.
  function keyGiven() {
    const action = pendingAction;
    pendingAction = null;
    if (action) action().catch((error) => { $("models-status").textContent = String(error.message || error); });
    else poll();
  }

  function init() {
    for (const view of ["chat", "models", "live"]) $(`tab-${view}`).addEventListener("click", () => show(view));
    // A hidden tab asks nothing of the server; polling resumes when it is shown again.
    document.addEventListener("visibilitychange", () => (document.visibilityState === "visible" ? poll() : stop()));
  }

  return { init, keyGiven, bytes, replaceRows };
})();
