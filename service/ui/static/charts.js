/* ftq dashboard: a small SVG line chart (axes, grid, legend, hover read-out, linear or log y), no library. */
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640;
  const H = 260;
  const M = { left: 58, right: 16, bottom: 34 };
  const LEGEND_ROW = 16;
  // Past this many points a series is thinned for drawing (every point still counts in data-count).
  const MAX_DRAWN = 2000;
  // Colours for one line per run; a run keeps its colour while the selection around it changes.
  const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"];

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

  // Log-axis ticks between the values lo and hi: 1-2-5 per decade, every digit when that gives too
  // few, and plain nice ticks when the range is inside one short stretch of a decade.
  function logTicks(lo, hi) {
    const pick = (mantissas) => {
      const out = [];
      for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) {
        for (const m of mantissas) {
          const v = Number((m * 10 ** k).toPrecision(12));
          if (v >= lo && v <= hi) out.push(v);
        }
      }
      return out;
    };
    let out = pick([1, 2, 5]);
    if (out.length < 3) out = pick([1, 2, 3, 4, 5, 6, 7, 8, 9]);
    if (out.length < 3) out = ticks(lo, hi, 4).filter((v) => v > 0);
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

  // TensorBoard's smoothing: an exponential moving average, debiased so that the first points are not
  // pulled towards zero. weight 0 returns the points unchanged.
  function ema(points, weight) {
    if (!(weight > 0)) return points;
    let last = 0;
    return points.map(([x, y], i) => {
      last = last * weight + (1 - weight) * y;
      return [x, last / (1 - weight ** (i + 1))];
    });
  }

  // Legend entries laid out in rows that fit the width; the plot starts below the last row.
  function legendLayout(series) {
    const entries = [];
    let lx = M.left;
    let row = 0;
    for (const sr of series.filter((x) => !x.faint)) {
      const label = `${sr.name} (${sr.points.length})`;
      const width = 30 + 6.6 * label.length;
      if (lx + width > W - M.right && lx > M.left) {
        row += 1;
        lx = M.left;
      }
      entries.push({ sr, label, x: lx, y: 15 + row * LEGEND_ROW });
      lx += width;
    }
    return { entries, top: 28 + row * LEGEND_ROW };
  }

  /**
   * Draws into `container`: series = [{name, key, color, points: [[x, y], ...], markers, faint, title}].
   * A faint series (the raw line under a smoothed one) is drawn thin and pale, outside the legend
   * and the counts. The <svg> carries data-points (points of the other series), data-y-scale and
   * data-series-count; each series' path carries data-count.
   */
  function render(container, {
    series, yFormat = FTQ.num, xLabel = "step", emptyText = "no points yet", yScale = "linear",
  }) {
    const log = yScale === "log";
    // A log axis cannot place zero or negative values; they are left out of the drawing.
    const shown = series.map((sr) => ({ ...sr, points: log ? sr.points.filter((p) => p[1] > 0) : sr.points }));
    const counted = shown.filter((sr) => !sr.faint);
    const all = shown.flatMap((sr) => sr.points);
    const { entries, top } = legendLayout(shown);
    const svg = s("svg", {
      viewBox: `0 0 ${W} ${H}`, role: "img", preserveAspectRatio: "xMidYMid meet",
      "data-points": counted.reduce((n, sr) => n + sr.points.length, 0),
      "data-series-count": counted.length,
      "data-y-scale": log ? "log" : "linear",
      "aria-label": counted.map((sr) => `${sr.name}: ${sr.points.length} points`).join(", "),
    });
    const pw = W - M.left - M.right;
    const ph = H - top - M.bottom;
    if (all.length === 0) {
      svg.append(s("rect", { x: M.left, y: top, width: pw, height: ph, fill: "none", class: "axis" }));
      svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty-note" }, emptyText));
      container.replaceChildren(svg);
      return;
    }
    let x0 = Math.min(...all.map((p) => p[0]));
    let x1 = Math.max(...all.map((p) => p[0]));
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    const yMin = Math.min(...all.map((p) => p[1]));
    const yMax = Math.max(...all.map((p) => p[1]));
    // The y axis works in t = y (linear) or t = log10(y) (log); padding is added in t.
    const T = log ? Math.log10 : (v) => v;
    let t0 = T(yMin);
    let t1 = T(yMax);
    if (t1 === t0) { const d = log ? 0.05 : Math.abs(t0) * 0.1 || 1; t0 -= d; t1 += d; }
    const pad = (t1 - t0) * 0.06;
    t0 -= pad;
    t1 += pad;
    if (!log && t0 < 0 && yMin >= 0) t0 = 0; // losses and rates are never negative
    const X = (v) => M.left + ((v - x0) / (x1 - x0)) * pw;
    const Y = (v) => top + ph - ((T(v) - t0) / (t1 - t0)) * ph;
    const yTicks = log ? logTicks(10 ** t0, 10 ** t1) : ticks(t0, t1, 5);

    const grid = s("g", { class: "y-axis" });
    for (const t of yTicks) {
      grid.append(s("line", { x1: M.left, x2: M.left + pw, y1: Y(t), y2: Y(t), class: "grid" }));
      grid.append(s("text", { x: M.left - 6, y: Y(t) + 4, "text-anchor": "end", class: "tick" }, yFormat(t)));
    }
    for (const t of ticks(x0, x1, 6).filter((v) => Number.isInteger(v))) {
      grid.append(s("line", { x1: X(t), x2: X(t), y1: top, y2: top + ph, class: "grid" }));
      grid.append(s("text", { x: X(t), y: top + ph + 16, "text-anchor": "middle" }, String(t)));
    }
    grid.append(s("text", { x: M.left + pw, y: H - 4, "text-anchor": "end" }, xLabel));
    if (log) grid.append(s("text", { x: M.left, y: H - 4, "text-anchor": "start" }, "log scale"));
    svg.append(grid);
    svg.append(s("rect", { x: M.left, y: top, width: pw, height: ph, fill: "none", class: "axis" }));

    // Faint lines first, so that the lines they sit under are drawn over them.
    for (const sr of [...shown.filter((x) => x.faint), ...counted]) {
      const drawn = thin(sr.points);
      const d = drawn.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join("");
      svg.append(s("path", {
        d, fill: "none", stroke: sr.color, "stroke-width": sr.faint ? 1.2 : 2, "stroke-linejoin": "round",
        "stroke-opacity": sr.faint ? 0.3 : null,
        "data-series": sr.key, "data-count": sr.points.length, class: sr.faint ? "series faint" : "series",
      }));
      if (sr.markers) {
        const g = s("g", { "data-series-markers": sr.key });
        for (const p of drawn) g.append(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3.5, fill: sr.color }));
        svg.append(g);
      }
    }

    const legend = s("g", { class: "legend" });
    for (const { sr, label, x, y } of entries) {
      const entry = s("g", { class: "legend-entry", "data-series": sr.key });
      // An SVG <title> is the hover text: the full name where the label is shortened.
      if (sr.title) entry.append(s("title", {}, sr.title));
      entry.append(s("rect", { x, y: y - 6, width: 14, height: 4, rx: 2, fill: sr.color }));
      entry.append(s("text", { x: x + 19, y }, label));
      legend.append(entry);
    }
    svg.append(legend);
    addHover(svg, counted, { X, x0, x1, pw, ph, top, yFormat, xLabel });
    container.replaceChildren(svg);
  }

  // A dashed guide at the nearest logged step with each series' value there.
  function addHover(svg, series, { X, x0, x1, pw, ph, top, yFormat, xLabel }) {
    const guide = s("line", { y1: top, y2: top + ph, class: "guide", visibility: "hidden" });
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
      tip.replaceChildren(s("rect", { x: tx, y: top + 4, width, height: 8 + 15 * lines.length, rx: 4 }));
      lines.forEach((l, i) => tip.append(s("text", { x: tx + 6, y: top + 19 + 15 * i }, l)));
      tip.setAttribute("visibility", "visible");
    });
    svg.addEventListener("mouseleave", () => {
      guide.setAttribute("visibility", "hidden");
      tip.setAttribute("visibility", "hidden");
    });
  }

  /**
   * The loss charts' controls (#smoothing, a range 0-0.99, and #log-scale, a checkbox), kept in
   * localStorage so that a dashboard left open or reopened keeps them. `onChange` redraws.
   */
  function lossControls(onChange) {
    const slider = document.getElementById("smoothing");
    const readout = document.getElementById("smoothing-value");
    const logBox = document.getElementById("log-scale");
    const saved = Number(localStorage.getItem("ftq.smoothing"));
    if (saved >= 0 && saved < 1) slider.value = String(saved);
    logBox.checked = localStorage.getItem("ftq.logScale") === "1";
    const read = () => ({ smoothing: Number(slider.value), yScale: logBox.checked ? "log" : "linear" });
    const show = () => { readout.textContent = Number(slider.value).toFixed(2); };
    show();
    slider.addEventListener("input", () => {
      localStorage.setItem("ftq.smoothing", slider.value);
      show();
      onChange(read());
    });
    logBox.addEventListener("change", () => {
      localStorage.setItem("ftq.logScale", logBox.checked ? "1" : "0");
      onChange(read());
    });
    return read;
  }

  return { render, ema, lossControls, PALETTE };
})();
