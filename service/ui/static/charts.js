/* ftq dashboard: a small SVG line chart (axes, grid, legend, hover read-out), no library. */
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640;
  const H = 260;
  const M = { left: 58, right: 16, top: 28, bottom: 34 };
  // Past this many points a series is thinned for drawing (every point still counts in data-count).
  const MAX_DRAWN = 2000;

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) el.setAttribute(k, String(v));
    }
    for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }

  // "Nice" ticks: 1, 2 or 5 times a power of ten, about `count` of them across [lo, hi].
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((f) => f * mag).find((v) => raw <= v) || 10 * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }

  function thin(points) {
    if (points.length <= MAX_DRAWN) return points;
    const stride = points.length / MAX_DRAWN;
    const out = [];
    for (let i = 0; i < MAX_DRAWN; i++) out.push(points[Math.floor(i * stride)]);
    out.push(points[points.length - 1]);
    return out;
  }

  /**
   * Draws into `container`: series = [{name, key, color, points: [[x, y], ...], markers}].
   * The <svg> carries data-points (all points drawn), each series' path data-count.
   */
  function render(container, { series, yFormat = FTQ.num, xLabel = "step", emptyText = "no points yet" }) {
    const all = series.flatMap((sr) => sr.points);
    const svg = s("svg", {
      viewBox: `0 0 ${W} ${H}`, role: "img", preserveAspectRatio: "xMidYMid meet",
      "data-points": all.length, "aria-label": series.map((sr) => `${sr.name}: ${sr.points.length} points`).join(", "),
    });
    const pw = W - M.left - M.right;
    const ph = H - M.top - M.bottom;
    if (all.length === 0) {
      svg.append(s("rect", { x: M.left, y: M.top, width: pw, height: ph, fill: "none", class: "axis" }));
      svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty-note" }, emptyText));
      container.replaceChildren(svg);
      return;
    }
    let x0 = Math.min(...all.map((p) => p[0]));
    let x1 = Math.max(...all.map((p) => p[0]));
    let y0 = Math.min(...all.map((p) => p[1]));
    let y1 = Math.max(...all.map((p) => p[1]));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.06;
    y0 -= pad;
    y1 += pad;
    if (y0 < 0 && Math.min(...all.map((p) => p[1])) >= 0) y0 = 0; // losses and rates are never negative
    const X = (v) => M.left + ((v - x0) / (x1 - x0)) * pw;
    const Y = (v) => M.top + ph - ((v - y0) / (y1 - y0)) * ph;

    const grid = s("g", {});
    for (const t of ticks(y0, y1, 5)) {
      grid.append(s("line", { x1: M.left, x2: M.left + pw, y1: Y(t), y2: Y(t), class: "grid" }));
      grid.append(s("text", { x: M.left - 6, y: Y(t) + 4, "text-anchor": "end" }, yFormat(t)));
    }
    for (const t of ticks(x0, x1, 6).filter((v) => Number.isInteger(v))) {
      grid.append(s("line", { x1: X(t), x2: X(t), y1: M.top, y2: M.top + ph, class: "grid" }));
      grid.append(s("text", { x: X(t), y: M.top + ph + 16, "text-anchor": "middle" }, String(t)));
    }
    grid.append(s("text", { x: M.left + pw, y: H - 4, "text-anchor": "end" }, xLabel));
    svg.append(grid);
    svg.append(s("rect", { x: M.left, y: M.top, width: pw, height: ph, fill: "none", class: "axis" }));

    const legend = s("g", { class: "legend" });
    let lx = M.left;
    for (const sr of series) {
      const drawn = thin(sr.points);
      const d = drawn.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join("");
      svg.append(s("path", {
        d, fill: "none", stroke: sr.color, "stroke-width": 2, "stroke-linejoin": "round",
        "data-series": sr.key, "data-count": sr.points.length, class: "series",
      }));
      if (sr.markers) {
        const g = s("g", { "data-series-markers": sr.key });
        for (const p of drawn) g.append(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3.5, fill: sr.color }));
        svg.append(g);
      }
      legend.append(s("rect", { x: lx, y: 9, width: 14, height: 4, rx: 2, fill: sr.color }));
      const label = s("text", { x: lx + 19, y: 15 }, `${sr.name} (${sr.points.length})`);
      legend.append(label);
      lx += 30 + 7.2 * `${sr.name} (${sr.points.length})`.length;
    }
    svg.append(legend);
    addHover(svg, series, { X, Y, x0, x1, pw, ph, yFormat, xLabel });
    container.replaceChildren(svg);
  }

  // A dashed guide at the nearest logged step with each series' value there.
  function addHover(svg, series, { X, x0, x1, pw, ph, yFormat, xLabel }) {
    const guide = s("line", { y1: M.top, y2: M.top + ph, class: "guide", visibility: "hidden" });
    const tip = s("g", { class: "tip", visibility: "hidden" });
    svg.append(guide, tip);
    const steps = [...new Set(series.flatMap((sr) => sr.points.map((p) => p[0])))].sort((a, b) => a - b);
    svg.addEventListener("mousemove", (ev) => {
      const box = svg.getBoundingClientRect();
      const px = ((ev.clientX - box.left) / box.width) * W;
      const want = x0 + ((px - M.left) / pw) * (x1 - x0);
      let best = steps[0];
      for (const st of steps) if (Math.abs(st - want) < Math.abs(best - want)) best = st;
      const lines = [`${xLabel} ${best}`];
      for (const sr of series) {
        const hit = sr.points.find((p) => p[0] === best);
        if (hit) lines.push(`${sr.name} ${yFormat(hit[1])}`);
      }
      const gx = X(best);
      guide.setAttribute("x1", gx);
      guide.setAttribute("x2", gx);
      guide.setAttribute("visibility", "visible");
      const width = 12 + 6.6 * Math.max(...lines.map((l) => l.length));
      const tx = gx + width + 10 > W - M.right ? gx - width - 8 : gx + 8;
      tip.replaceChildren(s("rect", { x: tx, y: M.top + 4, width, height: 8 + 15 * lines.length, rx: 4 }));
      lines.forEach((l, i) => tip.append(s("text", { x: tx + 6, y: M.top + 19 + 15 * i }, l)));
      tip.setAttribute("visibility", "visible");
    });
    svg.addEventListener("mouseleave", () => {
      guide.setAttribute("visibility", "hidden");
      tip.setAttribute("visibility", "hidden");
    });
  }

  return { render };
})();
