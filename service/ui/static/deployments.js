/* ftq dashboard, `/ui/deployments`: the caller's serving engines (GET /deployments), refreshed by polling:
base, status (why it waits or failed), devices, the adapters loaded, requests, tokens in and out, device
time; and what every engine of theirs answered since the API process started. Under them, the caller's
Tinker training clients (GET /training_clients), runs too: status (paused: saved idle), devices, rank,
device time, the last step's time on the host, when last used. */
"use strict";

(() => {
  const { h } = FTQ;
  const REFRESH_MS = 2500;
  const body = document.getElementById("deployments-body");

  // Counts as the CLI prints them: 999, 1.2k, 12k, 1.2M (the title has every digit).
  function count(n) {
    if (n === null || n === undefined) return "–";
    if (Math.abs(n) < 1000) return String(n);
    let v = n;
    for (const unit of ["k", "M", "G", "T"]) {
      v /= 1000;
      if (Math.abs(v) < 9.95) return `${v.toFixed(1)}${unit}`;
      if (Math.abs(v) < 999.5) return `${v.toFixed(0)}${unit}`;
    }
    return `${v.toFixed(0)}T`;
  }

  // The API's times here are Unix seconds.
  function since(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    return `${FTQ.duration(Date.now() / 1000 - seconds)} ago`;
  }

  function iso(seconds) {
    return seconds === null || seconds === undefined ? null : new Date(seconds * 1000).toISOString();
  }

  function row(d) {
    const why = d.status === "queued" ? d.queue_reason : d.status === "failed" ? d.error : null;
    // Under the devices, what is not the usual: a base split over several GPUs, an engine on SLURM.
    const split = [d.tensor_parallel_size > 1 ? `tensor parallel ${d.tensor_parallel_size}` : "",
      d.launcher && d.launcher !== "local" ? d.launcher : ""].filter(Boolean).join(" · ");
    const adapters = (d.adapters || []).map((a) => a.model);
    return h("tr", { dataset: { deploymentId: d.id, status: d.status } },
      h("td", {}, h("span", { class: "job-id" }, d.id)),
      h("td", { class: "paths" }, h("span", { class: "base", title: d.base }, d.base)),
      h("td", { dataset: { field: "status" } }, FTQ.badge(d.status),
        why ? h("div", { class: `why muted${d.status === "failed" ? " bad" : ""}` }, why) : null),
      h("td", { dataset: { field: "devices" } }, h("span", { class: "devices" }, `${d.device} × ${d.devices}`),
        split ? h("div", { class: "muted" }, split) : null),
      h("td", { class: "num", title: adapters.join("\n") || null, dataset: { field: "adapters" } }, String(adapters.length)),
      h("td", { class: "num", title: String(d.requests), dataset: { field: "requests" } }, count(d.requests)),
      h("td", { class: "num", title: `${d.prompt_tokens} in, ${d.completion_tokens} out`, dataset: { field: "tokens" } },
        `${count(d.prompt_tokens)} / ${count(d.completion_tokens)}`),
      h("td", { class: "num", title: `${Math.round(d.device_seconds)} device-seconds`, dataset: { field: "device-time" } },
        FTQ.duration(d.device_seconds)),
      h("td", { title: `started ${iso(d.started_at)}, last used ${iso(d.last_used)}` }, since(d.last_used)),
    );
  }

  function summary(found) {
    const counts = {};
    for (const d of found) counts[d.status] = (counts[d.status] || 0) + 1;
    return Object.entries(counts).map(([status, n]) => h("span", { class: "count" }, FTQ.badge(status), ` ${n}`));
  }

  async function refresh() {
    const listing = await FTQ.api("/deployments");
    body.replaceChildren(...listing.data.map(row));
    document.getElementById("summary").replaceChildren(...summary(listing.data));
    document.getElementById("empty").hidden = listing.data.length > 0;
    document.getElementById("deployments").dataset.count = String(listing.data.length);
    const u = listing.usage;
    document.getElementById("usage").textContent = u.requests
      ? `since ${new Date(u.since * 1000).toLocaleString()}: ${u.requests} requests, ` +
        `${count(u.prompt_tokens)} tokens in, ${count(u.completion_tokens)} out`
      : "";
    FTQ.setRefreshState(`updated ${new Date().toLocaleTimeString()}`);
  }

  const tcBody = document.getElementById("training-clients-body");

  function tcRow(t) {
    const used = Date.parse(t.last_used_at) / 1000;
    return h("tr", { dataset: { trainingClientId: t.id, status: t.status } },
      h("td", {}, h("span", { class: "job-id" }, t.id)),
      h("td", { class: "paths" }, h("span", { class: "base", title: t.base }, t.base)),
      h("td", { dataset: { field: "status" } }, FTQ.badge(t.status),
        t.status === "paused" ? h("div", { class: "why muted" }, "saved idle: its next call brings it back")
          : t.error ? h("div", { class: "why muted bad" }, t.error) : null),
      h("td", { dataset: { field: "devices" } }, h("span", { class: "devices" }, `${t.device} × ${t.devices}`)),
      h("td", { class: "num" }, String(t.lora_rank)),
      h("td", { class: "num", title: `${Math.round(t.device_seconds)} device-seconds`, dataset: { field: "device-time" } },
        FTQ.duration(t.device_seconds)),
      h("td", { class: "num", dataset: { field: "step" } },
        t.last_step_seconds === null || t.last_step_seconds === undefined ? "–" : `${t.last_step_seconds.toFixed(3)} s`),
      h("td", { title: `created ${t.created_at}, last used ${t.last_used_at}` }, since(used)),
    );
  }

  async function refreshTrainingClients() {
    const listing = await FTQ.api("/training_clients");
    tcBody.replaceChildren(...listing.data.map(tcRow));
    document.getElementById("tc-empty").hidden = listing.data.length > 0;
    document.getElementById("training-clients").dataset.count = String(listing.data.length);
  }

  FTQ.every(REFRESH_MS, refresh);
  FTQ.every(REFRESH_MS, refreshTrainingClients);
})();
