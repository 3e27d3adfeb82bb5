// vlora-va live dashboard: one EventSource (/events), a snapshot then one update a second for all streams.
// Charts are drawn on <canvas> here; nothing is loaded from elsewhere.
"use strict";

const PALETTE = ["#58a6ff", "#e3b341", "#3fb950", "#f778ba", "#79c0ff", "#ffa657", "#a5d6ff", "#d2a8ff"];
const COLORS = { ok: "#3fb950", late: "#d29922", shed: "#f85149", error: "#a371f7" };
const RECENT = 8;
const EVENTS = 20;  // events listed, all streams together (the server holds as many)
const LINE_COLOR = "#ffd33d", ZONE_COLOR = "#58c4ff";

const state = { historyS: 120, offset: 0, streams: new Map(), system: null, sysHistory: [], modes: new Map(),
  lastEvent: 0 };

function $(sel, root = document) { return root.querySelector(sel); }
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function serverNow() { return Date.now() / 1000 + state.offset; }
function fmt(v, digits = 0) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }
// "k3x9a-4" -> "4": a track's number within the daemon's run (the full id is in the rows and the events' titles)
function shortTrack(id) { const t = String(id); return t.slice(t.lastIndexOf("-") + 1); }
function colorOf(name) {
  let h = 0;
  for (const c of String(name)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

// ------------------------------------------------------------------ canvas helpers
function sized(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(canvas.clientWidth * dpr)), h = Math.max(1, Math.round(canvas.clientHeight * dpr));
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, canvas.clientWidth, canvas.clientHeight);
  return { ctx, w: canvas.clientWidth, h: canvas.clientHeight };
}

function axis(ctx, w, h) {
  ctx.strokeStyle = "#2a3340"; ctx.lineWidth = 1;
  ctx.beginPath(); ctx.moveTo(0, h - 0.5); ctx.lineTo(w, h - 0.5); ctx.stroke();
}

// The scale's top value, over whatever was drawn (drawn last, on its own background).
function scale(ctx, text, right = false, w = 0, color = "#8a96a6", top = 1) {
  ctx.font = "10px system-ui, sans-serif"; ctx.textBaseline = "top";
  const tw = ctx.measureText(text).width + 6, x = right ? w - tw - 2 : 2;
  ctx.fillStyle = "rgba(17, 21, 28, .85)"; ctx.fillRect(x, top, tw, 13);
  ctx.fillStyle = color; ctx.fillText(text, x + 3, top + 1);
}

// Latency of every row over the window: one colour per task, dashed deadlines, shed/error as crosses on top.
function drawLatency(canvas, s) {
  const { ctx, w, h } = sized(canvas);
  const now = serverNow(), t0 = now - state.historyS;
  const pts = s.points.filter(p => p[1] >= t0);
  // Scaled to the latencies; a deadline far above them (more than twice) is named instead of drawn.
  let top = Math.max(100, ...pts.filter(p => p[3] === "ok" || p[3] === "late").map(p => p[4] * 1.2));
  for (const t of s.tasks) if (t.deadline_ms <= 2 * top) top = Math.max(top, t.deadline_ms * 1.1);
  const x = t => (t - t0) / state.historyS * w, y = v => h - 4 - Math.min(v, top) / top * (h - 14);
  axis(ctx, w, h);
  ctx.setLineDash([4, 3]);
  const offScale = [];
  for (const t of s.tasks) {
    if (t.deadline_ms > top) { offScale.push(t.deadline_ms); continue; }
    ctx.strokeStyle = colorOf(t.name); ctx.globalAlpha = 0.6;
    ctx.beginPath(); ctx.moveTo(0, y(t.deadline_ms)); ctx.lineTo(w, y(t.deadline_ms)); ctx.stroke();
  }
  ctx.setLineDash([]); ctx.globalAlpha = 1;
  const byTask = new Map();
  for (const p of pts) {
    if (p[3] !== "ok" && p[3] !== "late") continue;
    if (!byTask.has(p[2])) byTask.set(p[2], []);
    byTask.get(p[2]).push(p);
  }
  for (const [task, list] of byTask) {
    ctx.strokeStyle = ctx.fillStyle = colorOf(task); ctx.lineWidth = 1.2;
    ctx.beginPath();
    list.forEach((p, i) => (i ? ctx.lineTo(x(p[1]), y(p[4])) : ctx.moveTo(x(p[1]), y(p[4]))));
    ctx.stroke();
    for (const p of list) {
      ctx.fillStyle = p[3] === "late" ? COLORS.late : colorOf(task);
      ctx.fillRect(x(p[1]) - 1.5, y(p[4]) - 1.5, 3, 3);
    }
  }
  for (const p of pts) {
    if (p[3] !== "shed" && p[3] !== "error") continue;
    const px = x(p[1]), py = 10;
    ctx.strokeStyle = COLORS[p[3]]; ctx.lineWidth = 1.5;
    ctx.beginPath(); ctx.moveTo(px - 3, py - 3); ctx.lineTo(px + 3, py + 3); ctx.moveTo(px + 3, py - 3); ctx.lineTo(px - 3, py + 3); ctx.stroke();
  }
  scale(ctx, `${Math.round(top)} ms`);
  if (offScale.length) {  // bottom right: the top row is where shed rows are marked
    scale(ctx, `deadline ${[...new Set(offScale)].map(d => d / 1000).join(" / ")} s ↑`, true, w, "#8a96a6", h - 15);
  }
  canvas.dataset.points = String(pts.length);
}

// Rows per second by outcome, stacked bars (in deadline, late, shed, error).
function drawOutcomes(canvas, s) {
  const { ctx, w, h } = sized(canvas);
  const now = serverNow(), n = Math.round(state.historyS), t0 = Math.floor(now) - n + 1;
  const bins = Array.from({ length: n }, () => ({ ok: 0, late: 0, shed: 0, error: 0 }));
  for (const p of s.points) {
    const i = Math.floor(p[1]) - t0;
    if (i >= 0 && i < n) bins[i][p[3]] += 1;
  }
  const top = Math.max(2, ...bins.map(b => b.ok + b.late + b.shed + b.error));
  axis(ctx, w, h);
  const bw = w / n;
  bins.forEach((b, i) => {
    let base = h - 1;
    for (const k of ["ok", "late", "shed", "error"]) {
      if (!b[k]) continue;
      const bh = b[k] / top * (h - 14);
      ctx.fillStyle = COLORS[k];
      ctx.fillRect(i * bw + 0.5, base - bh, Math.max(1, bw - 1), bh);
      base -= bh;
    }
  });
  scale(ctx, `${top}/s`);
}

// A label on its own dark background, its left end at (x, y) (text baseline at the bottom).
function tag(ctx, text, x, y, color) {
  const tw = ctx.measureText(text).width + 6;
  ctx.fillStyle = "rgba(0, 0, 0, .6)"; ctx.fillRect(x, y - 13, tw, 14);
  ctx.fillStyle = color; ctx.fillText(text, x + 3, y - 1);
}

// The stream's zones (filled outlines) and lines (with an arrow to their `in` side: the walker's right, for
// someone walking the line from its first point to its second), given in original-frame pixels and mapped to
// canvas pixels by P. Returns how many of each were drawn.
function drawScene(ctx, s, P) {
  ctx.lineWidth = 2;
  for (const z of s.zones) {
    ctx.beginPath();
    z.points.forEach((p, i) => (i ? ctx.lineTo(...P(p)) : ctx.moveTo(...P(p))));
    ctx.closePath();
    ctx.fillStyle = "rgba(88, 196, 255, .15)"; ctx.fill();
    ctx.strokeStyle = ZONE_COLOR; ctx.stroke();
    const [x, y] = P(z.points.reduce((a, p) => (p[1] < a[1] ? p : a)));  // the name at the topmost corner
    tag(ctx, z.name, x, y + 14, ZONE_COLOR);
  }
  for (const l of s.lines) {
    const [a, b] = l.points.map(P), len = Math.hypot(b[0] - a[0], b[1] - a[1]) || 1;
    const nx = -(b[1] - a[1]) / len, ny = (b[0] - a[0]) / len;  // towards the `in` side
    const mx = (a[0] + b[0]) / 2, my = (a[1] + b[1]) / 2, tx = mx + nx * 22, ty = my + ny * 22;
    ctx.strokeStyle = ctx.fillStyle = LINE_COLOR;
    ctx.beginPath(); ctx.moveTo(...a); ctx.lineTo(...b); ctx.moveTo(mx, my); ctx.lineTo(tx, ty); ctx.stroke();
    ctx.beginPath();  // the arrow's head
    ctx.moveTo(tx + nx * 6, ty + ny * 6); ctx.lineTo(tx - ny * 5, ty + nx * 5); ctx.lineTo(tx + ny * 5, ty - nx * 5);
    ctx.closePath(); ctx.fill();
    ctx.fillText("in", tx + nx * 15 - 5, ty + ny * 15 + 6);  // beyond the tip, about centred
    tag(ctx, l.name, mx - nx * 12 + 2, my - ny * 12, LINE_COLOR);
  }
  return { lines: s.lines.length, zones: s.zones.length };
}

// A frame with the stream's lines and zones and its boxes (in the frame's own pixels) drawn over it.
function drawFrame(s) {
  const canvas = s.el.frame, f = s.frame;
  if (!f || !s.img || !s.img.complete) return;
  const { ctx, w, h } = sized(canvas);
  const k = Math.min(w / f.width, h / f.height), ox = (w - f.width * k) / 2, oy = (h - f.height * k) / 2;
  ctx.drawImage(s.img, ox, oy, f.width * k, f.height * k);
  ctx.font = "600 11px system-ui, sans-serif"; ctx.textBaseline = "bottom";
  const m = (f.scale || 0) * k;  // canvas pixels per original-frame pixel
  const scene = m ? drawScene(ctx, s, p => [ox + p[0] * m, oy + p[1] * m]) : { lines: 0, zones: 0 };
  ctx.lineWidth = 2;
  let tracks = 0;
  for (const b of f.boxes) {
    const [x1, y1, x2, y2] = b.box.map((v, i) => (i % 2 ? oy : ox) + v * k);
    const c = colorOf(b.label);
    ctx.strokeStyle = c; ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
    if (b.track) tracks += 1;
    const text = `${b.label} ${b.score.toFixed(2)}${b.track ? ` #${shortTrack(b.track)}` : ""}`;
    const tw = ctx.measureText(text).width + 6;
    const ty = y1 > 14 ? y1 : y1 + 14, tx = Math.max(0, Math.min(x1 - 1, w - tw));  // the label stays in view
    ctx.fillStyle = c; ctx.fillRect(tx, ty - 14, tw, 14);
    ctx.fillStyle = "#000"; ctx.fillText(text, tx + 3, ty - 1);
  }
  canvas.dataset.version = String(f.version);
  canvas.dataset.chunk = String(f.chunk);
  canvas.dataset.boxes = String(f.boxes.length);
  canvas.dataset.tracks = String(tracks);
  canvas.dataset.lines = String(scene.lines);
  canvas.dataset.zones = String(scene.zones);
  s.el.noFrame.hidden = true;
}

// ------------------------------------------------------------------ streams
function card(info) {
  const node = $("#stream-card").content.firstElementChild.cloneNode(true);
  node.dataset.stream = info.id;
  $(".sid", node).textContent = info.id;
  $(".src", node).textContent = info.source || "";
  const s = {
    id: info.id, tasks: info.tasks || [], lines: info.lines || [], zones: info.zones || [], points: [], recent: [],
    frame: null, img: null, el: {
      root: node, frame: $(".frame", node), activity: $(".activity", node), noFrame: $(".no-frame", node),
      counters: $(".counters", node), scene: $(".scene-counts", node), latency: $(".latency", node),
      outcomes: $(".outcomes", node),
      recent: $(".recent", node), chunk: $(".chunk", node), legend: $(".legend.tasks", node),
    },
  };
  s.legendTasks = new Set();
  for (const t of s.tasks) legend(s, t.name, `${t.name} (${t.adapter}, ${t.deadline_ms} ms)`);
  $("#streams").append(node);
  state.streams.set(info.id, s);
  return s;
}

function legend(s, task, text) {
  if (s.legendTasks.has(task)) return;
  s.legendTasks.add(task);
  const i = el("i"); i.style.background = colorOf(task);
  s.el.legend.append(i, text);
}

function mergeStream(info, fresh) {
  let s = state.streams.get(info.id);
  if (!s) s = card(info);
  if (fresh) { s.points = []; s.recent = []; }
  const last = s.points.length ? s.points[s.points.length - 1][0] : 0;
  for (const p of info.points || []) {
    if (p[0] <= last) continue;
    s.points.push(p);
    legend(s, p[2], p[2]);  // a task the configuration did not name (another ingest)
  }
  const cut = serverNow() - state.historyS - 5;
  while (s.points.length && s.points[0][1] < cut) s.points.shift();
  const lastRow = s.recent.length ? s.recent[s.recent.length - 1].seq : 0;
  for (const r of info.recent || []) if (r.seq > lastRow) s.recent.push(r);
  s.recent = s.recent.slice(-RECENT);
  s.counts = info.counts || s.counts;
  s.info = info;
  if (info.frame && (!s.frame || info.frame.version > s.frame.version)) {
    const img = new Image();
    img.onload = () => { s.frame = info.frame; s.img = img; drawFrame(s); };
    img.src = info.frame.jpeg;
  }
  renderStream(s);
}

function renderStream(s) {
  const info = s.info || {}, c = s.counts || { ok: 0, late: 0, shed: 0, error: 0 };
  const total = c.ok + c.late + c.shed + c.error;
  const ing = ((state.system || {}).ingest || {})[s.id] || {};  // what ingest last reported for this stream
  const outages = `${info.outages ?? 0}${info.outage_s ? ` (${info.outage_s} s)` : ""}`;
  s.el.counters.replaceChildren(
    ...[["in deadline", c.ok, "st-ok"], ["late", c.late, "st-late"], ["shed", c.shed, "st-shed"],
      ["errors", c.error, "st-error"], ["ingest drops", ing.dropped ?? info.ingest_dropped ?? 0, ""],
      ["reconnects", ing.reconnects ?? 0, ""], ["outages", outages, ""]]
      .map(([k, v, cls]) => { const span = el("span", "", `${k} `); span.append(el("b", cls, String(v))); return span; }),
    el("span", "muted", total ? `${fmt(100 * c.ok / total, 0)}% in deadline` : ""));
  s.el.chunk.textContent = info.last_chunk >= 0 ? ` · chunk ${info.last_chunk}` : "";
  const a = info.activity;
  s.el.activity.textContent = a ? `${a.label} ${fmt(a.score, 2)}${a.untrained ? " (untrained)" : ""}` : "";
  renderScene(s);
  s.el.recent.replaceChildren(...s.recent.slice().reverse().map(r => {
    const li = el("li");
    li.append(el("span", `st-${r.status}`, `${r.status.padEnd(5)} `), `#${r.chunk} ${r.task} ${Math.round(r.ms)} ms · ${r.text}`);
    li.title = li.textContent;
    return li;
  }));
  drawLatency(s.el.latency, s);
  drawOutcomes(s.el.outcomes, s);
}

// Running totals of the stream's lines (in / out by class) and zones (inside now, entered, left), from the
// counts its last event of each carried; a rule with no event yet shows 0.
function byClass(m) {
  const list = Object.entries(m || {}).filter(([, n]) => n).map(([c, n]) => `${c} ${n}`);
  return list.length ? list.join(", ") : "0";
}
function sum(m) { return Object.values(m || {}).reduce((a, n) => a + n, 0); }
function renderScene(s) {
  const info = s.info || {}, lc = info.line_counts || {}, zc = info.zone_counts || {};
  const names = (configured, held) => [...new Set([...configured.map(r => r.name), ...Object.keys(held)])];
  const items = [];
  for (const name of names(s.lines, lc)) {
    const c = (lc[name] || {}).counts || {}, li = el("li");
    li.dataset.line = name;
    li.append(el("b", "line-name", name), ` in ${byClass(c.in)} · out ${byClass(c.out)}`);
    items.push(li);
  }
  for (const name of names(s.zones, zc)) {
    const c = (zc[name] || {}).counts || {}, li = el("li");
    li.dataset.zone = name;
    const part = k => `${sum(c[k])}${sum(c[k]) ? ` (${byClass(c[k])})` : ""}`;
    li.append(el("b", "zone-name", name),
      ` inside ${part("inside")} · entered ${part("entered")} · left ${part("left")}`);
    items.push(li);
  }
  s.el.scene.replaceChildren(...items);
}

// ------------------------------------------------------------------ events (all streams, newest first)
function eventRow(e) {
  const tr = el("tr");
  tr.dataset.event = e.event; tr.dataset.seq = String(e.seq);
  const when = new Date(e.t * 1000).toLocaleTimeString([], { hour12: false });
  const track = el("td", "", e.track ? `#${shortTrack(e.track)}` : "");
  if (e.track) track.title = e.track;
  tr.append(el("td", "", when), el("td", "", e.stream), el("td", "", e.phase ? `${e.event} (${e.phase})` : e.event),
    el("td", "", e.rule ? `${e.kind} ${e.rule}` : ""), el("td", "", e.direction || ""), track,
    el("td", "", e.class || ""));
  tr.title = `media time ${fmt(e.ts, 1)} s`;
  const snap = el("td", "snap");
  if (e.snapshot) {
    const a = el("a"), img = el("img");
    a.href = e.snapshot; a.target = "_blank"; a.rel = "noopener";
    img.src = e.snapshot; img.alt = `snapshot: ${e.event}`; img.loading = "lazy";
    img.onerror = () => a.remove();  // deleted since (snapshots.max_mb / max_age_s)
    a.append(img); snap.append(a);
  }
  tr.append(snap);
  return tr;
}

function mergeEvents(list, fresh) {
  const body = $("#event-list tbody");
  if (fresh) { body.replaceChildren(); state.lastEvent = 0; }
  for (const e of list || []) {
    if (e.seq <= state.lastEvent) continue;  // a snapshot and the next update can both carry an event
    state.lastEvent = e.seq;
    body.prepend(eventRow(e));  // kept, not rebuilt: its snapshot loads once
  }
  while (body.rows.length > EVENTS) body.deleteRow(-1);
  $("#no-events").hidden = body.rows.length > 0;
}

// ------------------------------------------------------------------ system
function renderSystem() {
  const sys = state.system;
  if (!sys) return;
  const lb = sys.last_batch || {}, r = sys.rates || {}, t = sys.totals || {};
  $("#sys-mode").textContent = lb.mode || "–";
  $("#sys-merged").textContent = sys.weights_hold || "none";
  $("#sys-ips").textContent = fmt(r.images_s, 1);
  $("#sys-batch").textContent = `${lb.images ?? "–"} / ${fmt(r.batch, 1)}`;
  $("#sys-slots").textContent = `${sys.slots.used} / ${sys.slots.total}`;
  $("#sys-switches").textContent = String(t.switches ?? 0);
  $("#sys-queue").textContent = String(sys.queue.images);
  $("#sys-load").textContent = `${fmt(sys.offered_load, 2)} s/s`;
  $("#sys-corr").textContent = `×${fmt(sys.cost_correction, 2)}`;
  const adm = Object.entries(sys.admitted || {});
  $("#sys-admitted").textContent = adm.length ? adm.map(([p, f]) => `p${p} ${fmt(100 * f)}%`).join(" ") : "all";
  const ready = $("#ready");
  ready.textContent = sys.ready ? "ready" : "not ready";
  ready.className = `badge ${sys.ready ? "ready" : "notready"}`;
  $("#where").textContent = `${sys.policy} policy · ${sys.device}`;
  const chips = Object.entries(sys.adapters || {}).sort((a, b) => a[1].slot - b[1].slot).map(([name, a]) => {
    const chip = el("span", `adapter${name === sys.weights_hold ? " merged" : ""}`,
      `slot ${a.slot}: ${name} · ${a.task} · ${a.size} px${a.trained ? "" : " · untrained"}${name === sys.weights_hold ? " · merged" : ""}`);
    return chip;
  });
  for (const [name, why] of Object.entries(sys.failed_adapters || {})) {
    const chip = el("span", "adapter failed", `${name}: not loaded`); chip.title = why; chips.push(chip);
  }
  $("#adapters").replaceChildren(...chips);
  $("#capacity").textContent = sys.capacity ? `capacity: ${sys.capacity}` : "";
  renderCluster(sys.cluster);
  $("#totals").textContent = `${t.chunks ?? 0} chunks · ${t.ok ?? 0} served · ${t.deadline_missed ?? 0} late · ` +
    `${t.shed ?? 0} shed · ${t.errors ?? 0} errors · ${t.ingest_dropped ?? 0} ingest drops · ${t.malformed ?? 0} malformed · ` +
    `${t.batches ?? 0} batches`;
  drawSystemCharts();
}

// The cluster controller's view (vlora_va/cluster/controller.py snapshot), when this daemon is one of a cluster.
function renderCluster(c) {
  $("#cluster").hidden = !c;
  if (!c) return;
  const rows = Object.entries(c.daemons || {}).sort().map(([name, d]) => {
    const tr = document.createElement("tr");
    const streams = Object.entries(c.streams || {}).filter(([, on]) => on === name).map(([s]) => s).sort();
    for (const text of [name, d.alive ? "up" : "down", (d.adapters || []).join(", ") || "–", fmt(d.load, 2),
                        `${fmt(d.utilisation, 2)} s/s`, streams.join(", ") || "–"]) {
      tr.append(el("td", "", text));
    }
    if (!d.alive) tr.className = "down";
    return tr;
  });
  $("#cluster-list tbody").replaceChildren(...rows);
}

function drawSystemCharts() {
  const now = serverNow(), t0 = now - state.historyS, hist = state.sysHistory.filter(p => p.t >= t0);
  const c1 = $("#chart-ips");
  const { ctx, w, h } = sized(c1);
  const top = Math.max(4, ...hist.map(p => p.images_s * 1.1));
  const x = t => (t - t0) / state.historyS * w, y = (v, m) => h - 3 - Math.min(v, m) / m * (h - 14);
  axis(ctx, w, h);
  if (hist.length) {  // images/s: a filled line; mean batch size: dots, on its own scale
    ctx.beginPath(); ctx.moveTo(x(hist[0].t), h);
    for (const p of hist) ctx.lineTo(x(p.t), y(p.images_s || 0, top));
    ctx.lineTo(x(hist[hist.length - 1].t), h); ctx.closePath();
    ctx.fillStyle = "rgba(88, 166, 255, .25)"; ctx.fill();
    ctx.strokeStyle = "#58a6ff"; ctx.lineWidth = 1.5; ctx.beginPath();
    hist.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.images_s || 0, top)) : ctx.moveTo(x(p.t), y(p.images_s || 0, top))));
    ctx.stroke();
  }
  const btop = Math.max(2, ...hist.map(p => (p.batch || 0) * 1.1));
  ctx.fillStyle = "#e3b341";
  for (const p of hist) if (p.batch) ctx.fillRect(x(p.t) - 1.5, y(p.batch, btop) - 1.5, 3, 3);
  scale(ctx, `${Math.round(top)} images/s`);
  scale(ctx, `${Math.round(btop)} images/batch`, true, w, "#e3b341");

  const c2 = $("#chart-mode");
  const s2 = sized(c2), bw = s2.w / state.historyS;
  for (const p of hist) {
    if (!p.mode) continue;
    if (!state.modes.has(p.mode)) state.modes.set(p.mode, PALETTE[state.modes.size % PALETTE.length]);
    s2.ctx.fillStyle = state.modes.get(p.mode);
    s2.ctx.fillRect(x(p.t) - bw, 0, Math.max(1, bw), s2.h);
  }
  $("#mode-legend").replaceChildren(...[...state.modes].flatMap(([m, c]) => { const i = el("i"); i.style.background = c; return [i, m]; }));
}

// ------------------------------------------------------------------ event stream
function onSnapshot(data) {
  state.historyS = data.history_s; state.offset = data.now - Date.now() / 1000;
  state.system = data.system; state.sysHistory = data.system_history || [];
  for (const info of data.streams) mergeStream(info, true);
  mergeEvents(data.events, true);
  renderSystem();
}

function onUpdate(data) {
  state.offset = data.now - Date.now() / 1000;
  state.system = data.system;
  if (data.system_point) {
    state.sysHistory.push(data.system_point);
    const cut = serverNow() - state.historyS - 5;
    while (state.sysHistory.length && state.sysHistory[0].t < cut) state.sysHistory.shift();
  }
  const seen = new Set();
  for (const info of data.streams) { mergeStream(info, false); seen.add(info.id); }
  for (const s of state.streams.values()) if (!seen.has(s.id)) renderStream(s);  // charts scroll with time
  mergeEvents(data.events, false);
  renderSystem();
}

function connect() {
  const conn = $("#conn");
  const es = new EventSource("/events");
  es.onopen = () => { conn.textContent = "live"; conn.className = "conn on"; };
  es.onerror = () => { conn.textContent = "reconnecting…"; conn.className = "conn off"; };
  es.addEventListener("snapshot", e => onSnapshot(JSON.parse(e.data)));
  es.addEventListener("update", e => onUpdate(JSON.parse(e.data)));
}

window.addEventListener("resize", () => { for (const s of state.streams.values()) { renderStream(s); drawFrame(s); } renderSystem(); });
connect();
