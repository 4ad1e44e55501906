// Telescope UI: a single-page app over the inspector's JSON API (telescope_ui._app).
// Every page has a URL (#/r/<run>/<page>?...), so a link to a step, group or sample can be shared.
// Data from runs (prompts, completions, tool output, configs) is put into the page as text nodes
// only: this file never assigns innerHTML.
"use strict";

const PAGES = ["overview", "metrics", "rollouts", "discarded", "timeline", "infra", "evals"];
const $main = document.getElementById("main");
let refreshTimer = null;
let pageToken = 0; // bumped on every navigation: late answers of an old page are dropped

// ------------------------------------------------------------------ helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "onclick" || k === "onchange" || k === "oninput") node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// A count prints as a whole number; a value given `digits` is a real quantity and keeps them (a reward of 0 reads 0.0000).
function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (digits === undefined && Number.isInteger(v)) return v.toLocaleString("en");
    return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2) : v.toFixed(digits ?? 4);
  }
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function when(t) { return t ? new Date(t * 1000).toLocaleString() : "–"; }

// replaceChildren without the null, undefined and false that conditional parts leave
function put(node, ...kids) {
  node.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
}

function badge(text, cls) { return el("span", { class: `badge ${cls || text}` }, text); }

function showError(message) {
  const box = document.getElementById("error");
  box.hidden = !message;
  box.textContent = message || "";
}

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== "") query.set(k, v);
  const response = await fetch(`/api/${path}?${query}`);
  const body = await response.json().catch(() => ({ detail: response.statusText }));
  if (!response.ok) throw new Error(typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail));
  return body;
}

// the query is split off before anything is decoded: a search for "a&b" or "50%" stays whole
function route() {
  const hash = location.hash.slice(1) || "/";
  const cut = hash.indexOf("?");
  const path = cut < 0 ? hash : hash.slice(0, cut);
  const params = Object.fromEntries(new URLSearchParams(cut < 0 ? "" : hash.slice(cut + 1)));
  const m = path.match(/^\/r\/([^/]+)\/([a-z]+)$/);
  if (!m || !PAGES.includes(m[2])) return { run: null, page: "runs", params };
  try {
    return { run: decodeURIComponent(m[1]), page: m[2], params };
  } catch {
    return { run: null, page: "runs", params }; // a malformed link: the runs page
  }
}

function link(run, page, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return `#/r/${encodeURIComponent(run)}/${page}${s ? "?" + s : ""}`;
}

function go(run, page, params) { location.hash = link(run, page, params); }

// keyOf(row): the row's data-key (a step, group or sample id), for links and tests to find it
function table(columns, rowsData, onRow, selected, keyOf) {
  const head = el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : "" }, c.label)));
  const body = rowsData.map((r) => {
    const tr = el("tr", { class: (onRow ? "clickable " : "") + (selected && selected(r) ? "selected" : ""), "data-key": keyOf ? keyOf(r) : null },
      columns.map((c) => el("td", { class: c.num ? "num" : "" }, c.cell ? c.cell(r) : fmt(r[c.key]))));
    if (onRow) tr.addEventListener("click", () => onRow(r));
    return tr;
  });
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

function kv(obj, marked) {
  return el("table", { class: "kv" }, Object.entries(obj).map(([k, v]) =>
    el("tr", { class: marked && marked.has(k) ? "user-key" : "" }, el("td", {}, k + (marked && marked.has(k) ? " ★" : "")),
      el("td", {}, el("span", { class: "text" }, typeof v === "string" ? v : JSON.stringify(v, null, 1))))));
}

function ema(values, alpha) {
  if (!alpha) return values;
  let prev = null;
  return values.map((v) => {
    if (v === null || v === undefined) return prev;
    prev = prev === null ? v : alpha * prev + (1 - alpha) * v;
    return prev;
  });
}

const COLORS = ["#2457c5", "#c0392b", "#2e8b57", "#8e44ad", "#d4a017", "#16a085", "#e67e22", "#34495e"];

const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];

function axisLabel(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

function lineChart(title, xs, series, opts = {}) {
  const box = el("div", { class: "chart" }, el("div", { class: "title" }, title));
  const width = opts.width || 420;
  const plot = new uPlot({
    width, height: opts.height || 180,
    scales: { x: { time: !!opts.time } },
    legend: { show: series.length > 1 },
    series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: s.color || COLORS[i % COLORS.length],
      width: 1.5, spanGaps: true, fill: s.fill, dash: s.dash }))],
    bands: opts.bands,
    // steps are whole numbers; small values (a learning rate of 3e-5) keep their digits
    axes: [opts.time ? {} : { incrs: STEP_INCRS }, { size: 64, values: (u, ticks) => ticks.map(axisLabel) }],
  }, [xs, ...series.map((s) => s.values)], box);
  box.plot = plot;
  return box;
}

// ------------------------------------------------------------------ pages
async function pageRuns(token) {
  const runs = await api("runs");
  if (token !== pageToken) return;
  const cols = [
    { label: "run", cell: (r) => el("a", { href: link(r.name, "overview") }, r.name) },
    { label: "status", cell: (r) => badge(r.status) },
    { label: "step", cell: (r) => `${r.step}${r.total_steps ? " / " + r.total_steps : ""}` },
    { label: "ETA", cell: (r) => (r.eta_s ? duration(r.eta_s) : "–") },
    { label: "model", key: "model" },
    { label: "environments", cell: (r) => (r.environments || []).join(", ") },
    { label: "algorithm", key: "algorithm" },
    { label: "started", cell: (r) => when(r.started) },
  ];
  const a = el("select", {}, runs.map((r) => el("option", { value: r.name }, r.name)));
  const b = el("select", {}, runs.map((r) => el("option", { value: r.name }, r.name)));
  if (runs.length > 1) b.selectedIndex = 1;
  const diffOut = el("div");
  const compare = async () => {
    const diff = await api("diff", { a: a.value, b: b.value });
    put(diffOut, diff.length ? table([{ label: "key", key: "key" },
      { label: a.value, cell: (r) => fmt(r.a) }, { label: b.value, cell: (r) => fmt(r.b) }], diff)
      : el("p", { class: "muted" }, "the two configs are the same"));
  };
  put($main, 
    el("h2", {}, "Runs"),
    runs.length ? table(cols, runs) : el("p", { class: "muted" }, "No runs here yet: telescope train writes them under ./runs."),
    el("h3", {}, "Config diff"),
    el("div", { class: "toolbar" }, a, "vs", b, el("button", { onclick: compare }, "compare")),
    diffOut,
  );
}

async function pageOverview(run, params, token) {
  const [o, notes] = await Promise.all([api("overview", { run }), api("notes", { run })]);
  if (token !== pageToken) return;
  const users = new Set(o.user_keys || []);
  const onlyUser = el("input", { type: "checkbox", checked: params.all ? false : true });
  const configBox = el("div");
  const drawConfig = () => {
    const shown = Object.fromEntries(Object.entries(o.config || {}).filter(([k]) => !onlyUser.checked || users.has(k)));
    put(configBox, kv(shown, users));
  };
  onlyUser.addEventListener("change", drawConfig);
  drawConfig();
  const level = el("select", {}, ["debug", "info", "warning", "error"].map((l) => el("option", { value: l, selected: l === "info" }, l)));
  const logBox = el("div");
  const drawLogs = async () => {
    const lines = await api("logs", { run, level: level.value, lines: 200 });
    put(logBox, el("div", { class: "text" }, lines.map((e) =>
      `${e.timestamp || ""} [${e.level || e.log_level || ""}] ${e.event || ""} ${JSON.stringify(Object.fromEntries(Object.entries(e)
        .filter(([k]) => !["timestamp", "level", "log_level", "event"].includes(k))))}\n`).join("")));
  };
  level.addEventListener("change", drawLogs);
  put($main, 
    el("h2", {}, run, " ", badge(o.status)),
    o.reason && o.status !== "finished" ? el("p", {}, el("span", { class: "muted" }, "reason: "), o.reason) : null,
    kv({ step: `${o.step}${o.total_steps ? " / " + o.total_steps : ""}`, ETA: o.eta_s ? duration(o.eta_s) : "–",
      model: o.model, algorithm: o.algorithm, environments: (o.environments || []).join(", "),
      started: when(o.started), "last step": when(o.updated), attempts: (o.manifest.attempts || []).length }),
    el("h3", {}, "Environments"),
    table([{ label: "role", key: "role" }, { label: "name", key: "name" }, { label: "class", key: "class_name" },
      { label: "multi-turn", key: "multi_turn" }, { label: "prompts", key: "dataset_size", num: true },
      { label: "reward range", cell: (r) => `${fmt(r.reward_min)} .. ${fmt(r.reward_max)}` }], o.environment_rows || []),
    el("h3", {}, "Config ", el("label", { class: "muted" }, onlyUser, " only the keys you set (★)")),
    configBox,
    el("h3", {}, "Notes ", el("span", { class: "muted", id: "notes-state" })),
    notesBox(run, notes.text),
    el("h3", {}, "Log ", level),
    logBox,
  );
  await drawLogs();
}

// notes: the one thing the inspector writes, RUN/notes.md
function notesBox(run, text) {
  const area = el("textarea", { id: "notes", rows: 4, cols: 100, placeholder: "notes on this run (saved into its notes.md)" });
  area.value = text;
  const stateText = () => document.getElementById("notes-state");
  const save = async () => {
    const response = await fetch(`/api/notes?${new URLSearchParams({ run })}`, { method: "PUT", headers: { "X-Telescope-Notes": "1" }, body: area.value });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) { showError(body.detail || response.statusText); return; }
    stateText().textContent = "saved";
  };
  return el("div", {}, area, el("div", {}, el("button", { id: "save-notes", onclick: save }, "save notes")));
}

// metrics: every key of metrics.jsonl, grouped by its section (the part before the first "/")
const metricState = { run: null, count: 0, columns: {}, keys: [] };

async function loadMetrics(run) {
  if (metricState.run !== run) Object.assign(metricState, { run, count: 0, columns: {}, keys: [] });
  const since = metricState.count;
  let got = await api("metrics", { run, since });
  if (metricState.run !== run || metricState.count !== since) return 0; // another page or call won
  if (got.count < since) { // the file was rewritten (a resume): start over
    got = await api("metrics", { run, since: 0 });
    if (metricState.run !== run || metricState.count !== since) return 0;
    Object.assign(metricState, { count: 0, columns: {}, keys: [] });
  }
  const n = (got.columns.step || []).length;
  const before = (metricState.columns.step || []).length;
  for (const k of new Set([...metricState.keys, ...got.keys])) {
    const old = metricState.columns[k] || new Array(before).fill(null);
    metricState.columns[k] = old.concat(got.columns[k] || new Array(n).fill(null));
  }
  metricState.keys = Object.keys(metricState.columns).sort();
  metricState.count = got.count;
  return n;
}

async function pageMetrics(run, params, token) {
  await loadMetrics(run);
  const others = (await api("runs")).map((r) => r.name).filter((n) => n !== run);
  if (token !== pageToken) return;
  const filter = el("input", { type: "text", placeholder: "filter (e.g. reward, an environment)", value: params.filter || "" });
  const smooth = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: params.ema || 0 });
  const axis = el("select", {}, el("option", { value: "step" }, "step"), el("option", { value: "time", selected: params.x === "time" }, "wall clock"));
  const chosen = new Set((params.vs || "").split(",").filter(Boolean));
  const overlay = el("select", { id: "metrics-overlay", multiple: true, hidden: others.length === 0, size: Math.min(4, Math.max(2, others.length)), title: "runs to overlay (Ctrl-click for several)" },
    others.map((n) => el("option", { value: n, selected: chosen.has(n) }, n)));
  const envs = [...new Set(metricState.keys.map((k) => (k.match(/^reward\/(.+)\/mean$/) || [])[1]).filter(Boolean))];
  const env = el("select", { id: "metrics-env" }, el("option", { value: "" }, "every environment"), envs.map((e) => el("option", { value: `/${e}/` }, e)));
  env.addEventListener("change", () => { filter.value = env.value; });  // before draw (listeners run in order)
  const out = el("div");
  const draw = async () => {
    const picked = [...overlay.selectedOptions].map((o) => o.value);
    const vs = await Promise.all(picked.map(async (name) => ({ name, ...(await api("metrics", { run: name })) })));
    put(out, ...metricSections(filter.value, Number(smooth.value), axis.value, vs));
  };
  for (const input of [filter, smooth, axis, overlay, env]) input.addEventListener("change", draw);
  const last = el("span", { class: "muted", id: "metrics-last-step" });
  const showLast = () => { const s = metricState.columns.step || []; last.textContent = s.length ? `last step ${s[s.length - 1]}` : "no steps yet"; };
  showLast();
  put($main, el("h2", {}, "Metrics ", last), el("div", { class: "toolbar" }, filter, env, "EMA", smooth, "x:", axis, others.length ? "overlay:" : null, overlay),
    distributionCharts(), out);
  await draw();
  live(async () => {
    if ((await loadMetrics(run)) > 0 && token === pageToken) {
      showLast();
      await draw();
      document.getElementById("distributions").replaceWith(distributionCharts());
    }
  }, token);
}

function xsOf(columns, axis) {
  return axis === "time" ? columns.time || [] : columns.step || [];
}

function metricSections(filter, alpha, axis, others) {
  const cols = metricState.columns;
  const keys = metricState.keys.filter((k) => !["step", "time"].includes(k) && (!filter || k.includes(filter)));
  const sections = {};
  for (const k of keys) (sections[k.includes("/") ? k.split("/")[0] : "train"] ||= []).push(k);
  return Object.entries(sections).map(([name, ks], i) => {
    const box = el("details", { class: "metrics", open: i < 3 || !!filter }, el("summary", {}, `${name} (${ks.length})`));
    const grid = el("div", { class: "charts" });
    box.append(grid);
    const fill = () => {
      if (grid.childElementCount) return;
      for (const k of ks) {
        const runs = [{ label: metricState.run, xs: xsOf(cols, axis), values: ema(cols[k], alpha) }];
        for (const o of others) if (o.columns[k]) runs.push({ label: o.name, xs: xsOf(o.columns, axis), values: ema(o.columns[k], alpha) });
        const merged = mergeXs(runs);
        grid.append(lineChart(k, merged.xs, merged.series, { time: axis === "time" }));
      }
    };
    if (box.open) fill();
    box.addEventListener("toggle", fill);
    return box;
  });
}

// several runs on one x axis: the union of their xs, each run null where it has no point
function mergeXs(runs) {
  if (runs.length === 1) return { xs: runs[0].xs, series: runs };
  const xs = [...new Set(runs.flatMap((r) => r.xs))].sort((p, q) => p - q);
  const series = runs.map((r) => {
    const at = new Map(r.xs.map((x, i) => [x, i]));
    return { label: r.label, values: xs.map((x) => (at.has(x) ? r.values[at.get(x)] : null)) };
  });
  return { xs, series };
}

function distributionCharts() {
  const cols = metricState.columns;
  const xs = cols.step || [];
  const charts = ["reward", "advantage", "length_completion"].filter((n) => cols[`derived/${n}_mean`]).map((n) => {
    const mean = cols[`derived/${n}_mean`], std = cols[`derived/${n}_std`] || mean.map(() => 0);
    const up = mean.map((m, i) => (m === null ? null : m + (std[i] || 0)));
    const down = mean.map((m, i) => (m === null ? null : m - (std[i] || 0)));
    return lineChart(`${n} over steps: mean, ±1 std, min and max`, xs, [
      { label: "max", values: cols[`derived/${n}_max`] || mean, color: "#bbb", dash: [4, 4] },
      { label: "+std", values: up, color: "#9db4e8" },
      { label: "mean", values: mean, color: "#2457c5" },
      { label: "-std", values: down, color: "#9db4e8" },
      { label: "min", values: cols[`derived/${n}_min`] || mean, color: "#bbb", dash: [4, 4] },
    ], { bands: [{ series: [2, 4], fill: "rgba(36,87,197,0.12)" }] });
  });
  return el("div", { class: "charts", id: "distributions" }, charts);
}

// rollouts and discarded: step -> group -> sample
async function pageRollouts(run, params, token, kept) {
  const page = kept ? "rollouts" : "discarded";
  const steps = await api("steps", { run });
  if (token !== pageToken) return;
  const step = Number(params.step || (steps.length ? steps[steps.length - 1].step : 0));
  const stepCol = el("div", { class: "panel", id: "steps-panel" }, table([
    { label: "step", key: "step" },
    { label: "reward", cell: (r) => fmt(r["reward/mean"] ?? r["derived/reward_mean"], 3), num: true },
    { label: kept ? "kept" : "dropped", cell: (r) => fmt(kept ? r["groups/kept"] : (r["groups/discarded"] || 0) + (r["groups/cancelled"] || 0)), num: true },
  ], [...steps].reverse(), (r) => go(run, page, { step: r.step }), (r) => r.step === step, (r) => r.step));
  const header = [el("h2", {}, kept ? "Rollouts" : "Discarded and cancelled samples")];
  if (!kept) header.push(await discardedChart(run));
  if (token !== pageToken) return;
  const filters = filterBar(run, page, params, step);
  const groupCol = el("div", { class: "panel", id: "groups-panel" });
  const sampleCol = el("div", { class: "panel", id: "sample-panel" });
  put($main, ...header, filters, el("div", { class: "cols" }, stepCol, groupCol, sampleCol));
  if (!step) { groupCol.textContent = "no steps yet"; return; }
  const searching = params.q || params.env || params.tag || params.min_reward || params.max_reward;
  if (searching) {
    const found = await api("samples", { run, step, kept, q: params.q, env: params.env, tag: params.tag, min_reward: params.min_reward, max_reward: params.max_reward });
    put(groupCol, el("h3", {}, `${found.length} samples match at step ${step}`), sampleTable(run, page, params, found));
  } else {
    const groups = await api("groups", { run, step, kept });
    put(groupCol, el("h3", {}, `step ${step}: ${groups.length} groups`), table([
      { label: "group", key: "group_id" },
      { label: "env", key: "env" },
      kept ? { label: "reward", cell: (r) => `${fmt(r.reward_mean, 3)} (${fmt(r.reward_min, 2)}..${fmt(r.reward_max, 2)})` }
        : { label: "reason", cell: (r) => badge(r.reason || r.status, r.status) },
    ], groups, (r) => go(run, page, { step, group: r.group_id }), (r) => String(r.group_id) === params.group, (r) => r.group_id));
    if (params.group !== undefined) {
      const samples = await api("samples", { run, step, kept, group: params.group });
      groupCol.append(el("h3", {}, `group ${params.group}`), sampleTable(run, page, params, samples));
    }
  }
  if (params.sample !== undefined) await showSample(sampleCol, run, step, Number(params.sample), params.source || "train");
}

async function discardedChart(run) {
  const d = await api("discarded", { run });
  const series = Object.entries(d.reasons).map(([r, v]) => ({ label: r, values: v }));
  series.push({ label: "cancelled", values: d.cancelled });
  return el("div", { class: "charts" }, lineChart("dropped groups per step, by reason", d.steps, series));
}

function filterBar(run, page, params, step) {
  const q = el("input", { type: "text", placeholder: "search text", value: params.q || "" });
  const env = el("input", { type: "text", placeholder: "environment", value: params.env || "" });
  const tag = el("input", { type: "text", placeholder: "tag=value", value: params.tag || "" });
  const lo = el("input", { type: "number", placeholder: "min reward", step: "any", value: params.min_reward || "" });
  const hi = el("input", { type: "number", placeholder: "max reward", step: "any", value: params.max_reward || "" });
  const apply = () => go(run, page, { step, q: q.value, env: env.value, tag: tag.value, min_reward: lo.value, max_reward: hi.value });
  return el("div", { class: "toolbar" }, q, env, tag, lo, hi, el("button", { onclick: apply }, "filter"),
    el("button", { onclick: () => go(run, page, { step }) }, "clear"));
}

function sampleTable(run, page, params, samples) {
  return table([
    { label: "sample", key: "sample_id" },
    { label: "reward", cell: (r) => fmt(r.reward, 3), num: true },
    { label: "adv", cell: (r) => fmt(r.advantage, 3), num: true },
    { label: "tokens", key: "completion_tokens", num: true },
    { label: "", cell: (r) => (r.error ? badge(r.error, "failed") : r.status !== "kept" ? badge(r.reason || r.status, r.status) : "") },
  ], samples, (r) => go(run, page, { ...params, group: params.group ?? r.group_id, sample: r.sample_id }), (r) => String(r.sample_id) === params.sample, (r) => r.sample_id);
}

const render = { mode: localStorage.getItem("render") || "markdown", reasoning: localStorage.getItem("reasoning") !== "shown" };

async function showSample(box, run, step, id, source) {
  const s = await api("sample", { run, step, id, source });
  const modes = el("select", { id: "render-mode" }, ["markdown", "raw"].map((m) => el("option", { value: m, selected: m === render.mode }, m)));
  const think = el("input", { type: "checkbox", id: "fold-reasoning", checked: render.reasoning });
  const body = el("div");
  const draw = () => put(body, ...sampleBody(s));
  modes.addEventListener("change", () => { render.mode = modes.value; localStorage.setItem("render", modes.value); draw(); });
  think.addEventListener("change", () => { render.reasoning = think.checked; localStorage.setItem("reasoning", think.checked ? "folded" : "shown"); draw(); });
  put(box, 
    el("h3", { id: "sample-title" }, `sample ${s.sample_id} `, badge(s.status || "eval", s.status || "eval"), s.reason ? badge(s.reason, s.status) : null),
    el("div", { class: "toolbar" }, "render:", modes, el("label", {}, think, " fold reasoning")),
    body);
  draw();
}

function metricChip(name, value, ranges) {
  const r = ranges && ranges[name];
  let color = "#eee";
  if (r && typeof value === "number" && r.max > r.min) {
    let f = (value - r.min) / (r.max - r.min);
    if (r.invert) f = 1 - f;
    f = Math.max(0, Math.min(1, f));
    color = `hsl(${Math.round(120 * f)}, 60%, 80%)`;
  }
  return el("span", { class: "metric-chip", style: `background:${color}` }, `${name} ${fmt(value, 3)}`);
}

function sampleBody(s) {
  const ranges = s.environment && s.environment.metrics_ranges;
  const out = [
    el("div", { id: "sample-reward" }, el("b", {}, "reward "), fmt(s.reward, 4), "  ", el("b", {}, "advantage "), fmt(s.advantage, 4)),
    el("div", {}, Object.entries(s.metrics || {}).map(([k, v]) => metricChip(k, v, ranges))),
    kv({ env: s.env, group: s.group_id, "prompt index": s.sample_index, tokens: `${s.prompt_tokens} prompt, ${s.completion_tokens} completion (${s.model_tokens ?? "–"} by the model)`,
      "stop reason": s.stop_reason, truncated: s.truncated, versions: `${s.version_start} → ${s.version_end} (off-policy ${s.off_policy_steps ?? 0})`,
      server: s.server, timing: `queue ${fmt(s.queue_s, 2)} s, generation ${fmt(s.generation_s, 2)} s, reward ${fmt(s.reward_s, 3)} s`,
      ...(s.sequences > 1 ? { "training sequences": `${s.sequences} (${s.split_reasons || ""})` } : {}) }),
  ];
  if (s.error) out.push(el("h3", {}, "Error"), el("div", { class: "text" }, `${s.error}: ${s.error_detail || ""}`));
  if (Object.keys(s.golden_answers || {}).length) out.push(el("h3", {}, "Golden answers"), kv(s.golden_answers));
  if (Object.keys(s.tags || {}).length) out.push(el("h3", {}, "Tags"), kv(s.tags));
  if (s.system_prompt) out.push(el("h3", {}, "System prompt"), textBlock(s.system_prompt));
  out.push(el("h3", {}, "Prompt"), el("div", { class: "text", id: "sample-prompt" }, s.prompt || ""));
  out.push(el("h3", {}, "Turns"));
  const calls = s.tool_calls || [];
  const reasons = (s.split_reasons || "").split(",");
  let modelTurn = 0, segment = 0;
  for (const t of s.turns || []) {
    if ((t.segment || 0) !== segment) {  // an agent rewrote its history: a new training sequence
      segment = t.segment || 0;
      out.push(el("div", { class: "segment muted" }, `training sequence ${segment + 1} · ${reasons[segment - 1] || ""}`));
    }
    out.push(el("div", { class: `turn ${t.role}` }, el("div", { class: "muted" },
      `${t.role === "model" ? "model" : t.turn_type} · ${t.tokens} tokens` + (t.role === "model" ? ` · ${t.stop_reason || ""} · ${t.server || ""} · v${t.version_start}→${t.version_end}` : "")),
    textBlock(t.text || "")));
    if (t.role === "model") {
      for (const c of calls.filter((c) => c.turn_index === modelTurn)) out.push(toolCall(c));
      modelTurn += 1;
    }
  }
  if (!(s.turns || []).length) out.push(textBlock(s.completion || ""));
  if (s.info && (!Array.isArray(s.info) || s.info.length)) out.push(el("h3", {}, "Info"), el("div", { class: "text" }, JSON.stringify(s.info, null, 1)));
  if (s.trainer_input) out.push(el("details", {}, el("summary", {}, "trainer input (decoded)"), el("div", { class: "text" }, s.trainer_input)));
  if ((s.tokens || []).length) out.push(el("h3", {}, "Tokens"), tokenView(s.tokens));
  return out;
}

// The token table of a sample (docs/records.md, "tokens"): its completion, each token coloured by
// one of what the sampler, the trainer's loss, the teacher and the reference model made of it; the
// title of a token lists every value.
const TOKEN_COLOURS = {
  "sampler − trainer logprob": { of: (r, i) => (r.loss_mask[i] > 0 ? diff(r.sampler_logprob[i], r.trainer_logprob[i]) : null), scale: "mismatch" },
  "sampler logprob": { of: (r, i) => (r.version_start[i] === -1 ? null : r.sampler_logprob[i]), scale: "prob" },
  "trainer logprob": { of: (r, i) => r.trainer_logprob[i], scale: "prob" },
  "teacher logprob": { of: (r, i) => (r.teacher_logprob || [])[i], scale: "prob" },
  "teacher − sampler logprob": { of: (r, i) => (r.loss_mask[i] > 0 ? diff((r.teacher_logprob || [])[i], r.sampler_logprob[i]) : null), scale: "signed" },
  "reference logprob": { of: (r, i) => (r.ref_logprob || [])[i], scale: "prob" },
  advantage: { of: (r, i) => r.advantage[i], scale: "signed" },
  "loss mask": { of: (r, i) => r.loss_mask[i], scale: "mask" },
  "IS weight": { of: (r, i) => r.is_weight[i], scale: "weight" },
  clipped: { of: (r, i) => r.clipped[i], scale: "signed" },
  "weight version": { of: (r, i) => r.version_end[i], scale: "version" },
};
const tokenMode = { name: localStorage.getItem("token-colour") || "sampler − trainer logprob" };

function diff(a, b) { return a === null || a === undefined || b === null || b === undefined ? null : a - b; }

function tokenColour(scale, v, range) {
  if (v === null || v === undefined || Number.isNaN(v)) return "transparent";
  const clamp = (x) => Math.max(0, Math.min(1, x));
  if (scale === "prob") return `hsl(${Math.round(120 * clamp(Math.exp(v)))}, 70%, 80%)`;  // red unlikely, green likely
  if (scale === "mismatch") return `hsla(0, 80%, 55%, ${clamp(Math.abs(v))})`;  // |Δ| of 1 nat is full red
  if (scale === "signed") {
    const f = range > 0 ? clamp(Math.abs(v) / range) : 0;
    return v >= 0 ? `hsla(130, 60%, 45%, ${f})` : `hsla(0, 75%, 55%, ${f})`;
  }
  if (scale === "mask") return v > 0 ? "transparent" : "#d0d0d5";
  if (scale === "weight") return `hsla(35, 90%, 50%, ${clamp(Math.abs(v - 1))})`;
  return `hsla(${(210 + 47 * v) % 360}, 60%, 80%, 1)`;  // a hue per weight version
}

function tokenTitle(r, i) {
  const n = (x) => (x === null || x === undefined ? "–" : fmt(x, 4));
  const at = (list) => (list ? list[i] : null);
  return [`token ${r.token_ids[i]} ${JSON.stringify(r.token_text ? r.token_text[i] : "")}`,
    `sampler ${n(r.sampler_logprob[i])}  trainer ${n(r.trainer_logprob[i])}  Δ ${n(diff(r.sampler_logprob[i], r.trainer_logprob[i]))}`,
    `teacher ${n(at(r.teacher_logprob))}  reference ${n(at(r.ref_logprob))}`,
    `advantage ${n(r.advantage[i])}  loss mask ${n(r.loss_mask[i])}  IS weight ${n(r.is_weight[i])}  clipped ${n(r.clipped[i])}`,
    `weights v${r.version_start[i]}→v${r.version_end[i]}`].join("\n");
}

const TOKEN_LEGENDS = {
  mismatch: "red: how far apart the two logprobs are on the trained tokens (1 nat and more: full red)",
  prob: "red: unlikely, green: likely (the probability e^logprob)",
  signed: "green: positive, red: negative, the strongest in the sequence the deepest",
  mask: "grey: not in the loss",
  weight: "orange: the TIS weight away from 1",
  version: "a colour per weight version",
};

function tokenView(rowsData) {
  const pick = el("select", { id: "token-colour" }, Object.keys(TOKEN_COLOURS).map((k) => el("option", { value: k, selected: k === tokenMode.name }, k)));
  const legend = el("span", { class: "muted", id: "token-legend" });
  const body = el("div");
  const draw = () => {
    const mode = TOKEN_COLOURS[pick.value] || TOKEN_COLOURS["sampler − trainer logprob"];
    put(legend, TOKEN_LEGENDS[mode.scale] || "");
    put(body, ...rowsData.map((r) => {
      const values = r.token_ids.map((_, i) => mode.of(r, i));
      const range = Math.max(0, ...values.filter((v) => v !== null && v !== undefined).map(Math.abs));
      const trained = r.token_ids.map((_, i) => i).filter((i) => r.loss_mask[i] > 0);
      const gaps = trained.map((i) => diff(r.sampler_logprob[i], r.trainer_logprob[i])).filter((v) => v !== null);
      const worst = gaps.length ? Math.max(...gaps.map(Math.abs)) : null;
      return el("div", { class: "token-seq" },
        el("div", { class: "muted token-summary" }, `sequence ${r.sequence + 1} · ${r.token_ids.length} tokens, ${trained.length} trained · largest |sampler − trainer| ${worst === null ? "–" : fmt(worst, 4)}`),
        el("div", { class: "tokens text" }, r.token_ids.map((t, i) => el("span", {
          class: "tok", "data-i": String(i), title: tokenTitle(r, i),
          style: `background:${tokenColour(mode.scale, values[i], range)}`,
        }, r.token_text ? r.token_text[i] : `[${t}]`))));
    }));
  };
  pick.addEventListener("change", () => { tokenMode.name = pick.value; localStorage.setItem("token-colour", pick.value); draw(); });
  draw();
  return el("div", { id: "token-view" }, el("div", { class: "toolbar" }, "colour by:", pick, legend), body);
}

function toolCall(c) {
  return el("div", { class: `tool ${c.success ? "" : "failed"}` },
    el("div", { class: "muted" }, `tool ${c.name}` + (c.call_id ? ` (${c.call_id})` : "") + ` · ${c.success ? "ok" : "failed"}` + (c.exit_code !== null ? ` · exit ${c.exit_code}` : "") + ` · ${fmt(c.duration_s, 3)} s` + (c.sandbox ? ` · ${c.sandbox}` : "")),
    el("div", { class: "text" }, `arguments: ${c.arguments}`),
    c.error ? el("div", { class: "text" }, `error: ${c.error}`) : null,
    el("div", { class: "text" }, c.result || ""));
}

// Text from the model as DOM nodes: raw (one text block), or markdown-ish (paragraphs and fenced
// code); reasoning (<think>...</think>) folded when asked. Only text nodes: nothing is parsed as HTML.
function textBlock(text) {
  const parts = [];
  const re = /<think>([\s\S]*?)(<\/think>|$)/g;
  let last = 0, m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parts.push({ kind: "text", text: text.slice(last, m.index) });
    parts.push({ kind: "reasoning", text: m[1] });
    last = re.lastIndex;
    if (m[0].length === 0) break;
  }
  if (last < text.length) parts.push({ kind: "text", text: text.slice(last) });
  return el("div", { class: "rendered" }, parts.map((p) => {
    const inner = render.mode === "raw" ? el("div", { class: "text" }, p.kind === "reasoning" ? `<think>${p.text}</think>` : p.text) : markdown(p.text);
    if (p.kind !== "reasoning" || render.mode === "raw") return inner;
    return el("details", { class: "reasoning", open: !render.reasoning }, el("summary", {}, `reasoning (${p.text.length} chars)`), inner);
  }));
}

function markdown(text) {
  const box = el("div", { class: "md" });
  const chunks = text.split(/```/);
  chunks.forEach((chunk, i) => {
    if (i % 2 === 1) {
      const nl = chunk.indexOf("\n");
      box.append(el("pre", {}, el("code", {}, nl >= 0 ? chunk.slice(nl + 1) : chunk)));
    } else {
      for (const para of chunk.split(/\n{2,}/)) if (para.trim()) box.append(el("p", { class: "text" }, para));
    }
  });
  return box;
}

// timeline: one lane per server lane, then one row per trainer rank and span depth
const tl = { run: null, start: null, end: null, data: null, rects: [] };

async function pageTimeline(run, params, token) {
  tl.run = run;
  tl.start = params.start ? Number(params.start) : null;
  tl.end = params.end ? Number(params.end) : null;
  const canvas = el("canvas", { id: "timeline-canvas", height: 520 });
  const info = el("div", { class: "panel", id: "timeline-info" }, "click a bar for its details; wheel zooms, drag pans");
  put($main, el("h2", {}, "Timeline"), el("div", { class: "toolbar" },
    el("button", { onclick: () => go(run, "timeline", {}) }, "whole run"), el("span", { class: "muted", id: "timeline-range" })), canvas, info);
  await loadTimeline(token);
  bindTimeline(canvas, info);
}

async function loadTimeline(token) {
  const d = await api("timeline", { run: tl.run, start: tl.start, end: tl.end });
  if (token !== pageToken) return;
  tl.data = d;
  tl.start = d.start;
  tl.end = d.end;
  drawTimeline();
}

function drawTimeline() {
  const canvas = document.getElementById("timeline-canvas");
  const d = tl.data;
  if (!canvas || !d) return;
  const width = canvas.clientWidth || 1000;
  canvas.width = width;
  canvas.dataset.bars = String(d.bars.length);
  canvas.dataset.spans = String(d.spans.length);
  canvas.dataset.start = String(d.start ?? "");
  canvas.dataset.end = String(d.end ?? "");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, width, canvas.height);
  const empty = d.start == null || d.end == null;
  document.getElementById("timeline-range").textContent = empty ? "no events yet" : `${when(d.start)} + ${duration(d.end - d.start)}`;
  if (empty) return;
  const left = 170, span = Math.max(d.end - d.start, 1e-6);
  const x = (t) => left + ((t - d.start) / span) * (width - left - 10);
  const rows = [];
  const laneKey = (b) => `${b.server} · lane ${b.lane}`;
  const lanes = [...new Set(d.bars.map(laneKey))].sort();
  if (d.busy) for (const s of d.servers) rows.push({ label: s, kind: "busy", server: s });
  for (const l of lanes) rows.push({ label: l, kind: "lane", key: l });
  const ranks = [...new Set(d.spans.map((s) => `${s.rank}:${s.depth}`))].sort();
  for (const r of ranks) rows.push({ label: `rank ${r.split(":")[0]} · depth ${r.split(":")[1]}`, kind: "span", key: r });
  const rowH = Math.max(8, Math.min(22, (canvas.height - 30) / Math.max(rows.length, 1)));
  const y = new Map(rows.map((r, i) => [r.key || r.server, 20 + i * rowH]));
  ctx.font = "11px system-ui";
  rows.forEach((r, i) => { ctx.fillStyle = "#6e6e73"; ctx.fillText(String(r.label).slice(-28), 4, 20 + i * rowH + rowH * 0.7); });
  tl.rects = [];
  const colors = { kept: "#2e8b57", discarded: "#c0392b", cancelled: "#8e8e93", evaluated: "#8e44ad", running: "#d4a017" };
  for (const b of d.bars) {
    const x0 = x(b.started_at), x1 = Math.max(x(b.ended_at), x0 + 1), y0 = y.get(laneKey(b));
    ctx.fillStyle = b.source !== "train" ? colors.evaluated : colors[b.status] || "#999";
    ctx.fillRect(x0, y0 + 1, x1 - x0, rowH - 2);
    tl.rects.push({ x0, x1, y0, y1: y0 + rowH, kind: "generation", item: b });
  }
  if (d.busy) {
    const max = Math.max(1, ...d.busy.buckets.map((b) => b.n));
    for (const b of d.busy.buckets) {
      const t0 = d.start + b.bucket * d.busy.width;
      ctx.fillStyle = `rgba(36,87,197,${0.15 + 0.85 * (b.n / max)})`;
      ctx.fillRect(x(t0), y.get(b.server) + 1, Math.max(1, x(t0 + d.busy.width) - x(t0)), rowH - 2);
    }
  }
  for (const s of d.spans) {
    const x0 = x(s.started_at), x1 = Math.max(x(s.ended_at), x0 + 1), y0 = y.get(`${s.rank}:${s.depth}`);
    ctx.fillStyle = COLORS[s.depth % COLORS.length];
    ctx.fillRect(x0, y0 + 1, x1 - x0, rowH - 2);
    tl.rects.push({ x0, x1, y0, y1: y0 + rowH, kind: "span", item: s });
  }
  ctx.strokeStyle = "#8e44ad";
  for (const e of d.events.filter((e) => e.event === "weights_published" || e.event === "weights_updated")) {
    ctx.beginPath(); ctx.moveTo(x(e.time), 14); ctx.lineTo(x(e.time), canvas.height); ctx.stroke();
  }
  ctx.fillStyle = "#1d1d1f";
  for (const e of d.events) ctx.fillRect(x(e.time) - 1, 4, 3, 8);
}

function bindTimeline(canvas, info) {
  let dragFrom = null, moved = false;
  const token = pageToken;
  const refetch = debounce(() => {
    if (token !== pageToken) return;
    history.replaceState(null, "", link(tl.run, "timeline", { start: tl.start, end: tl.end }));
    loadTimeline(token).catch((e) => showError(e.message));
  }, 250);
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    if (!tl.data || tl.data.start == null) return; // nothing recorded yet: nothing to zoom
    const f = ev.deltaY > 0 ? 1.25 : 0.8, span = tl.end - tl.start;
    const at = tl.start + ((ev.offsetX - 170) / (canvas.clientWidth - 180)) * span;
    tl.start = at - (at - tl.start) * f; tl.end = at + (tl.end - at) * f;
    tl.data = { ...tl.data, start: tl.start, end: tl.end }; drawTimeline(); refetch();
  });
  canvas.addEventListener("mousedown", (ev) => { dragFrom = ev.offsetX; moved = false; });
  canvas.addEventListener("mousemove", (ev) => {
    if (dragFrom === null || !tl.data || tl.data.start == null) return;
    const dt = ((dragFrom - ev.offsetX) / (canvas.clientWidth - 180)) * (tl.end - tl.start);
    if (Math.abs(ev.offsetX - dragFrom) > 2) moved = true;
    dragFrom = ev.offsetX; tl.start += dt; tl.end += dt;
    tl.data = { ...tl.data, start: tl.start, end: tl.end }; drawTimeline();
  });
  canvas.addEventListener("mouseup", (ev) => {
    dragFrom = null;
    if (moved) { refetch(); return; }
    const hit = tl.rects.find((r) => ev.offsetX >= r.x0 && ev.offsetX <= r.x1 && ev.offsetY >= r.y0 && ev.offsetY <= r.y1);
    if (hit) put(info, ...timelineDetail(hit));
  });
}

function timelineDetail(hit) {
  const it = hit.item;
  if (hit.kind === "generation") {
    const page = it.status === "kept" ? "rollouts" : "discarded";
    return [el("h3", {}, `generation of sample ${it.sample_id} (${it.status})`),
      kv({ server: it.server, lane: it.lane, step: it.step, source: it.source, duration: duration(it.ended_at - it.started_at) }),
      it.source === "train" ? el("a", { href: link(tl.run, page, { step: it.step, sample: it.sample_id }) }, "open the sample") : null];
  }
  const children = tl.data.spans.filter((s) => s.rank === it.rank && s.depth === it.depth + 1 && s.started_at >= it.started_at && s.ended_at <= it.ended_at);
  const total = it.ended_at - it.started_at;
  const byName = {};
  for (const c of children) byName[c.name] = (byName[c.name] || 0) + (c.ended_at - c.started_at);
  return [el("h3", {}, `${it.name} on rank ${it.rank}, step ${it.step}: ${duration(total)}`),
    table([{ label: "part", key: "name" }, { label: "seconds", cell: (r) => fmt(r.s, 3), num: true }, { label: "share", cell: (r) => `${(100 * r.s / total).toFixed(1)}%`, num: true }],
      Object.entries(byName).map(([name, s]) => ({ name, s })))];
}

function debounce(fn, ms) { let t = null; return () => { clearTimeout(t); t = setTimeout(fn, ms); }; }

async function pageInfra(run, params, token) {
  const d = await api("infra", { run });
  if (token !== pageToken) return;
  const groups = {};
  for (const s of d.series) (groups[`${s.node} · ${s.source}${s.target ? " · " + s.target : ""}`] ||= []).push(s);
  const charts = Object.entries(groups).map(([title, list]) => {
    const wanted = list.filter((s) => !/cpu_core_\d+/.test(s.metric));
    return wanted.map((s) => lineChart(`${title}: ${s.metric}`, s.t, [{ label: s.metric, values: s.v }], { time: true }));
  }).flat();
  put($main, el("h2", {}, "Infrastructure"), el("div", { class: "charts" }, charts),
    el("h3", {}, "Setup"), table([{ label: "role", key: "role" }, { label: "node", key: "node" }, { label: "CPU", cell: (r) => `${r.cpu_model} (${r.cpu_cores} cores)` },
      { label: "memory GiB", cell: (r) => fmt(r.memory_gb, 1) }, { label: "GPUs", key: "gpus" }, { label: "python", key: "python" },
      { label: "versions", cell: (r) => Object.entries(r.versions || {}).map(([k, v]) => `${k} ${v}`).join(", ") }, { label: "commit", key: "git_commit" }], d.setup),
    el("h3", {}, "Model"), ...d.model.slice(-1).map((m) => el("div", {}, kv({ model: m.model, parameters: m.parameters, trainable: m.trainable_parameters, dtype: m.dtype, layers: m.num_layers, "layer types": m.layer_types }),
      el("details", {}, el("summary", {}, "architecture"), el("div", { class: "text" }, m.architecture)))));
}

async function pageEvals(run, params, token) {
  const list = await api("evals", { run });
  if (token !== pageToken) return;
  const keys = [...new Set(list.flatMap((e) => Object.keys(e)).filter((k) => k !== "step" && k !== "standalone"))].sort();
  const steps = list.map((e) => e.step);
  const charts = keys.map((k) => lineChart(k, steps, [{ label: k, values: list.map((e) => e[k] ?? null) }]));
  const step = params.step !== undefined ? Number(params.step) : steps.length ? steps[steps.length - 1] : null;
  const itemsBox = el("div");
  put($main, el("h2", {}, "Evals"), list.length ? el("div", { class: "charts" }, charts) : el("p", { class: "muted" }, "no evals in this run"),
    el("h3", {}, "Steps evaluated"), el("div", { class: "toolbar" }, [...new Set(steps)].map((s) => el("a", { href: link(run, "evals", { step: s }) }, `step ${s}`))), itemsBox);
  if (step === null) return;
  const items = await api("eval_items", { run, step, eval: params.eval });
  put(itemsBox, el("h3", {}, `step ${step}: ${items.length} items`), ...items.map((it) => el("details", { class: "panel" },
    el("summary", {}, `${it.eval} #${it.sample_index}: `, it.completions.map((c) => metricChip("", Object.values(c.metrics || {})[0] ?? null, null))),
    el("div", { class: "text" }, it.prompt || ""),
    it.completions.map((c) => el("div", { class: "turn" }, el("div", { class: "muted" }, `completion ${c.completion_idx} `, Object.entries(c.metrics || {}).map(([k, v]) => metricChip(k, v))), textBlock(c.completion || ""))))));
}

// ------------------------------------------------------------------ shell
// refresh a page every 2 s while it is the page shown (one call at a time: a chain of timeouts)
function live(fn, token) {
  if (token !== pageToken) return;
  clearTimeout(refreshTimer);
  document.getElementById("live").textContent = "live";
  const tick = async () => {
    if (token !== pageToken) return;
    try { await fn(); } catch (e) { showError(e.message); }
    if (token === pageToken) refreshTimer = setTimeout(tick, 2000);
  };
  refreshTimer = setTimeout(tick, 2000);
}

async function show() {
  clearTimeout(refreshTimer);
  document.getElementById("live").textContent = "";
  const token = ++pageToken;
  const { run, page, params } = route();
  document.getElementById("run-name").textContent = run || "";
  document.getElementById("tabs").replaceChildren(...(run ? PAGES.map((p) => el("a", { href: link(run, p), class: p === page ? "active" : "" }, p)) : []));
  showError("");
  try {
    if (page === "runs") await pageRuns(token);
    else if (page === "overview") await pageOverview(run, params, token);
    else if (page === "metrics") await pageMetrics(run, params, token);
    else if (page === "rollouts") await pageRollouts(run, params, token, true);
    else if (page === "discarded") await pageRollouts(run, params, token, false);
    else if (page === "timeline") await pageTimeline(run, params, token);
    else if (page === "infra") await pageInfra(run, params, token);
    else if (page === "evals") await pageEvals(run, params, token);
    document.body.dataset.ready = page;
  } catch (e) {
    if (token === pageToken) showError(e.message);
  }
}

window.addEventListener("hashchange", show);
window.addEventListener("resize", debounce(drawTimeline, 200));
show();
