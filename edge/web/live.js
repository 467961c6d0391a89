// The live view: what the server is doing, read from /stats and /health at each poll (views.js), with the
// last minutes of a few figures drawn as small SVG charts (no framework; SVG's presentation attributes, so the
// page's CSP needs no inline style).
"use strict";

const Live = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const KEEP = 120;  // Samples kept for the charts: three minutes at views.js's pace.
  const samples = [];  // {t, generated, rate, rows, kv}
  const FIGURES = [
    ["rate", "Tokens per second", true],
    ["rows", "Running · queued", true],
    ["kv", "KV memory held / budget", true],
    ["generated", "Tokens generated", false],
    ["cache", "Prompt-cache hits", false],
    ["speculation", "Speculation accepted", false],
    ["jump", "Jump-forward accepted", false],
  ];

  const pct = (part, whole) => (whole > 0 ? `${((100 * part) / whole).toFixed(0)}%` : "–");

  // Each loaded language model's /stats figures, by name: a fleet's `models`, or the one model's report.
  function engines(stats) {
    if (!stats.models) return stats.gateway ? [[stats.model, stats, 0]] : [];
    return Object.entries(stats.models).map(([name, m]) => [name, m.engine || null, m.waiting || 0]);
  }

  function sum(list, pick) {
    return list.reduce((total, item) => total + (pick(item) || 0), 0);
  }

  function figureBox(key, label, charted) {
    const box = document.createElement("div");
    box.className = "figure";
    box.dataset.figure = key;
    const name = document.createElement("span");
    name.className = "label";
    name.textContent = label;
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = "–";
    box.append(name, value);
    if (charted) {
      const chart = document.createElementNS(SVG, "svg");
      chart.setAttribute("viewBox", `0 0 ${KEEP} 40`);
      chart.setAttribute("preserveAspectRatio", "none");
      chart.setAttribute("role", "img");
      chart.setAttribute("aria-label", `${label}, the last ${KEEP} samples`);
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", "currentColor");
      line.setAttribute("stroke-width", "1.5");
      line.setAttribute("vector-effect", "non-scaling-stroke");
      chart.append(line);
      box.append(chart);
    }
    return box;
  }

  function draw(key) {
    const line = document.querySelector(`#live-figures [data-figure="${key}"] polyline`);
    const values = samples.map((sample) => sample[key]);
    const top = Math.max(1e-9, ...values);
    const start = KEEP - values.length;
    line.setAttribute("points", values.map((v, i) => `${start + i},${(38 - (36 * v) / top).toFixed(1)}`).join(" "));
  }

  function show(key, text) {
    document.querySelector(`#live-figures [data-figure="${key}"] .value`).textContent = text;
  }

  function record(loaded, waiting) {
    const now = performance.now();
    const generated = sum(loaded, (e) => e.gateway.generated_tokens);
    const last = samples.at(-1);
    // A model unloaded since the last sample takes its count with it: never a negative rate.
    const rate = last ? Math.max(0, generated - last.generated) / ((now - last.t) / 1000) : 0;
    const held = sum(loaded, (e) => e.gateway.kv_held_bytes);
    const budget = sum(loaded, (e) => e.gateway.kv_budget_bytes);
    const running = sum(loaded, (e) => e.gateway.active);
    const queued = sum(loaded, (e) => e.gateway.pending) + waiting;
    samples.push({ t: now, generated, rate, rows: running + queued, kv: budget ? held / budget : 0 });
    if (samples.length > KEEP) samples.shift();
    show("rate", rate.toFixed(1));
    show("rows", `${running} · ${queued}`);
    show("kv", `${Views.bytes(held)} / ${Views.bytes(budget)} (${pct(held, budget)})`);
    show("generated", String(generated));
  }

  function ratios(loaded) {
    const caches = loaded.map((e) => e.prompt_cache).filter(Boolean);
    const hits = sum(caches, (c) => c.hits);
    const asked = hits + sum(caches, (c) => c.misses);
    show("cache", asked ? `${hits} of ${asked} (${pct(hits, asked)}), ${sum(caches, (c) => c.cached_tokens)} tokens` : "none yet");
    const drafts = loaded.map((e) => e.gateway.speculation).filter(Boolean);
    const proposed = sum(drafts, (d) => d.proposed_tokens);
    const accepted = sum(drafts, (d) => d.accepted_tokens);
    show("speculation", drafts.length ? `${accepted} of ${proposed} (${pct(accepted, proposed)})` : "off");
    const jumps = loaded.map((e) => e.gateway.jump_forward).filter(Boolean);
    const forced = sum(jumps, (j) => j.forced_tokens);
    const kept = sum(jumps, (j) => j.accepted_tokens);
    show("jump", forced ? `${kept} of ${forced} (${pct(kept, forced)})` : "none yet");
  }

  function workerRows(stats, health) {
    const byName = Object.fromEntries(engines(stats).map(([name, engine, waiting]) => [name, { engine, waiting }]));
    const models = Array.isArray(health.models)
      ? health.models.map((m) => [m.id, m])
      : Object.entries(health.models || {});
    return models.map(([name, worker]) => {
      const { engine, waiting } = byName[name] || {};
      const row = document.createElement("tr");
      row.dataset.model = name;
      const process = worker.in_process ? "this process" : worker.pid ? `pid ${worker.pid}` : "–";
      for (const text of [
        name, worker.state, process, worker.restarts === undefined ? "–" : String(worker.restarts),
        engine ? String(engine.gateway.active) : "–", engine ? String(engine.gateway.pending + (waiting || 0)) : String(waiting || 0),
      ]) {
        const td = document.createElement("td");
        td.textContent = text;
        row.append(td);
      }
      return row;
    });
  }

  async function refresh(getJson) {
    const figures = $("live-figures");
    if (!figures.children.length) figures.append(...FIGURES.map(([key, label, charted]) => figureBox(key, label, charted)));
    const [stats, health] = await Promise.all([getJson("/stats"), getJson("/health")]);
    if (!stats || !health) return;
    const all = engines(stats);
    const loaded = all.map(([, engine]) => engine).filter(Boolean);
    record(loaded, sum(all, ([, , waiting]) => waiting));
    ratios(loaded);
    for (const [key, , charted] of FIGURES) if (charted) draw(key);
    Views.replaceRows($("live-workers").tBodies[0], workerRows(stats, health));
    $("live-status").textContent = `${loaded.length} model(s) loaded · updated ${new Date().toLocaleTimeString()}`;
  }

  return { refresh };
})();
