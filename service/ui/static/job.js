/* ftq dashboard, `/ui/jobs/{id}`: live loss / eval-loss / LR / grad-norm / tokens-per-second charts,
samples by step, log tail, plan, checkpoints, artifacts (download links), cancel.

Polling is incremental: metrics with after_step, the log with byte offsets; each stops once the
API says it is complete. The one exception is the last metric point, asked for again each time,
because a step's eval_loss can be stored after its train loss (they share a row).
*/
"use strict";

(() => {
  const { h } = FTQ;
  const POLL_MS = 1500;
  const LOG_KEEP_CHARS = 400000; // the tail kept on the page; older text is dropped from the DOM
  const jobId = decodeURIComponent(window.location.pathname.split("/").filter(Boolean).pop());
  const enc = encodeURIComponent(jobId);

  const state = {
    job: null,
    points: new Map(), // step -> Point
    lastStep: -1,
    metricsComplete: false,
    logOffset: 0,
    logComplete: false,
    planShown: false,
    outputsRead: { status: null, at: 0 }, // the job status the outputs card was last read for, and when
    exportsActive: false, // an export of this job is queued or running: keep polling
    eventsAfter: 0, // the cursor of GET /jobs/{id}/events
    eventsDone: false,
    samples: [], // every sample read so far, by step then prompt index
    samplesAfter: -1,
    samplesComplete: false,
    artifactsRead: { status: null, at: 0 }, // the same for the artifacts card
  };
  const OUTPUTS_MS = 10000; // how often a running job's checkpoints and artifacts are read again

  document.getElementById("crumb-id").textContent = jobId;
  const cancelButton = document.getElementById("cancel");
  cancelButton.addEventListener("click", cancel);

  async function cancel() {
    if (!window.confirm(`Cancel ${jobId}? A running training is stopped (its checkpoints stay).`)) return;
    cancelButton.disabled = true;
    try {
      const job = await FTQ.api(`/jobs/${enc}/cancel`, { method: "POST" });
      showJob(job);
    } catch (e) {
      FTQ.banner("error", [h("strong", {}, "Cancel failed: "), e.message]);
      cancelButton.disabled = false;
    }
  }

  function meta(label, value, title) {
    return h("div", {}, h("dt", {}, label), h("dd", { title: title || String(value) }, value));
  }

  // The tracker runs the job's `integrations` made (W&B, MLflow, TensorBoard): a link where there is a URL.
  function trackerMeta(trackers) {
    return Object.entries(trackers || {}).map(([name, run]) => {
      const label = run.name || run.id || run.dir || name;
      const safeUrl = run.url && /^https?:\/\//.test(run.url) ? run.url : null;
      const value = safeUrl ? h("a", { href: safeUrl, target: "_blank", rel: "noopener noreferrer" }, label) : label;
      return h("div", { dataset: { tracker: name } }, h("dt", {}, name), h("dd", { title: run.url || label }, value));
    });
  }

  function showJob(job) {
    state.job = job;
    document.title = `ftq · ${job.name}`;
    document.getElementById("job-name").textContent = job.name;
    document.getElementById("job-status").replaceWith(
      Object.assign(FTQ.badge(job.status), { id: "job-status" }));
    const terminal = FTQ.TERMINAL.includes(job.status);
    cancelButton.hidden = terminal;
    cancelButton.disabled = job.status === "cancelling";
    cancelButton.textContent = job.status === "cancelling" ? "Cancelling…" : "Cancel job";

    const fill = document.getElementById("progress-fill");
    fill.className = `fill ${job.status}`;
    fill.style.width = `${(100 * FTQ.progressFraction(job)).toFixed(1)}%`;
    const p = job.progress || {};
    const eta = job.status === "running" && p.eta_seconds != null ? ` · eta ${FTQ.duration(p.eta_seconds)}` : "";
    const epoch = p.epoch != null ? ` · epoch ${FTQ.num(p.epoch, 3)}` : "";
    // A queued job says where it stands and why it waits (the scheduler's queue.reason).
    const q = job.queue;
    const waits = q
      ? ` · waiting: ${q.reason}${q.position != null ? ` (#${q.position})` : ""}` +
        (q.estimated_start ? ` · expected to start ${new Date(q.estimated_start).toLocaleString()}` : "")
      : "";
    document.getElementById("progress-text").textContent = `${FTQ.progressText(job)}${epoch}${eta}${waits}`;

    const spec = job.spec || {};
    const latest = job.latest_metrics || {};
    const res = spec.resources || {};
    const dist = spec.distributed || {};
    document.getElementById("job-meta").replaceChildren(
      meta("job id", job.id),
      meta("owner", job.owner),
      // Paths are shown by their last parts; the full path is the hover text.
      meta("model", FTQ.shortPath((spec.model || {}).name_or_path), (spec.model || {}).name_or_path),
      meta("dataset", FTQ.shortPath((spec.dataset || {}).name_or_path || (spec.dataset || {}).file_id),
        (spec.dataset || {}).name_or_path || (spec.dataset || {}).file_id),
      meta("launch", `${res.launcher} · ${res.device} · ${res.num_nodes}×${res.processes_per_node} · ${dist.strategy}`),
      meta("external id", job.external_id || "–"),
      meta("created", FTQ.age(job.created_at), job.created_at),
      meta("ran for", FTQ.took(job)),
      meta("usage", job.usage ? `${FTQ.num(job.usage.device_seconds, 4)} device-seconds` : "–"),
      meta("latest loss", FTQ.num(latest.loss)),
      meta("latest lr", FTQ.lr(latest.learning_rate)),
      ...trackerMeta(job.trackers),
    );
    const errorBox = document.getElementById("error-box");
    if (job.error) {
      const exit = job.error.exit_code != null ? ` (exit code ${job.error.exit_code})` : "";
      errorBox.replaceChildren(h("strong", {}, job.error.code), `: ${job.error.message}${exit}`);
      errorBox.hidden = false;
    } else {
      errorBox.hidden = true;
    }
    const specEl = document.getElementById("spec");
    if (!specEl.textContent) specEl.textContent = JSON.stringify(job.spec, null, 2);
  }

  async function pollMetrics() {
    // Ask again for the last point we hold (see the note at the top); every other point is new.
    let after = state.lastStep >= 0 ? state.lastStep - 1 : -1;
    let changed = false;
    for (;;) {
      const page = await FTQ.api(`/jobs/${enc}/metrics?after_step=${after}&limit=1000`);
      for (const pt of page.data) {
        state.points.set(pt.step, pt);
        state.lastStep = Math.max(state.lastStep, pt.step);
        changed = true;
      }
      if (page.complete) state.metricsComplete = true;
      if (page.data.length < 1000 || page.next_after_step === after) break;
      after = page.next_after_step;
    }
    if (changed || !document.querySelector("#chart-loss svg") || (state.metricsComplete && !state.points.size)) {
      drawCharts();
    }
  }

  const lossOptions = Charts.lossControls(() => drawCharts());

  function drawCharts() {
    const pts = [...state.points.values()].sort((a, b) => a.step - b.step);
    const series = (key) => pts.filter((p) => p[key] != null).map((p) => [p.step, p[key]]);
    const ended = state.job && FTQ.TERMINAL.includes(state.job.status);
    const emptyText = ended ? "this job logged no points" : "no points yet";
    const { smoothing, yScale } = lossOptions();
    const loss = series("loss");
    const train = smoothing > 0
      ? [
        { name: "train loss, raw", key: "loss-raw", color: "#2563eb", points: loss, faint: true },
        { name: `train loss (smoothed ${smoothing.toFixed(2)})`, key: "loss", color: "#2563eb", points: Charts.ema(loss, smoothing) },
      ]
      : [{ name: "train loss", key: "loss", color: "#2563eb", points: loss }];
    Charts.render(document.getElementById("chart-loss"), {
      series: [
        ...train,
        { name: "eval loss", key: "eval_loss", color: "#ea580c", points: series("eval_loss"), markers: true },
      ],
      yScale,
      emptyText,
    });
    Charts.render(document.getElementById("chart-lr"), {
      series: [{ name: "learning rate", key: "learning_rate", color: "#16a34a", points: series("learning_rate") }],
      yFormat: FTQ.lr,
      emptyText,
    });
    Charts.render(document.getElementById("chart-grad-norm"), {
      series: [{ name: "grad norm", key: "grad_norm", color: "#9333ea", points: series("grad_norm") }],
      emptyText,
    });
    Charts.render(document.getElementById("chart-tokens"), {
      series: [{ name: "tokens/s", key: "tokens_per_second", color: "#0891b2", points: series("tokens_per_second") }],
      yFormat: (v) => FTQ.num(v, 3),
      emptyText,
    });
    drawMethodCharts(pts, emptyText);
  }

  // Point.extra: a chart per group of names (the part before "/", or the name itself), train and eval
  // (`eval_` names, as markers) together: `rewards` holds rewards/chosen, rewards/margins, ... Train names
  // take the palette first, then eval ones, as on the loss chart (train blue, eval orange): sorted
  // together, eval_ names came first and the colours were swapped between the charts.
  const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04", "#475569"];
  function drawMethodCharts(pts, emptyText) {
    const groups = new Map();
    for (const p of pts) {
      for (const name of Object.keys(p.extra || {})) {
        const base = name.startsWith("eval_") ? name.slice(5) : name;
        const group = base.split("/")[0];
        if (!groups.has(group)) groups.set(group, new Set());
        groups.get(group).add(name);
      }
    }
    const section = document.getElementById("method-charts");
    section.hidden = groups.size === 0;
    for (const [group, names] of [...groups].sort()) {
      const id = `chart-extra-${group.replace(/[^A-Za-z0-9_-]/g, "_")}`;
      let chart = document.getElementById(id);
      if (!chart) {
        chart = h("div", { id, class: "chart", "data-group": group });
        section.append(h("figure", { class: "chart-card" }, h("figcaption", {}, group), chart));
      }
      const isEval = (name) => name.startsWith("eval_");
      const ordered = [...[...names].filter((n) => !isEval(n)).sort(), ...[...names].filter(isEval).sort()];
      const series = ordered.map((name, i) => ({
        name,
        key: name,
        color: COLORS[i % COLORS.length],
        points: pts.filter((p) => p.extra && p.extra[name] != null).map((p) => [p.step, p.extra[name]]),
        markers: name.startsWith("eval_"),
      }));
      Charts.render(chart, { series, yFormat: (v) => FTQ.num(v), emptyText });
    }
  }

  // A card of what the run has left (checkpoints, artifacts), read from `path` again when the job's status
  // changed and every OUTPUTS_MS while it runs (`read` holds the last read's status and time). The list
  // to show, or null: the card is current, or the list is empty and `empty` (the text while running,
  // then after) is shown.
  async function readCard(box, read, path, job, empty) {
    const running = !FTQ.TERMINAL.includes(job.status);
    if (read.status === job.status && (!running || Date.now() - read.at < OUTPUTS_MS)) return null;
    const list = await FTQ.api(path);
    read.status = job.status;
    read.at = Date.now();
    if (list.data.length) return list;
    box.replaceChildren(h("p", { class: "muted" }, running ? empty[0] : empty[1]));
    return null;
  }

  // The run's outputs: its checkpoints (GET /jobs/{id}/checkpoints), each with its full path.
  // Samples of model output and exported artifacts are not served by the API yet; when they are, they
  // are listed here, in #samples.
  // With evaluation suites, each row carries its metrics and the best one (eval.select) is marked; a
  // finished job is read again until every checkpoint is scored.
  async function showOutputs(job) {
    const suites = ((job.spec || {}).eval || {}).suites || [];
    const running = !FTQ.TERMINAL.includes(job.status) || (suites.length > 0 && state.outputsUnscored !== false);
    if (state.outputsRead.status === job.status && (!running || Date.now() - state.outputsRead.at < OUTPUTS_MS)) return;
    const list = await FTQ.api(`/jobs/${enc}/checkpoints`);
    state.outputsRead.status = job.status;
    state.outputsRead.at = Date.now();
    const box = document.getElementById("outputs");
    if (!list.data.length) {
      box.replaceChildren(h("p", { class: "muted" }, running ? "no checkpoint saved yet" : "this run saved no checkpoint"));
      return;
    }
    const names = [...new Set(list.data.flatMap((c) => Object.keys(c.metrics || {})))].sort();
    state.outputsUnscored = suites.length > 0 && list.data.some((c) => !Object.keys(c.metrics || {}).length);
    const head = h("tr", {}, h("th", {}, "checkpoint"), h("th", {}, "path"), h("th", {}, "resume"),
      ...names.map((n) => h("th", { class: "num metric" }, n)), ...(suites.length ? [h("th", {}, "best")] : []));
    const rows = list.data.map((c) => h("tr", { dataset: { step: c.step }, class: c.best ? "best" : "" },
      h("td", { class: "num" }, `step ${c.step}`),
      h("td", {}, h("code", { title: c.path }, c.path)),
      h("td", {}, c.resumable ? "resumable" : h("span", { class: "muted" }, "not resumable")),
      ...names.map((n) => h("td", { class: "num metric" }, c.metrics && n in c.metrics ? FTQ.num(c.metrics[n], 4) : "–")),
      ...(suites.length ? [h("td", { class: "best-mark" }, c.best ? "★ best" : "")] : [])));
    box.replaceChildren(h("table", { class: "outputs", id: "checkpoints" }, h("thead", {}, head), h("tbody", {}, ...rows)));
  }

  // The job's exports (GET /jobs/{id}/exports): status, kind, dtype and folder; read on every poll while
  // one is under way.
  async function showExports() {
    const list = await FTQ.api(`/jobs/${enc}/exports`);
    const box = document.getElementById("exports");
    state.exportsActive = list.data.some((e) => !FTQ.TERMINAL.includes(e.status));
    if (!list.data.length) {
      box.replaceChildren(h("p", { class: "muted" }, "no exports (ftq export ID --merged --dtype bf16)"));
      return;
    }
    const rows = list.data.map((e) => h("tr", { dataset: { export: e.id } },
      h("td", {}, h("code", {}, e.id)),
      h("td", {}, FTQ.badge(e.status)),
      h("td", {}, e.kind),
      h("td", {}, e.dtype),
      h("td", {}, h("code", {}, e.path)),
      h("td", { class: "muted" }, e.error ? `${e.error.code}: ${e.error.message}` : "")));
    box.replaceChildren(h("table", { class: "outputs", id: "exports-table" }, ...rows));
  }

  // The job's events (GET /jobs/{id}/events?after=), appended as they come; one row each.
  function eventText(e) {
    const d = e.data || {};
    const parts = [];
    if (d.step != null) parts.push(`step ${d.step}`);
    if (d.position != null) parts.push(`position ${d.position}`);
    if (d.error) parts.push(`${d.error.code}: ${d.error.message}`);
    if (d.kind) parts.push(d.kind);
    if (d.message) parts.push(d.message);
    if (d.metrics) parts.push(Object.entries(d.metrics).map(([k, v]) => `${k} ${FTQ.num(v)}`).join(", "));
    if (d.path) parts.push(d.path);
    if (d.host) parts.push(`on ${d.host}`);
    if (d.slurm_job_id) parts.push(`SLURM job ${d.slurm_job_id}`);
    if (d.reason) parts.push(d.reason);
    return parts.join(" · ");
  }

  async function pollEvents(job) {
    const box = document.getElementById("events");
    let table = document.getElementById("event-list");
    for (;;) {
      const page = await FTQ.api(`/jobs/${enc}/events?after=${state.eventsAfter}&limit=500`);
      if (page.data.length && !table) {
        table = h("table", { class: "outputs", id: "event-list" });
        box.replaceChildren(table);
      }
      for (const e of page.data) {
        const kind = e.type.replace(/^job\./, "");
        table.append(h("tr", { dataset: { type: e.type, id: e.id }, class: kind === "warning" || kind === "failed" ? "event-bad" : "" },
          h("td", { class: "muted" }, new Date(e.time).toLocaleTimeString()),
          h("td", {}, h("code", {}, e.type)),
          h("td", {}, eventText(e))));
      }
      state.eventsAfter = page.next_after;
      if (page.data.length < 500) break;
    }
    if (!table) box.replaceChildren(h("p", { class: "muted" }, "no events yet"));
    // The status was read before these events: a terminal job's last event is among them.
    state.eventsDone = FTQ.TERMINAL.includes(job.status);
  }

  // Completions of the spec's eval.sample_prompts, and a GRPO job's rollouts with their reward
  // (GET /jobs/{id}/samples), polled like the metrics: only steps after the last one read, until the API
  // says the job ended and all were read.
  async function pollSamples(job) {
    const grpo = ((job.spec || {}).training || {}).method === "grpo";
    if (!grpo && !((job.spec || {}).eval || {}).sample_prompts?.length) {
      state.samplesComplete = true;
      return;
    }
    let changed = false;
    for (;;) {
      const page = await FTQ.api(`/jobs/${enc}/samples?after_step=${state.samplesAfter}&limit=100`);
      if (page.data.length) {
        state.samples.push(...page.data);
        state.samplesAfter = page.next_after_step;
        changed = true;
      }
      if (page.complete) state.samplesComplete = true;
      if (page.complete || new Set(page.data.map((s) => s.step)).size < 100) break;
    }
    const box = document.getElementById("samples");
    if (!changed && box.childElementCount) return;
    const rows = state.samples.map((s, i) => h("tr", { dataset: { step: s.step, index: s.index } },
      h("td", { class: "num" }, i === 0 || state.samples[i - 1].step !== s.step ? `step ${s.step}` : ""),
      h("td", { class: "prompt" }, s.prompt),
      h("td", { class: "completion" }, s.completion),
      ...(grpo ? [h("td", { class: "num" }, s.reward == null ? "" : FTQ.num(s.reward))] : [])));
    const head = [h("th", {}, "step"), h("th", {}, "prompt"), h("th", {}, "completion")];
    if (grpo) head.push(h("th", {}, "reward"));
    const body = rows.length
      ? h("table", { class: "samples", id: "samples-table" }, h("tr", {}, ...head), ...rows)
      : h("p", { class: "muted" }, state.samplesComplete ? "this run wrote no samples" : "no samples yet");
    box.replaceChildren(body);
    document.getElementById("samples-card").hidden = false;
  }

  // The run's artifacts (GET /jobs/{id}/artifacts): each file and each folder (as a .tar) as a link.
  // Without a token the links are plain downloads; with one (auth on), a click fetches the file with
  // the token and saves it (a link cannot carry a bearer token): fine for adapters and logs, while
  // multi-GB files are better fetched with `ftq download`, which resumes and checks sha256.
  function artifactUrl(path) {
    return `/jobs/${enc}/artifacts/${path.split("/").map(encodeURIComponent).join("/")}`;
  }

  async function saveWithToken(ev) {
    const token = sessionStorage.getItem("ftq.token");
    if (!token) return; // the browser follows the link itself
    ev.preventDefault();
    const link = ev.currentTarget;
    try {
      const resp = await fetch(link.href, { headers: { Authorization: `Bearer ${token}` } });
      if (!resp.ok) throw new Error(`the server answered ${resp.status}`);
      const url = URL.createObjectURL(await resp.blob());
      const a = h("a", { href: url, download: link.getAttribute("download") || "" });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (e) {
      FTQ.banner("error", [h("strong", {}, "Download failed: "), e.message || String(e)]);
    }
  }

  function downloadLink(path, label) {
    const a = h("a", { href: artifactUrl(path), download: path.split("/").pop(), class: "artifact" }, label);
    a.addEventListener("click", saveWithToken);
    return a;
  }

  function folderOf(path) {
    const parts = path.split("/");
    if (parts[0] === "final" && parts.length > 1) return "final";
    if ((parts[0] === "checkpoints" || parts[0] === "exports") && parts.length > 2) return parts.slice(0, 2).join("/");
    return null;
  }

  function size(b) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i += 1; }
    return `${i ? b.toFixed(1) : b} ${units[i]}`;
  }

  async function showArtifacts(job) {
    const box = document.getElementById("artifacts");
    const list = await readCard(box, state.artifactsRead, `/jobs/${enc}/artifacts`, job,
      ["nothing to download yet", "this run left nothing to download"]);
    if (!list) return;
    const folders = new Map();
    for (const a of list.data) {
      const folder = folderOf(a.path);
      if (folder) folders.set(folder, (folders.get(folder) || 0) + a.size);
    }
    // The model first, then exports, then checkpoints (oldest first).
    const rank = (f) => (f === "final" ? 0 : f.startsWith("exports/") ? 1 : 2);
    const step = (f) => Number((/checkpoint-(\d+)$/.exec(f) || [0, 0])[1]);
    const ordered = [...folders.entries()].sort((a, b) =>
      rank(a[0]) - rank(b[0]) || step(a[0]) - step(b[0]) || a[0].localeCompare(b[0]));
    const folderLinks = ordered.map(([folder, bytes]) => h("li", {},
      downloadLink(`${folder}.tar`, `${folder}.tar`), " ", h("span", { class: "muted" }, size(bytes))));
    const rows = list.data.map((a) => h("tr", { dataset: { path: a.path, kind: a.kind } },
      h("td", {}, downloadLink(a.path, a.path)),
      h("td", {}, a.kind),
      h("td", { class: "num" }, size(a.size)),
      h("td", {}, a.sha256 ? h("code", { title: a.sha256 }, a.sha256.slice(0, 12)) : h("span", { class: "muted" }, "hashing…"))));
    box.replaceChildren(
      h("ul", { class: "folders", id: "artifact-folders" }, ...folderLinks),
      h("table", { class: "outputs", id: "artifact-files" }, ...rows));
  }

  async function pollLog() {
    const log = document.getElementById("log");
    for (;;) {
      const chunk = await FTQ.api(`/jobs/${enc}/logs?offset=${state.logOffset}&limit=262144`);
      if (chunk.text) {
        const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
        let text = log.textContent + chunk.text;
        if (text.length > LOG_KEEP_CHARS) text = `[… earlier lines dropped …]\n${text.slice(-LOG_KEEP_CHARS)}`;
        log.textContent = text;
        if (atBottom) log.scrollTop = log.scrollHeight;
      }
      state.logOffset = chunk.next_offset;
      state.logComplete = chunk.complete;
      document.getElementById("log-size").textContent = `${(state.logOffset / 1024).toFixed(1)} KiB`;
      if (!chunk.text || chunk.complete) break;
    }
    if (!log.textContent && state.logComplete) log.textContent = "(the job wrote no log)";
  }

  async function showPlan() {
    const plan = await FTQ.api(`/jobs/${enc}/plan`);
    const parts = [];
    const est = plan.estimate || {};
    if (est.per_device_bytes != null) {
      const gib = (b) => {
        if (b == null) return "–";
        const units = ["B", "KiB", "MiB", "GiB", "TiB"];
        let i = 0;
        while (Math.abs(b) >= 1024 && i < units.length - 1) { b /= 1024; i += 1; }
        return `${i ? b.toFixed(2) : b} ${units[i]}`;
      };
      const fits = est.fits === true ? h("span", { class: "fits" }, "fits")
        : est.fits === false ? h("span", { class: "no-fit" }, "does not fit") : "unknown";
      const rows = [h("tr", {}, h("td", {}, "per device"),
        h("td", {}, `${gib(est.per_device_bytes)} of ${gib(est.device_memory_bytes)} `, fits))];
      for (const [k, v] of Object.entries(est.breakdown || {})) {
        rows.push(h("tr", {}, h("td", {}, k), h("td", {}, typeof v === "number" ? gib(v) : String(v))));
      }
      parts.push(h("h3", {}, "memory estimate"), h("table", { class: "estimate" }, ...rows));
    } else if (est.reason) {
      parts.push(h("h3", {}, "memory estimate"), h("p", { class: "muted" }, est.reason));
    }
    const quote = (a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\"'\"'")}'`);
    parts.push(h("h3", {}, "command"), h("pre", { class: "code", id: "plan-command" }, (plan.command || []).map(quote).join(" ")));
    parts.push(h("h3", {}, "accelerate_config.yaml"), h("pre", { class: "code" }, plan.accelerate_config_yaml || ""));
    if (plan.sbatch_script) parts.push(h("h3", {}, "job.sbatch"), h("pre", { class: "code" }, plan.sbatch_script));
    else if (plan.launch_script) parts.push(h("h3", {}, "launch.sh"), h("pre", { class: "code" }, plan.launch_script));
    document.getElementById("plan").replaceChildren(...parts);
    state.planShown = true;
  }

  async function poll() {
    const job = await FTQ.api(`/jobs/${enc}`);
    showJob(job);
    if (!state.planShown) await showPlan();
    await showOutputs(job);
    await showExports();
    if (!state.eventsDone) await pollEvents(job);
    await showArtifacts(job);
    if (!state.metricsComplete) await pollMetrics();
    if (!state.samplesComplete) await pollSamples(job);
    if (!state.logComplete) await pollLog();
    const done = FTQ.TERMINAL.includes(job.status) && state.metricsComplete && state.logComplete
      && state.samplesComplete && !state.exportsActive && state.eventsDone;
    document.body.dataset.loaded = "true";
    FTQ.setRefreshState(done ? `${job.status}; no more updates` : `updated ${new Date().toLocaleTimeString()}`);
    return !done;
  }

  drawCharts();
  FTQ.every(POLL_MS, poll);
})();
