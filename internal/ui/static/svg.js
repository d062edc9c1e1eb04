// Charts drawn as inline SVG, with no library. Each chart carries its data
// in data-* attributes (data-allowed, data-blocked, data-name...), so that
// what is drawn can be read back by a test or a curious operator.
"use strict";

const SVG = (() => {
  const NS = "http://www.w3.org/2000/svg";

  // el makes an SVG element with attributes and children (elements or
  // strings, which become text).
  function el(name, attrs, ...children) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }

  // niceMax rounds v up to 1, 2 or 5 times a power of ten.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function fmt(v) {
    if (Number.isInteger(v) && v < 1e4) return String(v);
    if (v >= 1e6) return (v / 1e6).toFixed(v >= 1e7 ? 0 : 1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(v >= 1e4 ? 0 : 1) + "k";
    if (v >= 10 || v === 0) return String(Math.round(v));
    return String(Number(v.toFixed(v >= 1 ? 1 : 2)));
  }

  // frame draws the y grid (5 steps, labelled) of a chart of width w and
  // height h whose values go from 0 to max, and returns the group.
  function frame(w, h, pad, max, label) {
    const g = el("g", { class: "frame" });
    // niceMax gives 1, 2 or 5 times a power of ten: fifths of it are
    // round numbers.
    for (let i = 0; i <= 5; i++) {
      const y = pad.top + (h - pad.top - pad.bottom) * (1 - i / 5);
      g.append(el("line", { class: "grid-line", x1: pad.left, x2: w - pad.right, y1: y, y2: y }));
      g.append(el("text", { x: pad.left - 4, y: y + 4, "text-anchor": "end" }, label(max * i / 5)));
    }
    return g;
  }

  // stackedBars draws one bar per point, allowed below blocked, scaled by
  // rate(point) (checks per second). points: [{t: Date, allowed, blocked,
  // seconds}]; the svg carries the sums of the raw counts.
  function stackedBars(points, opts) {
    const w = opts.width || 420, h = opts.height || 150;
    const pad = { top: 8, right: 6, bottom: 20, left: 40 };
    const perSec = (p, n) => n / Math.max(1, p.seconds || 60);
    const max = niceMax(Math.max(0, ...points.map((p) => perSec(p, p.allowed + p.blocked))));
    const sum = (k) => points.reduce((a, p) => a + p[k], 0);
    const svg = el("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", class: "bars",
      "aria-label": opts.label, "data-allowed": sum("allowed"), "data-blocked": sum("blocked") });
    svg.append(frame(w, h, pad, max, (v) => fmt(v) + "/s"));
    const n = Math.max(points.length, opts.slots || 1);
    const slot = (w - pad.left - pad.right) / n;
    const ih = h - pad.top - pad.bottom;
    points.forEach((p, i) => {
      const x = pad.left + i * slot + slot * 0.15, bw = slot * 0.7;
      const ha = ih * perSec(p, p.allowed) / max, hb = ih * perSec(p, p.blocked) / max;
      const base = h - pad.bottom;
      const g = el("g", { class: "point", "data-t": p.t.toISOString(), "data-allowed": p.allowed, "data-blocked": p.blocked },
        el("title", {}, `${p.t.toLocaleTimeString()}: ${p.allowed} allowed, ${p.blocked} blocked`),
        el("rect", { class: "allowed", x, width: bw, y: base - ha, height: ha }),
        el("rect", { class: "blocked", x, width: bw, y: base - ha - hb, height: hb }));
      svg.append(g);
      if (i === 0 || i === points.length - 1) {
        svg.append(el("text", { x: x + bw / 2, y: h - 6, "text-anchor": "middle" },
          p.t.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })));
      }
    });
    return svg;
  }

  // rateLine draws blocked/total of each point as a line over time.
  // points: [{t: Date, total, blocked}].
  function rateLine(points, opts) {
    const w = opts.width || 560, h = opts.height || 180;
    const pad = { top: 8, right: 10, bottom: 20, left: 44 };
    const rate = (p) => (p.total > 0 ? p.blocked / p.total : 0);
    const max = Math.min(1, niceMax(Math.max(0.01, ...points.map(rate))));
    const t0 = opts.start.getTime(), t1 = opts.end.getTime();
    const X = (t) => pad.left + (w - pad.left - pad.right) * (t - t0) / Math.max(1, t1 - t0);
    const Y = (r) => h - pad.bottom - (h - pad.top - pad.bottom) * r / max;
    const total = points.reduce((a, p) => a + p.total, 0), blocked = points.reduce((a, p) => a + p.blocked, 0);
    const svg = el("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", class: "rate",
      "aria-label": opts.label, "data-total": total, "data-blocked": blocked, "data-points": points.length });
    svg.append(frame(w, h, pad, max, (v) => (v * 100).toFixed(v * 100 >= 10 || v === 0 ? 0 : 1) + "%"));
    if (points.length > 0) {
      const xy = points.map((p) => [X(p.t.getTime() + opts.step / 2), Y(rate(p))]);
      const d = xy.map(([x, y], i) => (i ? "L" : "M") + x.toFixed(1) + "," + y.toFixed(1)).join("");
      const base = Y(0).toFixed(1);
      svg.append(el("path", { class: "area", d: `${d}L${xy[xy.length - 1][0].toFixed(1)},${base}L${xy[0][0].toFixed(1)},${base}Z` }));
      svg.append(el("path", { class: "line", d }));
      points.forEach((p, i) => svg.append(el("circle", { class: "dot", cx: xy[i][0], cy: xy[i][1], r: 2.5,
        "data-t": p.t.toISOString(), "data-total": p.total, "data-blocked": p.blocked },
      el("title", {}, `${p.t.toLocaleString()}: ${p.blocked} of ${p.total} blocked`))));
    }
    for (const [t, anchor] of [[t0, "start"], [t1, "end"]]) {
      svg.append(el("text", { x: X(t), y: h - 6, "text-anchor": anchor }, opts.tick(new Date(t))));
    }
    return svg;
  }

  // hbars draws one labelled row per item: the total as a pale bar and the
  // blocked part over it. rows: [{name, total, blocked}].
  function hbars(rows, opts) {
    const w = opts.width || 560, rh = 22, nameW = 170, numW = 110;
    const h = Math.max(1, rows.length) * rh + 4;
    const max = Math.max(1, ...rows.map((r) => r.total));
    const svg = el("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", class: "hbars", "aria-label": opts.label });
    const bw = w - nameW - numW;
    rows.forEach((r, i) => {
      const y = 2 + i * rh;
      const name = r.name.length > 26 ? r.name.slice(0, 25) + "…" : r.name;
      svg.append(el("g", { class: "row", "data-name": r.name, "data-total": r.total, "data-blocked": r.blocked },
        el("title", {}, `${r.name}: ${r.blocked} blocked of ${r.total}`),
        el("text", { class: "name", x: 0, y: y + 15 }, name),
        el("rect", { class: "total", x: nameW, y: y + 3, height: rh - 8, width: bw * r.total / max }),
        el("rect", { class: "blocked", x: nameW, y: y + 3, height: rh - 8, width: bw * r.blocked / max }),
        el("text", { x: w, y: y + 15, "text-anchor": "end" }, `${fmt(r.blocked)} / ${fmt(r.total)}`)));
    });
    return svg;
  }

  // pairBars draws two bars (avg and p99, in µs) per row. rows: [{name,
  // avg, p99}].
  function pairBars(rows, opts) {
    const w = opts.width || 560, rh = 34, nameW = 110, numW = 90;
    const h = Math.max(1, rows.length) * rh + 4;
    const max = Math.max(1, ...rows.map((r) => Math.max(r.avg, r.p99)));
    const svg = el("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", class: "latency", "aria-label": opts.label });
    const bw = w - nameW - numW;
    rows.forEach((r, i) => {
      const y = 2 + i * rh;
      svg.append(el("g", { class: "row", "data-name": r.name, "data-avg-us": r.avg, "data-p99-us": r.p99 },
        el("text", { class: "name", x: 0, y: y + 20 }, r.name),
        el("rect", { class: "avg", x: nameW, y: y + 3, height: 12, width: bw * r.avg / max }),
        el("rect", { class: "p99", x: nameW, y: y + 17, height: 12, width: bw * r.p99 / max }),
        el("text", { x: w, y: y + 13, "text-anchor": "end" }, "avg " + opts.us(r.avg)),
        el("text", { x: w, y: y + 28, "text-anchor": "end" }, "p99 " + opts.us(r.p99))));
    });
    return svg;
  }

  return { el, stackedBars, rateLine, hbars, pairBars, fmt };
})();
