"use strict";
// The floodwall gateway dashboard: one frame per second from /dashboard/events (SSE).
const HISTORY = 60;
const history = new Map(); // route -> {rps: [], p99: []}

function fmt(value, digits = 1) {
  if (value === null || value === undefined) return "–";
  return Number(value).toFixed(digits);
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function spark(series) {
  const canvas = document.createElement("canvas");
  canvas.width = 160; canvas.height = 28;
  const ctx = canvas.getContext("2d");
  const draw = (values, color) => {
    const max = Math.max(1e-9, ...values.map((v) => v || 0));
    ctx.strokeStyle = color; ctx.beginPath();
    values.forEach((v, i) => {
      const x = (i / (HISTORY - 1)) * canvas.width;
      const y = canvas.height - 2 - ((v || 0) / max) * (canvas.height - 4);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  };
  draw(series.rps, "#58a6ff");
  draw(series.p99, "#d29922");
  return canvas;
}

function remember(route) {
  let h = history.get(route.name);
  if (!h) { h = { rps: [], p99: [] }; history.set(route.name, h); }
  h.rps.push(route.rps); h.p99.push(route.p99_ms);
  if (h.rps.length > HISTORY) { h.rps.shift(); h.p99.shift(); }
  return h;
}

function renderRoutes(routes) {
  const body = document.querySelector("#routes tbody");
  body.replaceChildren();
  for (const route of routes) {
    const tr = document.createElement("tr");
    tr.dataset.route = route.name;
    const out = route.outcomes_per_s || {};
    const limiter = route.limiter ? fmt(route.limiter.rejected_per_s) : "–";
    const bulkhead = route.bulkhead ? `${route.bulkhead.in_flight}/${route.bulkhead.max}` : "–";
    const errors = `${fmt(route.error_rate * 100)} %`;
    const share = (value) => (value === null || value === undefined ? "–" : `${fmt(value * 100)} %`);
    const bad = (value, cls) => (value > 0.05 ? `${cls} bad` : cls);
    tr.append(
      cell(route.name, "name"),
      cell(route.upstream || ""),
      cell(fmt(route.rps), "rps"),
      cell(errors, route.error_rate > 0.05 ? "errors bad" : "errors"),
      cell(share(route.dependency_error_rate), bad(route.dependency_error_rate, "dependency")),
      cell(share(route.degraded_rate), bad(route.degraded_rate, "degraded")),
      cell(fmt(route.p50_ms, 2), "p50"),
      cell(fmt(route.p99_ms, 2), "p99"),
      cell(route.breaker || "–", `breaker state-${route.breaker}`),
      cell(limiter, "limiter"),
      cell(bulkhead, "bulkhead"),
      cell(fmt(out.overloaded || 0), "shed"),
      cell(fmt(out.fallback || 0), "fallbacks"),
    );
    const trend = document.createElement("td");
    trend.append(spark(remember(route)));
    tr.append(trend);
    body.append(tr);
  }
}

function renderUpstreams(upstreams) {
  const root = document.getElementById("upstreams");
  root.replaceChildren();
  for (const upstream of upstreams) {
    const div = document.createElement("div");
    div.className = "upstream";
    div.dataset.upstream = upstream.name;
    const title = document.createElement("strong");
    title.textContent = `${upstream.name} (${upstream.balance}) `;
    div.append(title);
    const pct = (value) => (value === null || value === undefined ? "–" : `${fmt(value * 100)} %`);
    const rates = document.createElement("span");
    rates.className = "rates";
    rates.dataset.dependencyErrors = String(upstream.dependency_error_rate ?? "");
    rates.dataset.degraded = String(upstream.degraded_rate ?? "");
    rates.textContent = `dependency errors ${pct(upstream.dependency_error_rate)} · degraded ${pct(upstream.degraded_rate)} · tries failed ${pct(upstream.try_failure_rate)} `;
    div.append(rates);
    for (const e of upstream.endpoints) {
      const span = document.createElement("span");
      const state = e.state || (e.up ? "up" : "down");
      span.className = `endpoint ${e.up ? "up" : "down"} ${state}`;
      span.dataset.state = state;
      const why = state === "up" ? "" : ` ${state}`;
      const reasons = Object.entries(e.failures_by_reason || {}).filter(([, n]) => n > 0);
      const by = reasons.length ? ` (${reasons.map(([r, n]) => `${r} ${n}`).join(", ")})` : "";
      const rate = e.failures_per_s ? ` · ${e.failures_per_s} failed/s` : "";
      span.textContent = `${e.url}${why} · ${e.in_flight} in flight · ${e.requests} req · ${e.failures} failed${by}${rate}`;
      div.append(span);
    }
    root.append(div);
  }
}

function render(frame) {
  renderRoutes(frame.routes);
  renderUpstreams(frame.upstreams);
  const shed = frame.shed_levels.length ? `shed levels: ${frame.shed_levels.join(", ")}` : "no level shed";
  const shedEl = document.getElementById("shed");
  shedEl.textContent = shed;
  shedEl.className = frame.shed_levels.length ? "badge warn" : "badge";
  const down = frame.workers_down || [];
  const meta = document.getElementById("meta");
  meta.textContent = `config v${frame.version} · ${frame.workers} worker(s)` +
    (down.length ? ` · ${down.length} not answering (${down.map((d) => `worker ${d.worker}: ${d.reason}`).join("; ")})` : "");
  meta.className = down.length ? "badge bad" : "";
  document.getElementById("updated").textContent = new Date(frame.time * 1000).toLocaleTimeString();
  document.body.dataset.frames = String(Number(document.body.dataset.frames || 0) + 1);
}

function connect() {
  const source = new EventSource("/dashboard/events");
  const badge = document.getElementById("connection");
  source.onopen = () => { badge.textContent = "live"; badge.className = "badge on"; };
  source.onerror = () => { badge.textContent = "reconnecting…"; badge.className = "badge off"; };
  source.onmessage = (event) => render(JSON.parse(event.data));
}

connect();
