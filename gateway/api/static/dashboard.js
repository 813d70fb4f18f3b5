// The admin dashboard: polls /admin/stats with the admin key kept in sessionStorage.
// Everything shown is built with textContent: route and tenant names are never HTML.
"use strict";

const KEY_NAME = "tiergate-admin-key";
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(250, 1000 * Number(params.get("refresh") || 5));
let timer = null;
let updates = 0;
let lastStats = null;

const $ = (id) => document.getElementById(id);

async function api(path, body) {
  const headers = {Authorization: "Bearer " + sessionStorage.getItem(KEY_NAME)};
  const init = body === undefined ? {headers} : {
    method: "POST",
    headers: {...headers, "Content-Type": "application/json"},
    body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (answer.error && answer.error.message) || response.statusText;
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return answer;
}

function fmt(value, kind) {
  if (value === null || value === undefined) return "–";
  if (kind === "%") return (100 * value).toFixed(1) + "%";
  if (kind === "$") return "$" + value.toFixed(value >= 1 ? 2 : 6);
  if (kind === "s") return value >= 1 ? value.toFixed(2) + " s" : (1000 * value).toFixed(0) + " ms";
  return String(value);
}

function table(id, columns, rows) {
  const el = $(id);
  el.replaceChildren();
  const head = el.insertRow();
  for (const [title] of columns) {
    const th = document.createElement("th");
    th.textContent = title;
    head.appendChild(th);
  }
  for (const row of rows) {
    const tr = el.insertRow();
    for (const [, get, kind] of columns) {
      const cell = tr.insertCell();
      const value = get(row);
      cell.textContent = fmt(value, kind);
      if (typeof value === "string") cell.className = "name";  // names read left to right
    }
  }
  if (!rows.length) {
    const cell = el.insertRow().insertCell();
    cell.colSpan = columns.length;
    cell.textContent = "nothing yet";
  }
}

function tiles(w) {
  const saved = w.savings.cache.cost_usd + w.savings.router.cost_usd;
  const items = [
    ["requests", fmt(w.requests)],
    ["cache hit rate", fmt(w.hit_rate, "%")],
    ["latency p50 / p95", fmt(w.latency_s.p50, "s") + " / " + fmt(w.latency_s.p95, "s")],
    ["spent", fmt(w.savings.spent_usd, "$")],
    ["saved by the cache", fmt(w.savings.cache.cost_usd, "$")],
    ["saved by the router", fmt(w.savings.router.cost_usd, "$")],
    ["saved in all", fmt(saved, "$")],
    ["wrong hits reported", fmt(w.cache.wrong_hits_reported)],
  ];
  $("tiles").replaceChildren(...items.map(([label, value]) => {
    const div = document.createElement("div");
    div.className = "tile";
    const b = document.createElement("b");
    b.textContent = value;
    div.append(b, label);
    return div;
  }));
}

function charts(series) {
  const t = series.t;
  lineChart($("chart-hit-rate"), t, [{name: "hit rate", values: series.hit_rate}], {unit: "%", max: 1});
  const tiers = Object.entries(series.requests_per_s).map(([name, values]) => ({name, values}));
  lineChart($("chart-requests"), t, tiers, {});
  lineChart($("chart-latency"), t, [
    {name: "p50", values: series.latency_p50_s},
    {name: "p95", values: series.latency_p95_s},
  ], {unit: "s"});
  lineChart($("chart-saved"), t, [{name: "saved", values: series.cost_saved_usd}], {unit: "$"});
}

function render(stats) {
  const w = stats.windows[$("window").value];
  tiles(w);
  charts(stats.series);
  table("route-tenants", [
    ["route", (r) => r.route], ["tenant", (r) => r.tenant], ["requests", (r) => r.requests],
    ["exact hits", (r) => r.exact_hits], ["semantic hits", (r) => r.semantic_hits],
    ["misses", (r) => r.misses], ["bypasses", (r) => r.bypasses],
    ["verifier refusals", (r) => r.verifier_refusals], ["hit rate", (r) => r.hit_rate, "%"],
  ], w.route_tenants);
  table("spend-keys", [
    ["tenant", (r) => r.tenant], ["key", (r) => r.key], ["spent", (r) => r.usd, "$"],
  ], w.spend.keys);
  table("spend-routes", [["route", (r) => r.route], ["spent", (r) => r.usd, "$"]],
    Object.entries(w.spend.routes).map(([route, usd]) => ({route, usd})));
  const models = Object.entries(w.tiers).flatMap(([tier, t]) =>
    Object.entries(t.models).map(([model, m]) => ({tier, model, t, m})));
  table("tiers", [
    ["tier", (r) => r.tier], ["model", (r) => r.model], ["requests", (r) => r.m.requests],
    ["tokens in", (r) => r.m.prompt_tokens], ["tokens out", (r) => r.m.completion_tokens],
    ["p50", (r) => r.t.latency_s.p50, "s"], ["p95", (r) => r.t.latency_s.p95, "s"],
    ["p99", (r) => r.t.latency_s.p99, "s"], ["TTFT p50", (r) => r.t.ttft_s.p50, "s"],
    ["errors", (r) => r.m.errors], ["failed attempts", (r) => r.m.failed_attempts],
    ["fallbacks out", (r) => r.t.fallbacks_out], ["cooldowns", (r) => r.m.cooldowns],
    ["cost", (r) => r.m.cost_usd, "$"],
  ], models);
  const engines = Object.entries(stats.engines).map(([name, e]) => ({name, e}));
  table("engines", [
    ["engine", (r) => r.name], ["running", (r) => r.e.running], ["waiting", (r) => r.e.waiting],
    ["KV usage", (r) => r.e.kv_cache_usage_perc, "%"],
  ], engines);
  updates++;
  document.body.dataset.updates = String(updates);
  $("status").textContent = "updated " + new Date().toLocaleTimeString() + " · every " +
    REFRESH_MS / 1000 + " s";
}

async function refresh() {
  try {
    lastStats = await api("/admin/stats");
    render(lastStats);
  } catch (error) {
    if (error.status === 401 || error.status === 403) return signOut(error.message);
    $("status").textContent = "gateway unreachable: " + error.message;
  }
}

async function loadPolicy() {
  try {
    const policy = await api("/admin/policy");  // redacted by the gateway
    $("policy-source").textContent = policy.source || "";
    $("policy").textContent = JSON.stringify(policy.policy, null, 2);
  } catch (error) {
    $("policy").textContent = "policy unavailable: " + error.message;
  }
}

function signIn() {
  $("login").hidden = true;
  $("board").hidden = false;
  $("signout").hidden = false;
  refresh().then(loadPolicy);
  clearInterval(timer);
  timer = setInterval(refresh, REFRESH_MS);
}

function signOut(message) {
  clearInterval(timer);
  sessionStorage.removeItem(KEY_NAME);
  $("board").hidden = true;
  $("signout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("status").textContent = "not signed in";
}

async function action(path, body, done) {
  const out = $("action-result");
  try {
    out.className = "";
    out.textContent = done(await api(path, body));
    refresh();
  } catch (error) {
    if (error.status === 401 || error.status === 403) return signOut(error.message);
    out.className = "error";
    out.textContent = error.message;
  }
}

$("report").addEventListener("submit", (event) => {
  event.preventDefault();
  const body = {entry_id: $("report-entry").value.trim(), reason: $("report-reason").value || null};
  action("/admin/cache/report", body, (r) => "removed cache entry " + r.reported);
});
$("reload").addEventListener("click", () =>
  action("/admin/policy/reload", {}, (r) => "policy reloaded").then(loadPolicy));
$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_NAME, $("key").value.trim());
  $("key").value = "";
  signIn();
});
$("signout").addEventListener("click", () => signOut(""));
$("window").addEventListener("change", () => lastStats && render(lastStats));
if (sessionStorage.getItem(KEY_NAME)) signIn();
