/* ftq dashboard: what both pages share: the token, API calls, banners, formatting, DOM helpers. */
"use strict";

const FTQ = (() => {
  const TOKEN_KEY = "ftq.token";
  const TERMINAL = ["succeeded", "failed", "cancelled"];

  // A token given as ?token= is kept for this tab and taken out of the address bar at once, so it
  // is not left in the history or copied along with a link.
  function adoptTokenFromUrl() {
    const url = new URL(window.location.href);
    if (!url.searchParams.has("token")) return;
    const token = url.searchParams.get("token");
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  adoptTokenFromUrl();

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function describe(status, body) {
    if (body && typeof body.detail === "string") return body.detail;
    if (body && Array.isArray(body.detail)) {
      return body.detail.map((e) => `${(e.loc || []).filter((p) => p !== "body").join(".")}: ${e.msg}`).join("; ");
    }
    return `the server answered ${status}`;
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json", ...(options.headers || {}) };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    let resp;
    try {
      resp = await fetch(path, { ...options, headers, cache: "no-store" });
    } catch (e) {
      throw new ApiError(0, "the ftq server cannot be reached; retrying");
    }
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    if (resp.status === 401) {
      showAuthBanner(Boolean(token));
      throw new ApiError(401, describe(401, body));
    }
    if (!resp.ok) throw new ApiError(resp.status, describe(resp.status, body));
    return body;
  }

  function banner(kind, nodes) {
    const el = document.getElementById("banner");
    el.replaceChildren(...nodes);
    el.className = `banner ${kind}`;
    el.hidden = false;
    el.dataset.kind = kind;
  }

  function clearBanner(kind) {
    const el = document.getElementById("banner");
    if (!el.hidden && (!kind || el.dataset.kind === kind)) {
      el.hidden = true;
      el.replaceChildren();
    }
  }

  function showAuthBanner(hadToken) {
    const existing = document.getElementById("token-form");
    if (existing) return;
    const input = h("input", { id: "token-input", type: "password", placeholder: "API token", autocomplete: "off" });
    const form = h("form", { id: "token-form" }, input, h("button", { type: "submit" }, "Use token"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      if (!input.value) return;
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      window.location.reload();
    });
    const why = hadToken
      ? "The API token of this tab was refused (401 unauthorized)."
      : "This ftq server needs an API token (401 unauthorized).";
    banner("auth", [
      h("strong", {}, why),
      " Open this page with ?token=YOUR_TOKEN, or paste it here:",
      form,
    ]);
  }

  // h("a", {href: "/x", class: "y"}, "text", child): children are text nodes or elements, never HTML.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function num(v, digits = 4) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(2);
    return String(Number(v.toPrecision(digits)));
  }

  // A learning rate, one format everywhere (the table, the job's meta, the chart's axis and hover), the
  // CLI's and train.log's: 2.50e-04.
  function lr(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (v === 0) return "0";
    const [mantissa, exp] = v.toExponential(2).split("e");
    return `${mantissa}e${exp[0] === "-" ? "-" : "+"}${String(Math.abs(Number(exp))).padStart(2, "0")}`;
  }

  // The last two parts of a path or Hub id ("/srv/ftq/examples/tiny/model" -> "…/tiny/model"); the
  // full one goes in a title attribute next to it.
  function shortPath(path) {
    if (!path) return "–";
    const parts = String(path).split("/").filter(Boolean);
    return parts.length > 2 ? `…/${parts.slice(-2).join("/")}` : String(path);
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    let s = Math.max(0, Math.round(seconds));
    const hrs = Math.floor(s / 3600);
    s -= hrs * 3600;
    const mins = Math.floor(s / 60);
    s -= mins * 60;
    if (hrs) return `${hrs}h${String(mins).padStart(2, "0")}m`;
    if (mins) return `${mins}m${String(s).padStart(2, "0")}s`;
    return `${s}s`;
  }

  function parseTime(iso) {
    if (!iso) return null;
    // The API sends ISO 8601 with an offset; a bare one is UTC.
    const t = Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(iso) ? iso : `${iso}Z`);
    return Number.isNaN(t) ? null : t;
  }

  function age(iso) {
    const t = parseTime(iso);
    return t === null ? "–" : `${duration((Date.now() - t) / 1000)} ago`;
  }

  function took(job) {
    const start = parseTime(job.started_at);
    if (start === null) return "–";
    const end = parseTime(job.finished_at) ?? Date.now();
    return duration((end - start) / 1000);
  }

  function badge(status) {
    return h("span", { class: `badge ${status}`, dataset: { status } }, status);
  }

  function progressFraction(job) {
    const p = job.progress || {};
    if (job.status === "succeeded") return 1;
    if (!p.max_steps || p.step === null || p.step === undefined) return 0;
    return Math.min(1, p.step / p.max_steps);
  }

  // Steps, and while a job is not training (queued, loading, saving, stopping) what it is doing instead,
  // from the API's progress.message: "starting 2 processes" says more than "0 / 40".
  function progressText(job) {
    const p = job.progress || {};
    const doing = !TERMINAL.includes(job.status) && p.message && p.phase !== "training" ? p.message : "";
    if (p.step === null || p.step === undefined) {
      if (doing) return doing;
      return p.max_steps ? `0 / ${p.max_steps}` : "–";
    }
    const steps = p.max_steps ? `${p.step} / ${p.max_steps}` : `step ${p.step}`;
    return doing ? `${steps} · ${doing}` : steps;
  }

  function setRefreshState(text) {
    const el = document.getElementById("refresh-state");
    if (el) el.textContent = text;
  }

  // Repeats `fn` every `ms` while the tab is visible; `fn` returns false to stop.
  function every(ms, fn) {
    let stopped = false;
    async function tick() {
      if (stopped) return;
      if (!document.hidden) {
        let again = true;
        try {
          again = (await fn()) !== false;
          if (document.getElementById("banner").dataset.kind === "offline") clearBanner("offline");
        } catch (e) {
          if (e instanceof ApiError && e.status === 401) {
            setRefreshState("waiting for a token");
          } else if (e instanceof ApiError && e.status === 404) {
            banner("error", [h("strong", {}, "Not found. "), e.message]);
            again = false;
          } else {
            banner("offline", [e.message || String(e)]);
          }
        }
        if (!again) {
          stopped = true;
          return;
        }
      }
      setTimeout(tick, ms);
    }
    tick();
    return () => {
      stopped = true;
    };
  }

  return {
    TERMINAL, ApiError, api, banner, clearBanner, h, num, lr, shortPath, duration, age, took, badge, progressFraction,
    progressText, setRefreshState, every, parseTime,
  };
})();
