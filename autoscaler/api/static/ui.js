// migscale live view: polls /v1/plan, /v1/history and /v1/status and redraws.
// No framework, no build step; every string goes in through textContent.
"use strict";

const POLL_MS = 1500;
const SVGNS = "http://www.w3.org/2000/svg";

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("data-")) el.setAttribute(k, String(v));
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

function fmt(x, digits) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  const d = digits === undefined ? (Math.abs(x) >= 100 ? 0 : 1) : digits;
  return Number(x).toFixed(d);
}

// ------------------------------------------------------------------ GPUs

function liveRow(r, live) {
  // /v1/status lists a multinode group once, by its group id ("llm-g0" for member "llm-g0-1")
  return live && (live[r.id] || live[r.id.replace(/-\d+$/, "")]);
}

function repState(r, live) {
  // per-replica numbers come from /v1/status when the controller has them
  const n = liveRow(r, live);
  if (r.state === "crashloop") {
    const wait = n && n.next_restart_in_s !== null && n.next_restart_in_s !== undefined
      ? ` · retry in ${fmt(n.next_restart_in_s, 0)} s` : "";
    return `crashloop · ${n ? n.restarts : "?"} restarts${wait}`;
  }
  return n && n.req_s !== null && n.req_s !== undefined ? `${r.state} · ${fmt(n.req_s)} req/s` : r.state;
}

function repTitle(r, live) {
  // hovering a crash-looping replica shows why it keeps failing
  const n = liveRow(r, live);
  const err = n && Array.isArray(n.last_error) && n.last_error.length ? "\n" + n.last_error.join("\n") : "";
  return `${r.id} · ${r.state}` + (n && n.restarts ? ` · ${n.restarts} restarts` : "") + err;
}

function instanceBlock(gpu, inst, replicas, planned, live) {
  const span = inst.memory_slots || 1;
  const el = h("div", {
    class: "inst" + (planned ? " planned" : ""),
    "data-gpu": gpu.id, "data-start": inst.start, "data-profile": inst.profile,
    title: `${inst.profile}@${inst.start}` + (planned ? " (planned)" : ""),
  });
  el.style.gridColumn = `${inst.start + 1} / span ${span}`;
  el.appendChild(h("div", { class: "inst-name" },
    h("span", { class: "prof", text: inst.profile }), h("span", { class: "at", text: "@" + inst.start })));
  if (!planned) {
    if (replicas.length === 0) el.appendChild(h("div", { class: "free", text: "free" }));
    for (const r of replicas) {
      el.appendChild(h("div", {
        class: "rep " + r.state, "data-replica": r.id, "data-model": r.model, "data-state": r.state,
        "data-gpu": gpu.id, "data-start": r.start, title: repTitle(r, live),
      }, h("span", { class: "rep-model", text: r.model }), h("span", { class: "rep-state", text: repState(r, live) })));
    }
  }
  return el;
}

function computeBar(gpu) {
  const n = gpu.compute_slices || 7;
  const bar = h("div", { class: "bar compute", title: "compute slices" });
  bar.style.gridTemplateColumns = `repeat(${n}, 1fr)`;
  let used = 0;
  for (const inst of gpu.instances) used += inst.compute || 0;
  for (let i = 0; i < n; i++) bar.appendChild(h("div", { class: "cell" + (i < used ? " used" : "") }));
  return bar;
}

function renderGpus(cluster, live) {
  const root = document.getElementById("gpus");
  const byGpu = new Map();
  for (const r of cluster.replicas || []) {
    if (!byGpu.has(r.gpu)) byGpu.set(r.gpu, []);
    byGpu.get(r.gpu).push(r);
  }
  const cards = [];
  for (const g of cluster.gpus || []) {
    const reps = byGpu.get(g.id) || [];
    const slots = g.memory_slots || 8;
    const head = h("div", { class: "gpu-head" },
      h("span", { class: "gpu-id", text: g.id }),
      h("span", { class: "muted", text: g.product + (g.emulated ? " · emulated" : "") }),
      g.repartition_pending ? h("span", { class: "badge pending", text: "repartition pending" }) : null,
      g.reserved_by ? h("span", { class: "badge", text: "reserved: " + g.reserved_by }) : null);
    const mem = h("div", { class: "bar memory", title: "memory slots" });
    mem.style.gridTemplateColumns = `repeat(${slots}, 1fr)`;
    for (let i = 0; i < slots; i++) mem.appendChild(h("div", { class: "slot", text: String(i) }));
    const row = h("div", { class: "row current" });
    row.style.gridTemplateColumns = `repeat(${slots}, 1fr)`;
    const placed = new Set();
    for (const inst of g.instances) {
      const mine = reps.filter((r) => r.start === inst.start);
      mine.forEach((r) => placed.add(r.id));
      row.appendChild(instanceBlock(g, inst, mine, false, live));
    }
    if (!g.instances.length) row.appendChild(h("div", { class: "empty", text: g.mig_enabled ? "no MIG instances" : "whole GPU" }));
    const body = [h("div", { class: "label", text: "compute" }), computeBar(g),
      h("div", { class: "label", text: "memory" }), mem,
      h("div", { class: "label", text: "instances" }), row];
    if (g.repartition_pending && g.planned_layout) {
      const prow = h("div", { class: "row plannedrow" });
      prow.style.gridTemplateColumns = `repeat(${slots}, 1fr)`;
      for (const inst of g.planned_instances || []) prow.appendChild(instanceBlock(g, inst, [], true));
      body.push(h("div", { class: "label", text: "planned" }), prow);
    }
    const unplaced = reps.filter((r) => !placed.has(r.id));
    if (unplaced.length) {
      body.push(h("div", { class: "label", text: "other" }),
        h("div", { class: "row loose" }, unplaced.map((r) => h("div", {
          class: "rep " + r.state, "data-replica": r.id, "data-model": r.model, "data-state": r.state,
          "data-gpu": g.id, "data-start": r.start,
        }, h("span", { class: "rep-model", text: r.model }), h("span", { class: "rep-state", text: `${r.profile} ${r.state}` })))));
    }
    cards.push(h("article", { class: "gpu", "data-gpu": g.id }, head, h("div", { class: "grid" }, body)));
  }
  root.replaceChildren(...cards);
  if (!cards.length) root.replaceChildren(h("p", { class: "muted", text: "no GPUs" }));
}

// ------------------------------------------------------------------ models

function sparkline(points, idx, opts) {
  const W = 160, H = 34, P = 2;
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "spark " + opts.cls, role: "img", "aria-label": opts.label });
  const pts = points.filter((p) => p[idx] !== null && p[idx] !== undefined);
  if (!pts.length) {
    const t = svg("text", { x: 4, y: H / 2 + 4, class: "nodata" });
    t.textContent = "no data";
    box.appendChild(t);
    return box;
  }
  const t1 = points[points.length - 1][0];
  const t0 = t1 - 600;
  let vmax = Math.max(...pts.map((p) => p[idx]), opts.ref || 0) * 1.1 || 1;
  const x = (t) => P + ((t - t0) / 600) * (W - 2 * P);
  const y = (v) => H - P - (v / vmax) * (H - 2 * P);
  if (opts.ref) box.appendChild(svg("line", { x1: P, x2: W - P, y1: y(opts.ref), y2: y(opts.ref), class: "ref" }));
  // a gap (null) breaks the line: missing data is not drawn as zero
  let seg = [];
  const flush = () => {
    if (seg.length > 1) box.appendChild(svg("polyline", { points: seg.join(" "), class: "line" }));
    if (seg.length === 1) {
      const [cx, cy] = seg[0].split(",");
      box.appendChild(svg("circle", { cx, cy, r: 1.5, class: "dot" }));
    }
    seg = [];
  };
  for (const p of points) {
    if (p[idx] === null || p[idx] === undefined) { flush(); continue; }
    seg.push(`${x(p[0]).toFixed(1)},${y(p[idx]).toFixed(1)}`);
  }
  flush();
  return box;
}

function sloClass(p99, slo) {
  if (p99 === null || p99 === undefined || !slo) return "unknown";
  if (p99 <= 0.8 * slo) return "ok";
  if (p99 <= slo) return "warn";
  return "bad";
}

function renderModels(models, history) {
  const root = document.getElementById("models");
  const cards = (models || []).map((m) => {
    const hist = (history.models || {})[m.name] || { points: [] };
    const slo = m.slo_p99_ms || hist.slo_p99_ms;
    const cls = sloClass(m.p99_ms, slo);
    const profiles = Object.entries(m.replicas || {}).map(([p, st]) => {
      const live = (st.ready || 0) + (st.starting || 0);
      const want = m.desired && m.desired[p] !== undefined ? m.desired[p] : null;
      const extra = [];
      if (st.starting) extra.push(`${st.starting} starting`);
      if (st.draining) extra.push(`${st.draining} draining`);
      if (st.failed) extra.push(`${st.failed} failed`);
      return h("li", { "data-profile": p },
        h("span", { class: "prof", text: p }), " ",
        h("b", { text: "×" + live }),
        want !== null && want !== live ? h("span", { class: "muted", text: ` → ${want}` }) : null,
        extra.length ? h("span", { class: "muted", text: ` (${extra.join(", ")})` }) : null);
    });
    for (const [p, want] of Object.entries(m.desired || {})) {
      if (!(m.replicas || {})[p] && want > 0) {
        profiles.push(h("li", { "data-profile": p }, h("span", { class: "prof", text: p }), " ",
          h("b", { text: "×0" }), h("span", { class: "muted", text: ` → ${want}` })));
      }
    }
    const reasons = (m.reasons || []).join(", ") || "–";
    return h("article", { class: "model slo-" + cls, "data-model": m.name },
      h("div", { class: "model-head" },
        h("span", { class: "model-name", text: m.name }),
        h("span", { class: "slo-pill " + cls, title: "p99 vs SLO",
          text: `p99 ${fmt(m.p99_ms)} ms` + (slo ? ` / ${fmt(slo, 0)} ms` : "") })),
      h("div", { class: "kpis" },
        h("div", { class: "kpi" }, h("span", { class: "kpi-v", text: fmt(m.request_rate) }), h("span", { class: "kpi-l", text: "req/s" })),
        h("div", { class: "kpi" }, h("span", { class: "kpi-v", text: fmt(m.queue_compute_ratio, 2) }), h("span", { class: "kpi-l", text: "queue:compute" })),
        h("div", { class: "kpi" }, h("span", { class: "kpi-v", text: fmt(m.shortfall_rps) }), h("span", { class: "kpi-l", text: "short req/s" }))),
      h("div", { class: "sparks" },
        h("div", {}, h("span", { class: "kpi-l", text: "req/s, 10 min" }), sparkline(hist.points, 1, { cls: "rps", label: "requests per second" })),
        h("div", {}, h("span", { class: "kpi-l", text: "p99 ms, 10 min" }), sparkline(hist.points, 2, { cls: "p99 " + cls, ref: slo, label: "p99 latency" }))),
      h("ul", { class: "profiles" }, profiles.length ? profiles : [h("li", { class: "muted", text: "no replicas" })]),
      h("div", { class: "decision" }, h("span", { class: "kpi-l", text: "last decision " }), h("span", { class: "reasons", text: reasons })));
  });
  root.replaceChildren(...cards);
  if (!cards.length) root.replaceChildren(h("p", { class: "muted", text: "no models" }));
}

function renderPlan(plan) {
  const root = document.getElementById("plan");
  if (!plan) { root.replaceChildren(h("span", { text: "no plan yet" })); return; }
  const c = plan.cost || {};
  const items = (plan.actions || []).map((a) => h("li", { class: "action " + a.kind },
    h("b", { text: a.kind }), " ",
    [a.model, a.profile, a.gpu && `on ${a.gpu}`, a.start !== null && a.start !== undefined ? `@${a.start}` : null, a.replica]
      .filter(Boolean).join(" "),
    a.layout ? ` → ${a.layout.map((p) => p.profile + "@" + p.start).join(", ")}` : "",
    h("span", { class: "muted", text: ` (${a.reason})` })));
  root.className = "plan";
  root.replaceChildren(
    h("div", { class: "muted", text: `${c.gpus_used || 0} GPUs, ${c.slices_used || 0} slices in the plan · ${(plan.actions || []).length} actions` }),
    items.length ? h("ol", { class: "actions" }, items) : h("div", { class: "muted", text: "nothing to do" }));
}

// ------------------------------------------------------------------ loop

let lastOk = 0;

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

function alerts(status) {
  // what is not well, in one line beside the connection state
  if (!status) return "";
  const out = [];
  const loops = (status.replicas || []).filter((r) => r.state === "crashloop").map((r) => r.id);
  if (loops.length) out.push(`crash-looping: ${loops.join(", ")}`);
  for (const [name, st] of Object.entries(status.infrastructure || {})) {
    if (st && st.state && st.state !== "up") out.push(`${name} ${st.state}`);
  }
  if (status.metrics_mode === "prometheus-down") out.push("metrics blind: holding");
  if (status.metrics_mode === "prometheus-warming") out.push("metrics back, windows partial: holding");
  return out.length ? " · " + out.join(" · ") : "";
}

async function poll() {
  const conn = document.getElementById("conn");
  try {
    const [plan, history, status] = await Promise.all([
      getJson("/v1/plan"), getJson("/v1/history"), getJson("/v1/status").catch(() => null)]);
    const live = {};
    for (const r of (status && Array.isArray(status.replicas)) ? status.replicas : []) live[r.id] = r;
    renderGpus(plan.cluster || { gpus: [], replicas: [] }, live);
    renderModels(plan.models || [], history || { models: {} });
    renderPlan(plan.plan);
    lastOk = Date.now();
    conn.className = "conn ok";
    conn.textContent = (status && status.frontdoor ? `live · front door ${status.frontdoor}` : "live") + alerts(status);
    const t = plan.t_s ? new Date(plan.t_s * 1000) : null;
    document.getElementById("updated").textContent = t ? "tick " + t.toLocaleTimeString() : "";
    document.body.dataset.tick = String(plan.t_s || "");
  } catch (e) {
    conn.className = "conn bad";
    conn.textContent = "disconnected";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", poll);
