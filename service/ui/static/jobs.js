/* ftq dashboard, `/`: the jobs table, refreshed by polling GET /jobs, and the runs ticked in it
compared on one chart (their ids kept in ?compare=, so the view can be shared or reopened): the train
loss, or a metric their evaluations scored at each checkpoint (?metric=, from GET /jobs/{id}/checkpoints). */
"use strict";

(() => {
  const { h } = FTQ;
  const PAGE = 50;
  const REFRESH_MS = 2500;
  const body = document.getElementById("jobs-body");
  const filter = document.getElementById("status-filter");
  const more = document.getElementById("more");
  let shown = PAGE;

  const url0 = new URLSearchParams(window.location.search);
  const selected = (url0.get("compare") || "").split(",").filter(Boolean);
  const runs = new Map(); // job id -> {job, points: [[step, loss]], lastStep, complete}
  const colours = new Map(); // job id -> colour, kept while the job stays selected
  let compareDirty = true;
  const metricPick = document.getElementById("compare-metric");
  let metric = url0.get("metric") || "";
  const scored = new Map(); // job id -> {at: ms read, rows: [{step, metrics, best}]}
  metricPick.addEventListener("change", () => {
    metric = metricPick.value;
    const url = new URL(window.location.href);
    if (metric) url.searchParams.set("metric", metric);
    else url.searchParams.delete("metric");
    history.replaceState(null, "", url.pathname + url.search);
    drawCompare();
  });

  // Each selected run's scored checkpoints, read again every 10 s while the run may still be scored.
  async function refreshScores() {
    let changed = false;
    for (const id of selected) {
      const had = scored.get(id);
      if (had && Date.now() - had.at < 10000) continue;
      try {
        const list = await FTQ.api(`/jobs/${encodeURIComponent(id)}/checkpoints`);
        scored.set(id, { at: Date.now(), rows: list.data });
        changed = true;
      } catch (e) {
        if (!(e instanceof FTQ.ApiError && e.status === 404)) throw e;
      }
    }
    const names = new Set(metric ? [metric] : []);
    for (const id of selected) for (const r of (scored.get(id) || { rows: [] }).rows) Object.keys(r.metrics || {}).forEach((n) => names.add(n));
    const want = ["", ...[...names].sort()];
    const have = [...metricPick.options].map((o) => o.value);
    if (want.join("\n") !== have.join("\n")) {
      metricPick.replaceChildren(...want.map((n) => h("option", { value: n }, n || "train loss")));
    }
    metricPick.value = metric;
    if (changed) compareDirty = true;
  }

  function colourFor(id) {
    if (!colours.has(id)) {
      const used = new Set(colours.values());
      colours.set(id, Charts.PALETTE.find((c) => !used.has(c)) || Charts.PALETTE[colours.size % Charts.PALETTE.length]);
    }
    return colours.get(id);
  }
  selected.forEach(colourFor);

  function saveSelection() {
    const url = new URL(window.location.href);
    if (selected.length) url.searchParams.set("compare", selected.join(","));
    else url.searchParams.delete("compare");
    history.replaceState(null, "", url.pathname + url.search);
    compareDirty = true;
  }

  function toggle(id, on) {
    const at = selected.indexOf(id);
    if (on && at < 0) {
      selected.push(id);
      colourFor(id);
    } else if (!on && at >= 0) {
      selected.splice(at, 1);
      colours.delete(id);
    }
    saveSelection();
    refreshCompare([]).catch((e) => FTQ.banner("error", [e.message]));
  }

  const compareOptions = Charts.lossControls(() => drawCompare());
  document.getElementById("compare-clear").addEventListener("click", () => {
    selected.splice(0);
    colours.clear();
    saveSelection();
    body.querySelectorAll("input.pick").forEach((box) => { box.checked = false; });
    drawCompare();
  });

  filter.value = new URLSearchParams(window.location.search).get("status") || "";
  filter.addEventListener("change", () => {
    const url = new URL(window.location.href);
    if (filter.value) url.searchParams.set("status", filter.value);
    else url.searchParams.delete("status");
    history.replaceState(null, "", url.pathname + url.search);
    shown = PAGE;
    refresh();
  });
  more.addEventListener("click", () => {
    shown += PAGE;
    refresh();
  });

  function row(job) {
    const latest = job.latest_metrics || {};
    const fill = h("div", { class: `fill ${job.status}` });
    fill.style.width = `${(100 * FTQ.progressFraction(job)).toFixed(1)}%`;
    const link = h("a", { href: `/ui/jobs/${encodeURIComponent(job.id)}` },
      h("span", { class: "job-name" }, job.name), h("span", { class: "job-id", title: job.id }, job.id));
    const pick = h("input", {
      type: "checkbox", class: "pick", checked: selected.includes(job.id), "aria-label": `compare ${job.id}`,
      dataset: { jobId: job.id },
    });
    pick.addEventListener("change", () => toggle(job.id, pick.checked));
    const spec = job.spec || {};
    const model = (spec.model || {}).name_or_path;
    const data = (spec.dataset || {}).name_or_path || (spec.dataset || {}).file_id;
    return h("tr", { dataset: { jobId: job.id, status: job.status } },
      h("td", { class: "pick-cell" }, pick),
      h("td", { class: "job-cell" }, link),
      h("td", {}, FTQ.badge(job.status)),
      h("td", {}, h("div", { class: "progress-cell" },
        h("div", { class: "progress" }, fill), h("span", { class: "muted" }, FTQ.progressText(job)))),
      h("td", { class: "num", dataset: { field: "loss" } }, FTQ.num(latest.loss)),
      h("td", { class: "num" }, FTQ.num(latest.eval_loss)),
      h("td", { class: "num", dataset: { field: "lr" } }, FTQ.lr(latest.learning_rate)),
      // Full paths on hover: the cell shows their last parts only.
      h("td", { class: "paths" },
        h("span", { class: "model-path", title: model || null }, FTQ.shortPath(model)),
        h("span", { class: "data-path muted", title: data || null }, FTQ.shortPath(data))),
      h("td", {}, job.launcher + (job.external_id ? ` · ${job.external_id}` : "")),
      h("td", { title: job.created_at }, FTQ.age(job.created_at)),
      h("td", {}, FTQ.took(job)),
    );
  }

  function summary(jobs) {
    const counts = {};
    for (const j of jobs) counts[j.status] = (counts[j.status] || 0) + 1;
    return Object.entries(counts).map(([status, n]) =>
      h("span", { class: "count" }, FTQ.badge(status), ` ${n}`));
  }

  async function refresh() {
    const params = new URLSearchParams({ limit: String(shown) });
    if (filter.value) params.set("status", filter.value);
    const page = await FTQ.api(`/jobs?${params}`);
    body.replaceChildren(...page.data.map(row));
    document.getElementById("summary").replaceChildren(...summary(page.data));
    document.getElementById("empty").hidden = page.data.length > 0;
    more.hidden = !page.next_cursor;
    document.getElementById("jobs").dataset.count = String(page.data.length);
    await refreshCompare(page.data);
    FTQ.setRefreshState(`updated ${new Date().toLocaleTimeString()}`);
  }

  // Reads the new loss points of every selected run (after_step, as the job page does; a finished run
  // is read once) and redraws the comparison when anything changed.
  async function refreshCompare(listed) {
    for (const job of listed) if (runs.has(job.id)) runs.get(job.id).job = job;
    for (const id of [...selected]) {
      let run = runs.get(id);
      if (!run) {
        run = { job: listed.find((j) => j.id === id) || null, points: new Map(), lastStep: -1, complete: false };
        runs.set(id, run);
      }
      if (!run.job) {
        try {
          run.job = await FTQ.api(`/jobs/${encodeURIComponent(id)}`);
        } catch (e) {
          // A stale or mistyped id in ?compare= leaves the comparison; the table keeps refreshing.
          if (!(e instanceof FTQ.ApiError && e.status === 404)) throw e;
          runs.delete(id);
          toggle(id, false);
          continue;
        }
      }
      if (run.complete) continue;
      let after = run.lastStep >= 0 ? run.lastStep - 1 : -1;
      for (;;) {
        const page = await FTQ.api(`/jobs/${encodeURIComponent(id)}/metrics?after_step=${after}&limit=1000`);
        for (const pt of page.data) {
          if (pt.loss != null) run.points.set(pt.step, pt.loss);
          run.lastStep = Math.max(run.lastStep, pt.step);
        }
        if (page.data.length) compareDirty = true;
        if (page.complete) run.complete = true;
        if (page.data.length < 1000 || page.next_after_step === after) break;
        after = page.next_after_step;
      }
    }
    await refreshScores();
    if (compareDirty) drawCompare();
  }

  function drawCompare() {
    compareDirty = false;
    const section = document.getElementById("compare");
    section.hidden = selected.length === 0;
    if (!selected.length) return;
    const { smoothing, yScale } = compareOptions();
    const series = [];
    for (const id of selected) {
      const run = runs.get(id);
      if (!run || !run.job) continue;
      const points = metric
        ? ((scored.get(id) || { rows: [] }).rows).filter((r) => r.metrics && metric in r.metrics).map((r) => [r.step, r.metrics[metric]])
        : [...run.points.entries()].sort((a, b) => a[0] - b[0]);
      const colour = colourFor(id);
      // Runs of one spec share a name: the label adds the id's end, the hover text has the full id.
      const base = { name: `${run.job.name} ·${id.slice(-6)}`, title: `${run.job.name} (${id}, ${run.job.status})`, color: colour };
      if (smoothing > 0) series.push({ ...base, key: `${id}-raw`, points, faint: true });
      series.push({ ...base, key: id, points: Charts.ema(points, smoothing) });
    }
    document.getElementById("compare-title").textContent = metric || "Train loss";
    document.getElementById("compare-what").textContent =
      `${selected.length} run${selected.length === 1 ? "" : "s"}, by step${smoothing > 0 ? `, smoothed ${smoothing.toFixed(2)}` : ""}`;
    const emptyText = metric ? `no checkpoint scored ${metric} yet` : "no loss points yet";
    Charts.render(document.getElementById("chart-compare"), { series, yScale, emptyText });
  }

  FTQ.every(REFRESH_MS, refresh);
})();
