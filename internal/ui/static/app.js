// The dashboard: reads the daemon's JSON APIs on this origin every two
// seconds and draws what they say (svg.js draws the charts). Every value
// from the APIs reaches the page as text (textContent, attributes), never
// as markup.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const TOKEN = "sluice.token"; // sessionStorage key: forgotten with the tab
  const POLL_MS = 2000;
  const LIVE_MINUTES = 10, LIVE_RESOURCES = 5;
  // Each range, its length and the granularity of its points.
  const RANGES = {
    "15m": { ms: 15 * 60e3, granularity: "minute", step: 60e3 },
    "1h": { ms: 3600e3, granularity: "minute", step: 60e3 },
    "24h": { ms: 24 * 3600e3, granularity: "hour", step: 3600e3 },
    "7d": { ms: 7 * 24 * 3600e3, granularity: "day", step: 86400e3 },
  };

  class HTTPError extends Error {
    constructor(status, msg) { super(msg); this.status = status; }
  }

  // h makes an HTML element with attributes and children (strings become
  // text).
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
    }
    return e;
  }

  let waitingForToken = false;

  // api GETs path with the query params (an array of [name, value] pairs
  // or an object), with the token when there is one.
  async function api(path, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Array.isArray(params) ? params : Object.entries(params || {})) {
      if (v !== "" && v !== undefined && v !== null) q.append(k, v);
    }
    const headers = { Accept: "application/json" };
    const tok = sessionStorage.getItem(TOKEN);
    if (tok) headers.Authorization = "Bearer " + tok;
    const qs = q.toString();
    const res = await fetch(path + (qs ? "?" + qs : ""), { headers, cache: "no-store", credentials: "omit" });
    const body = await res.json().catch(() => ({}));
    if (res.status === 401) {
      askToken(tok ? "that token was not accepted" : "");
      throw new HTTPError(401, "a token is needed");
    }
    if (!res.ok) {
      throw new HTTPError(res.status, body.error_description || body.message || body.error || res.statusText);
    }
    return body;
  }

  function askToken(msg) {
    waitingForToken = true;
    $("login").hidden = false;
    $("login-error").textContent = msg || "";
    $("token").focus();
  }

  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN, t);
    $("token").value = "";
    $("login").hidden = true;
    waitingForToken = false;
    tick(true);
  });

  // RFC 3339 in UTC, to the second.
  const iso = (ms) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");
  const floorTo = (ms, step) => Math.floor(ms / step) * step;
  const us = (v) => (v >= 1000 ? (v / 1000).toFixed(v >= 1e4 ? 0 : 1) + " ms" : Math.round(v) + " µs");
  const pct = (v) => (v * 100).toFixed(v >= 0.1 || v === 0 ? 0 : 1) + "%";
  const count = (v) => Number(v || 0).toLocaleString("en-US");
  const when = (s) => (s ? new Date(s).toLocaleString() : "never");

  function analytics(params) { return api("/api/v1/analytics", params); }

  function note(msg) {
    $("notice").hidden = !msg;
    $("notice").textContent = msg || "";
  }

  function emptyChart(box, msg) {
    box.replaceChildren(h("p", { class: "empty-chart" }, msg));
  }

  // The range's answer: summary, block rate, top clients and resources,
  // latency, the sink's gaps.
  let anomalies = [], changes = [];
  async function refreshRange(now) {
    const r = RANGES[$("range").value];
    const end = floorTo(now, 60e3) + 60e3; // through the current minute
    const start = floorTo(end - r.ms, r.step);
    const a = await analytics({ start_time: iso(start), end_time: iso(end), granularity: r.granularity });
    const s = a.summary || {};
    for (const e of document.querySelectorAll("#summary [data-metric]")) {
      const k = e.dataset.metric, v = s[k] || 0;
      e.dataset.value = v;
      e.textContent = k === "block_rate" ? pct(v) : k.endsWith("_us") ? us(v) : count(v);
    }
    $("blockrate-range").textContent = `${r.granularity} points, block rate ${pct(s.block_rate || 0)}`;
    const points = (a.time_series || []).map((p) => ({ t: new Date(p.timestamp), total: p.total_requests, blocked: p.blocked }));
    const tick = r.step >= 86400e3 ? (d) => d.toLocaleDateString() : (d) => d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    $("blockrate-chart").replaceChildren(SVG.rateLine(points, { start: new Date(start), end: new Date(end), step: r.step, tick, label: "block rate over time" }));
    const tops = (list) => (list || []).map((c) => ({ name: c.name, total: c.total_requests, blocked: c.blocked }));
    const clients = tops(a.top_clients).filter((c) => c.blocked > 0);
    if (clients.length) $("top-clients-chart").replaceChildren(SVG.hbars(clients, { label: "top limited clients" }));
    else emptyChart($("top-clients-chart"), "no client was limited in this range");
    const resources = tops(a.top_resources);
    if (resources.length) $("top-resources-chart").replaceChildren(SVG.hbars(resources, { label: "top limited resources" }));
    else emptyChart($("top-resources-chart"), "no resource was limited in this range");
    const lat = [{ name: "all regions", avg: s.avg_latency_us || 0, p99: s.p99_latency_us || 0 }];
    for (const g of a.by_region || []) lat.push({ name: g.region || "(none)", avg: g.avg_latency_us || 0, p99: g.p99_latency_us || 0 });
    const legend = h("p", { class: "legend" }, h("i", { class: "sw avg" }), "average ", h("i", { class: "sw p99" }), "99th percentile");
    $("latency-chart").replaceChildren(legend, SVG.pairBars(lat, { label: "check latency", us }));
    anomalies = a.anomalies_detected || [];
    changes = a.changes || [];
    const g = a.gaps || {};
    const from = a.source === "postgres" ? "from PostgreSQL, every instance's" :
      a.source === "memory" ? "from this instance's memory (its last 24 hours)" : "";
    $("gaps").dataset.source = a.source || "";
    $("gaps").textContent = `Analytics ${from}: ${count(g.events_dropped)} events dropped before aggregation, ` +
      `${count(g.sink_dropped_rows)} rows never reached the database` +
      (g.sink_healthy === false ? "; the database is not answering now (the counts shown come from memory)." : ".");
  }

  // The live charts: all checks, and each of the busiest resources (the
  // analytics' by_resource, ranked by checks, blocked or not), per second
  // over the last minutes, with the rate since the last poll.
  // resource ("" for all) -> {at, minute, allowed, blocked}: the current
  // minute's counts at the last poll.
  const lastCounts = new Map();
  async function refreshLive(now) {
    const end = floorTo(now, 60e3) + 60e3, start = end - LIVE_MINUTES * 60e3;
    const base = { start_time: iso(start), end_time: iso(end), granularity: "minute" };
    const all = await analytics(base);
    const names = (all.by_resource || []).slice(0, LIVE_RESOURCES).map((r) => r.resource);
    const per = await Promise.all(names.map((n) => analytics({ ...base, resource: n })));
    const figure = (name, answer) => {
      const byT = new Map((answer.time_series || []).map((p) => [new Date(p.timestamp).getTime(), p]));
      const points = [];
      for (let t = start; t < end; t += 60e3) {
        const p = byT.get(t) || {};
        // The current minute has lasted only so long.
        const seconds = t + 60e3 > now ? Math.max(1, (now - t) / 1000) : 60;
        points.push({ t: new Date(t), allowed: p.allowed || 0, blocked: p.blocked || 0, seconds });
      }
      // The rate since the last poll, from the current minute's counts
      // (and the end of the previous minute's, when the minute turned).
      const last = points[points.length - 1], before = points[points.length - 2];
      const prev = lastCounts.get(name);
      lastCounts.set(name, { at: now, minute: last.t.getTime(), allowed: last.allowed, blocked: last.blocked });
      let rate = "";
      if (prev && now > prev.at) {
        let da = last.allowed, db = last.blocked;
        if (prev.minute === last.t.getTime()) {
          da -= prev.allowed;
          db -= prev.blocked;
        } else if (prev.minute === before.t.getTime()) {
          da += before.allowed - prev.allowed;
          db += before.blocked - prev.blocked;
        }
        const dt = (now - prev.at) / 1000;
        rate = `now ${SVG.fmt(Math.max(0, da) / dt)}/s allowed, ${SVG.fmt(Math.max(0, db) / dt)}/s blocked`;
      }
      const label = name ? h("code", {}, name) : h("span", {}, "all resources");
      return h("figure", name ? { "data-resource": name } : { "data-all": "" },
        h("figcaption", {}, label, h("span", { class: "rate muted" }, rate)),
        SVG.stackedBars(points, { label: `checks per second of ${name || "all resources"}`, slots: LIVE_MINUTES }));
    };
    $("live-charts").replaceChildren(figure("", all), ...names.map((n, i) => figure(n, per[i])));
  }

  // dur shortens Go's duration syntax: "1m0s" to "1m", "1h0m0s" to "1h".
  const dur = (d) => (d || "").replace(/(\d[hm])0s$/, "$1").replace(/(\d)h0m$/, "$1h");

  function limitText(l) {
    if (!l) return "—";
    if (l.deny_all) return "deny all";
    const parts = [];
    if (l.limit) parts.push(`${count(l.limit)} per ${dur(l.window) || "inherited window"}`);
    else if (l.window) parts.push(`per ${dur(l.window)}`);
    if (l.burst) parts.push(`burst ${count(l.burst)}`);
    if (l.algorithm) parts.push(l.algorithm.replaceAll("_", " "));
    return parts.join(", ") || "inherited";
  }

  function rows(tbody, list, row, empty) {
    const cols = tbody.closest("table").querySelectorAll("th").length;
    if (!list.length) tbody.replaceChildren(h("tr", {}, h("td", { class: "empty", colspan: cols }, empty)));
    else tbody.replaceChildren(...list.map(row));
  }

  async function refreshPolicy() {
    let p;
    try {
      p = await api("/api/v1/policy");
    } catch (e) {
      if (e.status === 401) throw e;
      $("policy-version").textContent = "unavailable: " + e.message;
      return;
    }
    $("policy-version").textContent = `version ${p.version}` + (p.layer_revision ? `, control plane revision ${p.layer_revision}` : "") +
      (p.source && p.source !== p.version ? ` (${p.source.split("/").pop()})` : "");
    $("policy-version").title = p.source || "";
    const tag = (t) => h("span", { class: "tag" }, t);
    rows($("rules-body"), p.rules || [], (r) => {
      const match = [].concat((r.methods || []).length ? [r.methods.join(" ")] : [], (r.resources || []).join(", ") || [],
        (r.operations || []).map((o) => "op " + o), (r.clients || []).map((c) => "client " + c));
      const limit = h("div", {}, ...(r.by_tier
        ? Object.entries(r.by_tier).map(([t, l]) => h("div", {}, h("b", {}, t + ": "), limitText(l)))
        : r.limit || !r.global_limit ? [h("div", {}, limitText(r.limit))] : []),
      r.global_limit ? h("div", {}, h("b", {}, "all regions: "), limitText(r.global_limit)) : null);
      return h("tr", { "data-rule": r.id }, h("td", {}, h("code", {}, r.id), r.name && r.name !== r.id ? h("div", { class: "muted" }, r.name) : null),
        h("td", {}, match.length ? match.join(" ") : "everything"), h("td", {}, r.dimension), h("td", {}, limit),
        h("td", {}, r.shadow ? tag("shadow") : null, r.global_limit ? tag("global") : null, r.by_tier ? tag("tiered") : null));
    }, (p.envoy_domains || []).length ? "Envoy domains: " + p.envoy_domains.join(", ") : "no rules");
    rows($("tiers-body"), p.tiers || [], (t) => h("tr", { "data-tier": t.name },
      h("td", {}, t.name, t.name === p.default_tier ? tag("default") : null), h("td", {}, limitText(t.limit))), "no tiers");
    rows($("overrides-body"), p.overrides || [], (o) => h("tr", { "data-override": o.value },
      h("td", {}, `${o.kind} `, h("code", {}, o.value)),
      h("td", {}, o.tier ? "tier " + o.tier : null, ...Object.entries(o.limits || {}).map(([id, l]) => h("div", {}, h("code", {}, id), ": " + limitText(l)))),
      h("td", {}, o.source === "file" ? "configuration file" : "control plane " + (o.id || "")),
      h("td", {}, o.expires_at ? when(o.expires_at) : "never")), "no active overrides");
    rows($("throttles-body"), p.throttles || [], (t) => h("tr", { "data-throttle": t.id },
      h("td", {}, h("code", {}, t.id)), h("td", {}, t.scope + (t.target ? " " + t.target : "")),
      h("td", {}, `${t.percent}%`), h("td", {}, t.expires_at ? when(t.expires_at) : "never")),
    p.control_plane ? "no active emergency throttles" : "no emergency throttles (they are set through the control plane, which is off)");
  }

  async function refreshSync() {
    let s;
    try {
      s = await api("/internal/sync");
    } catch (e) {
      if (e.status === 401) throw e;
      $("regions").hidden = true; // no sync of global limits here
      return;
    }
    $("regions").hidden = false;
    rows($("regions-body"), s.peers || [], (p) => h("tr", { "data-region": p.region, "data-sync-lag-ms": p.sync_lag_ms },
      h("td", {}, p.region), h("td", {}, p.last_sync ? `${count(p.sync_lag_ms)} ms` : "not heard from"),
      h("td", {}, when(p.last_sync)), h("td", {}, count(p.pending_events)), h("td", {}, count(p.messages))), "no other region heard from yet");
    $("regions-self").textContent = `This instance: region ${s.region}, ${s.connected ? "connected" : "not connected"} to NATS, ` +
      `${count(s.pending_events)} counts waiting to be sent.`;
  }

  const EVENT_TYPES = ["burst_detected_blocked", "burst_detected_warning", "store_fallback", "rate_limit_exceeded"];
  const EVENT_NAMES = { burst_detected_blocked: "burst, blocked", burst_detected_warning: "burst, warning",
    store_fallback: "decided without the store", rate_limit_exceeded: "denied" };
  const ANOMALY_NAMES = { requests_spike: "anomaly: checks spike", block_rate_spike: "anomaly: blocks spike" };
  const CHANGE_NAMES = { emergency_throttle: "emergency throttle", control_plane_change: "control plane change",
    rate_limit_config_updated: "configuration applied", rate_limit_config_rejected: "configuration rejected" };
  async function refreshEvents() {
    const ev = await api("/api/v1/events", [["limit", "30"], ...EVENT_TYPES.map((t) => ["type", t])]);
    const list = (ev.events || []).map((e) => ({ time: e.time, what: EVENT_NAMES[e.type] || e.type, type: e.type,
      who: e.client_id || e.user || e.ip || e.api_key || "",
      detail: [e.rule && "rule " + e.rule, e.resource, e.count && e.count + " denials", e.reason].filter(Boolean).join(", ") }));
    // Anomalies: a minute of a client on a resource far above its
    // baseline, in checks or in the share blocked.
    for (const a of anomalies) {
      const rate = a.kind === "block_rate_spike", fig = (v) => (rate ? pct(v) + " blocked" : SVG.fmt(v) + " checks/min");
      list.push({ time: a.time, what: ANOMALY_NAMES[a.kind] || "anomaly: " + a.kind, type: "anomaly", who: a.client_id || "(all clients)",
        detail: [a.resource, a.region && "in " + a.region, `${fig(a.observed)}, usually ${fig(a.baseline)}`].filter(Boolean).join(", ") });
    }

    list.sort((x, y) => new Date(y.time) - new Date(x.time));
    rows($("events-body"), list.slice(0, 10), (e) => h("tr", { "data-type": e.type },
      h("td", {}, when(e.time)), h("td", {}, e.what), h("td", {}, h("code", {}, e.who)), h("td", {}, typeof e.detail === "string" ? e.detail : JSON.stringify(e.detail))),
    "none recently (bursts of denials, checks decided without the store, denials and detected anomalies show here)");
    // Changes of the range: configurations, list entries, control plane
    // changes and emergency throttles, newest first.
    rows($("changes-body"), changes.slice(0, 10), (c) => h("tr", { "data-kind": c.kind },
      h("td", {}, when(c.time)), h("td", {}, CHANGE_NAMES[c.kind] || c.kind.replaceAll("_", " ")), h("td", {}, c.detail)),
    "none in this range (configurations applied or rejected, list entries, control plane changes and emergency throttles show here)");
  }

  // tick refreshes every part; the policy and the version every fifth
  // time, or at once when full is set. The timer calls it with no
  // argument; the page's own calls (full true or false) are not lost to a
  // refresh under way.
  let n = 0, running = false, again = false;
  async function tick(full) {
    if (waitingForToken) return;
    if (running) {
      // Asked for (a range chosen, a token given), not the timer's: once
      // more when this one ends.
      if (full !== undefined) again = true;
      return;
    }
    running = true;
    const now = Date.now();
    const slow = full || n % 5 === 0;
    n++;
    // The events list shows the range's anomalies and changes: it waits
    // for the range's answer.
    const range = refreshRange(now);
    const parts = [refreshLive(now), range, range.catch(() => {}).then(refreshEvents), refreshSync()];
    if (slow) {
      parts.push(refreshPolicy());
      parts.push(api("/healthz").then((b) => { $("version").textContent = b.version ? "version " + b.version : ""; }));
    }
    const results = await Promise.allSettled(parts);
    running = false;
    const failed = results.filter((r) => r.status === "rejected").map((r) => r.reason);
    if (failed.some((e) => e.status === 401)) return;
    const missing = failed.find((e) => e.status === 404);
    if (missing) note("Analytics are not served by this Sluice (" + missing.message + "): the charts stay empty.");
    else if (failed.length) note("Could not refresh: " + failed[0].message);
    else note("");
    $("updated").textContent = "updated " + new Date(now).toLocaleTimeString();
    document.body.dataset.refreshed = String(n);
    if (again) {
      again = false;
      tick(true);
    }
  }

  $("range").addEventListener("change", () => tick(false));
  tick(true);
  setInterval(() => tick(), POLL_MS);
})();
