/* ftq dashboard, `/`: the jobs table, refreshed by polling GET /jobs. */
"use strict";

(() => {
  const { h } = FTQ;
  const PAGE = 50;
  const REFRESH_MS = 2500;
  const body = document.getElementById("jobs-body");
  const filter = document.getElementById("status-filter");
  const more = document.getElementById("more");
  let shown = PAGE;

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
      h("span", { class: "job-name" }, job.name), h("span", { class: "job-id" }, job.id));
    return h("tr", { dataset: { jobId: job.id, status: job.status } },
      h("td", {}, link),
      h("td", {}, FTQ.badge(job.status)),
      h("td", {}, h("div", { class: "progress-cell" },
        h("div", { class: "progress" }, fill), h("span", { class: "muted" }, FTQ.progressText(job)))),
      h("td", { class: "num", dataset: { field: "loss" } }, FTQ.num(latest.loss)),
      h("td", { class: "num" }, FTQ.num(latest.eval_loss)),
      h("td", { class: "num" }, FTQ.num(latest.learning_rate)),
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
    FTQ.setRefreshState(`updated ${new Date().toLocaleTimeString()}`);
  }

  FTQ.every(REFRESH_MS, refresh);
})();
