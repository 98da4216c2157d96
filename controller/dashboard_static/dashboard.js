// Typhoon dashboard: polls GET /typhoon/dashboard (controller/dashboard.py) once a second
// and draws it with plain SVG; the buttons call the controller's REST API
// (controller/rest.py, controller/debugging/debug_rest.py) with the X-Typhoon-Token header.
// Every text from the server goes in through textContent, never as HTML.
"use strict";

const POLL_MS = 1000;
const HISTORY_S = 120; // seconds of throughput kept per node for the charts
const DEBUG_LAST = 5; // tuples shown per debug session
const HOST_COLORS = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2",
  "#4d7c0f", "#be185d"];
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  data: null,
  app: null, // the application shown
  history: new Map(), // "app/node" -> [[time, rate], ...]
  tuples: new Map(), // session id -> last records (read with the token)
  actionsKey: "", // what the actions panel was built for (rebuilt only when it changes)
  armedKill: null, // application whose kill button was pressed once
};

// ----- helpers ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const svg = ["svg", "g", "rect", "circle", "path", "text", "polyline", "polygon", "line",
    "title", "defs", "marker"].includes(tag);
  const e = svg ? document.createElementNS(SVG_NS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function replace(id, ...children) {
  const box = document.getElementById(id);
  box.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
  return box;
}

function fmtRate(x) {
  if (!x) return "0/s";
  if (x >= 1e6) return (x / 1e6).toFixed(2) + "M/s";
  if (x >= 1e3) return (x / 1e3).toFixed(1) + "k/s";
  return x.toFixed(0) + "/s";
}

function fmtTime(wall) {
  return wall ? new Date(wall * 1000).toLocaleTimeString() : "";
}

function token() {
  return sessionStorage.getItem("typhoon-token") || "";
}

async function api(method, path, body) {
  const headers = { "X-Typhoon-Token": token() };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch("/typhoon" + path, init);
  let payload = null;
  try {
    payload = await resp.json();
  } catch (e) {
    payload = { error: `not JSON (${resp.status})` };
  }
  return { status: resp.status, body: payload };
}

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c))))));
}

function hostColor(data, host) {
  const i = data.hosts.findIndex((h) => h.name === host);
  return HOST_COLORS[(i < 0 ? 0 : i) % HOST_COLORS.length];
}

function currentApp() {
  if (!state.data) return null;
  return state.data.apps.find((a) => a.name === state.app) || null;
}

function nodeRate(node) {
  return node.kind === "spout" ? node.rate_out : node.rate_in;
}

// ----- topology graph --------------------------------------------------------------------

const BOX_W = 190, COL_W = 340, PER_ROW = 4, CELL = 38, HEAD = 58, GAP = 28, PAD = 20;

function layout(app) {
  const columns = new Map();
  for (const n of app.nodes) {
    if (!columns.has(n.depth)) columns.set(n.depth, []);
    columns.get(n.depth).push(n);
  }
  const boxes = new Map();
  let height = 0;
  for (const [depth, nodes] of [...columns.entries()].sort((a, b) => a[0] - b[0])) {
    let y = PAD;
    for (const n of nodes) {
      const rows = Math.max(1, Math.ceil(n.workers.length / PER_ROW));
      const h = HEAD + rows * CELL;
      boxes.set(n.name, { x: PAD + depth * COL_W, y, w: BOX_W, h });
      y += h + GAP;
    }
    height = Math.max(height, y);
  }
  const width = PAD * 2 + Math.max(...app.nodes.map((n) => n.depth)) * COL_W + BOX_W;
  return { boxes, width, height: height - GAP + PAD };
}

function drawGraph(data, app) {
  const svg = document.getElementById("graph");
  const { boxes, width, height } = layout(app);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const maxRate = Math.max(1, ...app.streams.map((s) => s.rate));
  const parts = [el("defs", {}, el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9,
    refY: 5, markerWidth: 9, markerHeight: 9, markerUnits: "userSpaceOnUse",
    orient: "auto-start-reverse" },
  el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#64748b" })))];
  for (const s of app.streams) {
    const a = boxes.get(s.from), b = boxes.get(s.to);
    const x1 = a.x + a.w, y1 = a.y + a.h / 2, x2 = b.x - 2, y2 = b.y + b.h / 2;
    const mx = (x1 + x2) / 2, my = (y1 + y2) / 2;
    const width = 1.2 + 3.5 * Math.log1p(s.rate) / Math.log1p(maxRate);
    const label = `${s.policy}${s.fields.length ? "(" + s.fields.join(",") + ")" : ""} ` +
      fmtRate(s.rate);
    parts.push(el("g", { class: "edge", "data-stream": s.id, "data-rate": s.rate },
      el("path", { d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
        "stroke-width": width.toFixed(2), "marker-end": "url(#arrow)" }),
      el("rect", { class: "label-bg", x: mx - label.length * 3.2, y: my - 16,
        width: label.length * 6.4, height: 14, rx: 3 }),
      el("text", { x: mx, y: my - 5, "text-anchor": "middle" }, label),
      el("title", {}, `stream ${s.id} ${s.from} → ${s.to} (${s.name}): ${label}`)));
  }
  for (const n of app.nodes) {
    const box = boxes.get(n.name);
    const rate = nodeRate(n);
    const g = el("g", { class: "node", "data-node": n.name, "data-rate": rate },
      el("rect", { x: box.x, y: box.y, width: box.w, height: box.h, rx: 6 }),
      el("text", { class: "title", x: box.x + 10, y: box.y + 18 }, n.name),
      el("text", { class: "sub", x: box.x + 10, y: box.y + 33 },
        `${n.operator} ×${n.parallelism}${n.engine === "spark" ? " (spark)" : ""}`),
      el("text", { class: "rate", x: box.x + 10, y: box.y + 49 },
        `${n.kind === "spout" ? "out" : "in"} ${fmtRate(rate)}`));
    const workers = app.workers.filter((w) => w.node === n.name);
    workers.forEach((w, i) => {
      const cx = box.x + 24 + (i % PER_ROW) * 44;
      const cy = box.y + HEAD + Math.floor(i / PER_ROW) * CELL + 12;
      const live = w.state === "running" || w.state === "attached";
      g.append(el("g", {
        class: `worker${live ? "" : " down"}${w.role === "draining" ? " draining" : ""}`,
        "data-worker": w.worker, "data-node": w.node, "data-host": w.host,
        "data-state": w.state, "data-rate-in": w.rate_in, "data-rate-out": w.rate_out,
      },
      el("circle", { cx, cy, r: 14, fill: hostColor(data, w.host) }),
      el("text", { x: cx, y: cy + 3.5, "text-anchor": "middle" }, w.worker),
      el("title", {}, `worker ${w.worker} (${w.node}[${w.index}]) on ${w.host} port ${w.port}: ` +
        `${w.state}${w.role === "draining" ? ", draining" : ""}; in ${fmtRate(w.rate_in)}, ` +
        `out ${fmtRate(w.rate_out)}, queue ${w.queue ?? "?"}`)));
    });
    parts.push(g);
  }
  svg.replaceChildren(...parts);
}

function drawHosts(data, app) {
  const on = new Map();
  for (const w of app ? app.workers : []) on.set(w.host, (on.get(w.host) || 0) + 1);
  replace("hosts", ...data.hosts.map((h) => el("span", { class: "host", "data-host": h.name },
    el("span", { class: "swatch", style: `background:${hostColor(data, h.name)}` }),
    `${h.name}: ${on.get(h.name) || 0} worker(s)`,
    h.connected ? "" : el("span", { class: "bad" }, " (switch disconnected)"))));
}

// ----- throughput charts -------------------------------------------------------------------

function record(data) {
  for (const app of data.apps) {
    for (const n of app.nodes) {
      const key = `${app.name}/${n.name}`;
      if (!state.history.has(key)) state.history.set(key, []);
      const h = state.history.get(key);
      h.push([data.time, nodeRate(n)]);
      while (h.length && h[0][0] < data.time - HISTORY_S) h.shift();
    }
  }
}

function chart(app, node, now) {
  const W = 300, H = 90, L = 4, B = 14;
  const points = state.history.get(`${app.name}/${node.name}`) || [];
  const max = Math.max(1, ...points.map((p) => p[1]));
  const x = (t) => L + (W - L) * (1 - (now - t) / HISTORY_S);
  const y = (v) => H - B - (H - B - 6) * (v / max);
  const coords = points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
  const svg = el("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` },
    el("line", { class: "axis", x1: L, y1: H - B, x2: W, y2: H - B }),
    points.length > 1 ? el("polygon", { class: "area",
      points: `${x(points[0][0]).toFixed(1)},${H - B} ${coords} ` +
        `${x(points[points.length - 1][0]).toFixed(1)},${H - B}` }) : null,
    el("polyline", { points: coords }),
    el("text", { x: L + 2, y: 10 }, `max ${fmtRate(max)}`),
    el("text", { x: L, y: H - 2 }, `-${HISTORY_S}s`),
    el("text", { x: W - 2, y: H - 2, "text-anchor": "end" }, "now"));
  return el("div", { class: "chart", "data-node": node.name },
    el("div", { class: "head" }, el("b", {}, node.name),
      el("span", { class: "current" }, fmtRate(nodeRate(node)))), svg);
}

function drawCharts(data, app) {
  replace("charts", ...app.nodes.map((n) => chart(app, n, data.time)));
}

// ----- the apps' reports -------------------------------------------------------------------

function drawFaults(data) {
  if (data.faults === null) return replace("faults", el("p", { class: "muted" },
    "the fault detector is not loaded"));
  const mine = data.faults.filter((i) => i.app === state.app).reverse();
  if (!mine.length) return replace("faults", el("p", { class: "muted" }, "no incident"));
  const ms = (v) => (v === null || v === undefined ? "" : `${v} ms`);
  // a guaranteed recovery: which workers, to which checkpoint, how much was replayed
  const rollback = (i) => {
    if (!i.rollback && i.generation === null) return "";
    const replayed = Object.values(i.replayed || {}).reduce((a, b) => a + b, 0);
    const epoch = i.restore_epoch === null ? "the start" : `checkpoint ${i.restore_epoch}`;
    return `${i.rollback || "global"}: workers [${(i.rolled_back || []).join(", ")}] to ` +
      `${epoch}, ${replayed} tuples replayed`;
  };
  // the sinks downstream: back at 80% of their rate before (controller/sink_rates.py)
  const sinks = (i) => {
    if (i.sink_rate_before === null || i.sink_rate_before === undefined) return "";
    const back = i.back_at_80_ms === null ? "not yet" : ms(i.back_at_80_ms);
    return `${back} (${(i.sinks || []).join(", ")}: ${Math.round(i.sink_rate_before)}/s ` +
      `before, lowest ${Math.round(i.sink_rate_lowest)}/s)`;
  };
  replace("faults", table(["detected", "worker", "reason", "state", "rerouted", "replacement",
    "rollback", "sinks back at 80%"],
    mine.map((i) => [fmtTime(i.detected_wall), `${i.worker} (${i.node})`, i.reason,
      i.detail ? `${i.state}: ${i.detail}` : i.state, ms(i.reroute_ms),
      i.replacement === null ? "" : `${i.replacement} (${ms(i.rejoined_ms) || "joining"})`,
      rollback(i), sinks(i)])));
}

function drawAutoscaler(data) {
  if (data.autoscaler === null) return replace("autoscaler", el("p", { class: "muted" },
    "the autoscaler is not loaded"));
  const nodes = data.autoscaler[state.app] || {};
  if (!Object.keys(nodes).length) return replace("autoscaler", el("p", { class: "muted" },
    "no managed node"));
  const parts = [];
  for (const [node, r] of Object.entries(nodes)) {
    parts.push(el("p", {}, el("b", {}, node), ` parallelism ${r.parallelism}; signal: ` +
      `${r.signal || "none"}${r.cooldown_s ? `; cooldown ${r.cooldown_s} s` : ""}`));
    const rows = [...r.decisions].reverse().map((d) => [fmtTime(d.time), d.action,
      `${d.from} → ${d.to}`, d.reason, d.outcome]);
    parts.push(rows.length ? table(["time", "action", "workers", "why", "outcome"], rows)
      : el("p", { class: "muted" }, "no decision yet"));
  }
  replace("autoscaler", ...parts);
}

function drawLb(data) {
  if (data.lb === null) return replace("lb", el("p", { class: "muted" },
    "the load balancer is not loaded"));
  const nodes = data.lb[state.app] || {};
  if (!Object.keys(nodes).length) return replace("lb", el("p", { class: "muted" },
    "no balanced stream (grouping: sdn)"));
  const parts = [];
  for (const [node, r] of Object.entries(nodes)) {
    parts.push(el("p", {}, el("b", {}, node), ` ${r.summary || ""}`));
    const rows = [];
    const ids = new Set([...Object.keys(r.configured || {}), ...Object.keys(r.achieved || {})]);
    for (const w of ids) {
      const c = (r.configured || {})[w] || 0, a = (r.achieved || {})[w];
      rows.push(el("span", {}, `worker ${w}`),
        el("span", {},
          el("div", { class: "bar configured", style: `width:${(c * 100).toFixed(1)}%` }),
          el("div", { class: "bar achieved", style: `width:${((a || 0) * 100).toFixed(1)}%` })),
        el("span", {}, `${(c * 100).toFixed(0)}% / ${a === undefined ? "–" :
          (a * 100).toFixed(0) + "%"}`));
    }
    parts.push(el("div", { class: "split" }, ...rows));
  }
  parts.push(el("p", { class: "muted" }, "grey: configured (switch weights); blue: achieved"));
  replace("lb", ...parts);
}

async function readTuples(sessions) {
  if (!token()) return;
  for (const s of sessions) {
    const after = Math.max(0, s.received - DEBUG_LAST);
    const got = await api("GET", `/apps/${encodeURIComponent(s.app)}/debug/` +
      `${encodeURIComponent(s.session)}/tuples?after=${after}&limit=${DEBUG_LAST}`);
    state.tuples.set(s.session, got.status === 200 ? got.body.records
      : [{ error: got.body.error }]);
  }
}

// one line per tuple, as `typhoon debug` prints it (typhoon_cli/debug.py)
function formatRecord(r) {
  if (r.error) return r.error;
  if ("raw" in r) return `#${r.n} raw frame ${r.raw}`;
  const fields = r.fields || {};
  const shown = Object.entries(fields).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
  const extra = (r.values || []).slice(shown.length).map((v) => JSON.stringify(v));
  return `#${r.n} ${r.src_label || "?"} → ${r.dst_label || "?"} s${r.stream}: ` +
    [...shown, ...extra].join(" ");
}

function drawDebug(data) {
  if (data.debug === null) return replace("debug", el("p", { class: "muted" },
    "the live debugger is not loaded"));
  const mine = data.debug.filter((s) => s.app === state.app);
  if (!mine.length) return replace("debug", el("p", { class: "muted" },
    "no session: attach one from Actions"));
  const parts = [];
  for (const s of mine) {
    parts.push(el("div", { class: "actions-row", "data-session": s.session },
      el("b", {}, `session ${s.session}`),
      `worker ${s.worker} ${s.direction}, ${s.state}${s.reason ? ` (${s.reason})` : ""}, ` +
        `${s.received} tuple(s)${s.filter ? `, filter ${s.filter}` : ""}`,
      s.state === "ended" ? null : el("button", { onclick: () => act("detach " + s.session,
        "DELETE", `/apps/${encodeURIComponent(s.app)}/debug/${encodeURIComponent(s.session)}`) },
      "detach")));
    const recs = state.tuples.get(s.session);
    parts.push(el("div", { class: "tuples", "data-session": s.session }, !token() ? "enter the token to read tuples"
      : !recs || !recs.length ? "no tuple yet"
        : recs.map(formatRecord).join("\n")));
  }
  replace("debug", ...parts);
}

function drawReconfig(app) {
  const r = app.reconfig;
  if (!r) return replace("reconfig", el("span", { class: "muted" }, "none"));
  replace("reconfig", el("p", {}, `#${r.id} ${r.request}: `, el("b", {}, r.state),
    r.error ? el("span", { class: "bad" }, ` ${r.error}`) : ""));
}

// ----- actions ---------------------------------------------------------------------------

async function act(what, method, path, body) {
  const out = document.getElementById("action-result");
  if (!token()) {
    out.textContent = `${what}: enter the token first`;
    return;
  }
  out.textContent = `${what}…`;
  try {
    const got = await api(method, path, body);
    const ok = got.status >= 200 && got.status < 300;
    out.textContent = `${what}: ${got.status} ` +
      (ok ? JSON.stringify(got.body).slice(0, 300) : got.body.error);
    out.dataset.status = got.status;
  } catch (e) {
    out.textContent = `${what}: ${e}`;
  }
}

function drawActions(app) {
  const key = JSON.stringify([app.name, app.version, app.nodes.map((n) => n.parallelism),
    app.workers.map((w) => w.worker), state.armedKill]);
  if (key === state.actionsKey) return;
  state.actionsKey = key;
  const name = encodeURIComponent(app.name);
  const rows = [];
  for (const n of app.nodes) {
    const input = el("input", { type: "number", min: 1, max: 64, value: n.parallelism,
      "data-scale-node": n.name, "aria-label": `parallelism of ${n.name}` });
    rows.push(el("div", { class: "actions-row" }, el("span", { class: "what" }, n.name),
      input,
      el("button", { "data-action": "scale", "data-node": n.name, onclick: () => {
        const p = Number(input.value);
        act(`scale ${n.name} to ${p}`, "POST", `/apps/${name}/scale`,
          { node: n.name, parallelism: p });
      } }, "scale"), ...(n.kind === "spout" ? spoutControls(name, n.name) : [])));
  }
  const workerSelect = el("select", { id: "debug-worker" }, ...app.workers.map((w) =>
    el("option", { value: w.worker }, `${w.worker} (${w.node}[${w.index}] on ${w.host})`)));
  const direction = el("select", { id: "debug-direction" },
    ...["out", "in", "both"].map((d) => el("option", { value: d }, d)));
  rows.push(el("div", { class: "actions-row" }, el("span", { class: "what" }, "debugger"),
    workerSelect, direction,
    el("button", { "data-action": "attach", onclick: () => act(
      `attach debugger to worker ${workerSelect.value}`, "POST", `/apps/${name}/debug`,
      { worker: Number(workerSelect.value), direction: direction.value }) }, "attach")));
  const armed = state.armedKill === app.name;
  rows.push(el("div", { class: "actions-row" }, el("span", { class: "what" }, "application"),
    el("button", { class: "danger", "data-action": "kill", onclick: () => {
      if (!armed) {
        state.armedKill = app.name;
        render();
        return;
      }
      state.armedKill = null;
      act(`kill ${app.name}`, "DELETE", `/apps/${name}`);
    } }, armed ? `really kill ${app.name}?` : "kill application"),
    armed ? el("button", { onclick: () => { state.armedKill = null; render(); } }, "cancel")
      : null));
  replace("actions", ...rows);
}

// ----- the loop ----------------------------------------------------------------------------

function drawAppSelect(data) {
  const select = document.getElementById("app-select");
  const names = data.apps.map((a) => a.name);
  if (!names.includes(state.app)) state.app = names.length ? names[0] : null;
  const have = [...select.options].map((o) => o.value);
  if (JSON.stringify(have) !== JSON.stringify(names)) {
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  select.value = state.app || "";
}

function render() {
  const data = state.data;
  if (!data) return;
  drawAppSelect(data);
  const app = currentApp();
  drawHosts(data, app);
  if (!app) {
    document.getElementById("graph").replaceChildren();
    replace("app-state", "no application running");
    for (const id of ["charts", "actions", "faults", "autoscaler", "lb", "debug"]) replace(id);
    state.actionsKey = "";
    return;
  }
  const st = app.state || {};
  replace("app-state", `${app.name} v${app.version}, ${app.workers.length} worker(s)` +
    `${st.active ? ", active" : ""}${st.drain ? ", draining" : ""}`,
  app.problem ? el("span", { class: "bad" }, ` ${app.problem}`) : null);
  drawGraph(data, app);
  drawCharts(data, app);
  drawActions(app);
  drawReconfig(app);
  drawFaults(data);
  drawAutoscaler(data);
  drawLb(data);
  drawDebug(data);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const headers = token() ? { "X-Typhoon-Token": token() } : {};
    const resp = await fetch("/typhoon/dashboard", { cache: "no-store", headers });
    if (resp.status === 401 || resp.status === 403) { // a read token is set (controller/rest.py)
      status.textContent = token() ? "the token is wrong"
        : "this controller needs its read token: enter it above";
      status.classList.add("bad");
      setTimeout(poll, POLL_MS);
      return;
    }
    if (!resp.ok) throw new Error(`GET /typhoon/dashboard: ${resp.status}`);
    const data = await resp.json();
    state.data = data;
    record(data);
    if (data.debug) await readTuples(data.debug.filter((s) => s.app === state.app));
    render();
    status.textContent = `updated ${fmtTime(data.time)}`;
    status.classList.remove("bad");
  } catch (e) {
    status.textContent = `controller unreachable: ${e.message}`;
    status.classList.add("bad");
  }
  setTimeout(poll, POLL_MS);
}

function setToken(value) {
  if (value) sessionStorage.setItem("typhoon-token", value);
  else sessionStorage.removeItem("typhoon-token");
  document.getElementById("token-state").textContent = value ? "set" : "not set";
}

function start() {
  // The token is only ever typed in: a link's #token=... would let whoever wrote the link
  // choose the token (and so the controller) the page acts with.
  setToken(token());
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("token");
    setToken(input.value.trim());
    input.value = "";
  });
  document.getElementById("app-select").addEventListener("change", (ev) => {
    state.app = ev.target.value;
    state.actionsKey = "";
    render();
  });
  poll();
}

start();
