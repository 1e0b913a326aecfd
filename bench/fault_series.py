"""A scripted series of injected faults against real ftq processes, with the audit that follows it.

Tiny CPU jobs are submitted continuously (Idempotency-Key, retried on connection errors and 503 with the
same key, as a real client does) while faults are injected one after another, round-robin by kind:

    --store postgres  (`ftq api` + `ftq worker` on PostgreSQL + a private Redis)
        worker_kill_dispatch  SIGKILL the worker right after a POST (varying delays), start it again
        worker_kill_run       SIGKILL the worker while a job trains, start it again
        redis_restart         shut Redis down (no save) while a job trains, start it again
        pg_restart            stop PostgreSQL while a job trains; GET /jobs/{id} all through the outage
                              (each answer must be a 503, never a 500), start it; the API recovers alone
        api_restart           SIGKILL `ftq api`, start it again
    --store embedded  (`ftq up`: SQLite, filesystem broker)
        worker_kill_dispatch, worker_kill_run  (the worker `ftq up` supervises; it starts it again)
        up_kill_dispatch, up_kill_run          SIGKILL `ftq up` (right after a POST / while a job
                                               trains) and start it again on the same data dir

Then every job must end, and the audit counts: jobs lost (a 201 whose job is gone or not terminal), jobs
not succeeded, jobs launched more than once (run_dir/launches.log lines, and trainer start lines in
train.log, and duplicate steps in metrics.jsonl), runs whose metrics are incomplete (GET .../metrics must
hold exactly steps 1..max_steps and say complete), 503s seen during PostgreSQL outages, and 500s anywhere.

    python -m bench.fault_series --store postgres --faults 50
    python -m bench.fault_series --store embedded --faults 50

Results go to bench/out/fault_series.json (one key per store). Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench import REPO
from bench.seed import tiny_deployment
from tests.harness import pid_alive, postgres, tiny_assets, tiny_spec
from tests.harness.procs import marked_pids

TOKEN = "fault-series-token"
TOKENS = {"faults": TOKEN}
TERMINAL = {"succeeded", "failed", "cancelled"}
TRAINER_START = "trainer INFO strategy"  # logged once per trainer process start (single process)
KINDS = {
    "postgres": ["worker_kill_dispatch", "worker_kill_run", "redis_restart", "pg_restart", "api_restart"],
    "embedded": ["worker_kill_dispatch", "worker_kill_run", "up_kill_dispatch", "up_kill_run"],
}
RETRYABLE = (httpx.TransportError,)
# SIGUSR1: inject no more faults, go on to the audit.
STOP_FAULTS = threading.Event()


# The deployment ------------------------------------------------------------------------------------------


class Series:
    """The deployment under the series (the harness's, with API tokens and a private Redis for PostgreSQL)
    and an HTTP client that counts every answer it gets."""

    def __init__(self, store: str, tiny: Path):
        self.store = store
        self.dep = tiny_deployment(
            f"faults-{store}-",
            tiny,
            production=store == "postgres",
            tokens=TOKENS,
            reconcile_interval_seconds=1,
            ingest_interval_seconds=1,
            post_rate_per_minute=1000,  # many POSTs over the series, from one owner
        )
        self.data = self.dep.data_dir
        self.codes: Counter[str] = Counter()
        self.errors_500: list[str] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        postgres.ensure_up()
        self.dep.start()
        self.dep.wait_worker_ready(0)

    def close(self) -> None:
        if self.store == "postgres":
            postgres.ensure_up()
        self.dep.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request; every answer is counted, and a 5xx other than 503 is kept as evidence."""
        headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}
        url = f"{self.dep.url}{path}"
        r = httpx.request(method, url, headers=headers, timeout=kw.pop("timeout", 20), **kw)
        with self._lock:
            self.codes[str(r.status_code)] += 1
            if r.status_code >= 500 and r.status_code != 503:
                self.errors_500.append(f"{method} {path} -> {r.status_code}: {r.text[:300]}")
        return r

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def ensure_services(self) -> None:
        """PostgreSQL and the private Redis up again, whatever a fault left."""
        postgres.ensure_up()
        redis = self.dep.redis
        if redis is not None and not redis.is_up():
            redis.start()


# Clients --------------------------------------------------------------------------------------------------


class Submitter:
    """Keeps `inflight` jobs active; every POST carries an Idempotency-Key and is retried until a 201."""

    def __init__(self, dep: Series, tiny: Path, inflight: int, rng: random.Random):
        self.dep, self.tiny, self.inflight, self.rng = dep, tiny, inflight, rng
        self.jobs: dict[str, dict[str, Any]] = {}  # id -> {"key", "max_steps", "attempts"}
        self.unsubmitted: list[str] = []  # keys that never got a 201 (lost submissions)
        self.refused: list[str] = []
        self.retries = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="submitter", daemon=True)

    def submit(self, deadline_s: float = 300) -> str | None:
        key = f"fault-{uuid.uuid4()}"
        max_steps = self.rng.randint(6, 10)
        body = tiny_spec(self.tiny, name=f"fault-{max_steps}", max_steps=max_steps)
        attempts = 0
        t0 = time.time()
        while time.time() - t0 < deadline_s:
            attempts += 1
            try:
                r = self.dep.request("POST", "/jobs", json=body, headers={"Idempotency-Key": key}, timeout=30)
            except RETRYABLE:
                time.sleep(0.5)
                continue
            if r.status_code == 201:
                job_id = str(r.json()["id"])
                with self._lock:
                    prior = self.jobs.get(job_id)
                    if prior is not None and prior["key"] != key:
                        self.refused.append(f"two keys gave one job {job_id}")
                    self.jobs[job_id] = {"key": key, "max_steps": max_steps, "attempts": attempts}
                    self.retries += attempts - 1
                return job_id
            if r.status_code in (409, 429) or r.status_code >= 500:
                time.sleep(1.0)
                continue
            with self._lock:
                self.refused.append(f"{r.status_code}: {r.text[:300]}")
            return None
        with self._lock:
            self.unsubmitted.append(key)
        return None

    def active(self) -> int | None:
        try:
            r = self.dep.get("/jobs", params={"status": "queued,starting,running,cancelling", "limit": 100})
        except RETRYABLE:
            return None
        return len(r.json()["data"]) if r.status_code == 200 else None

    def _run(self) -> None:
        while not self._stop.is_set():
            n = self.active()
            if n is not None and n < self.inflight:
                self.submit()
                continue
            self._stop.wait(1.0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=330)


# Faults ---------------------------------------------------------------------------------------------------


class Injector:
    def __init__(self, dep: Series, sub: Submitter, outage_s: float, rng: random.Random):
        self.dep, self.sub, self.outage_s, self.rng = dep, sub, outage_s, rng
        self.log: list[dict[str, Any]] = []
        self.pg_503 = 0
        self.pg_other: Counter[str] = Counter()
        self.pg_recovery_s: list[float] = []
        self.pg_back_early: Counter[str] = Counter()  # answers after something else restarted PostgreSQL
        self.dispatch_delays = [0.0, 0.2, 0.5, 1.0, 2.0, 3.5]

    def running_job(self, timeout: float = 120, prefer_training_s: float = 10) -> str | None:
        """A running job: one that has logged a step if one comes within `prefer_training_s`, else any
        launched one (its trainer is still starting: on a loaded host that is most of a tiny run)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            with contextlib.suppress(*RETRYABLE):
                r = self.dep.get("/jobs", params={"status": "running", "limit": 20})
                if r.status_code == 200:
                    jobs = r.json()["data"]
                    for job in jobs:
                        if (job["progress"]["step"] or 0) >= 1:
                            return str(job["id"])
                    if jobs and time.time() - t0 >= prefer_training_s:
                        return str(jobs[0]["id"])
            time.sleep(0.3)
        return None

    def inject(self, kind: str) -> dict[str, Any]:
        t0 = time.time()
        rec: dict[str, Any] = {"kind": kind, "at": round(t0, 1)}
        getattr(self, kind)(rec)
        rec["took_s"] = round(time.time() - t0, 1)
        self.log.append(rec)
        return rec

    # kinds
    def _restart_worker(self, rec: dict[str, Any]) -> None:
        dep = self.dep.dep
        before = dep.worker_ready_count()
        # `ftq up` supervises its worker and starts it again; a separate one is started here.
        if dep.kill_worker() is None:
            rec["note"] = "no live worker to kill"
        elif dep.separate_worker:
            time.sleep(0.5)
            dep.start_worker(wait=False)
        rec["worker_back_s"] = round(dep.wait_worker_ready(before), 1)

    def _submit_and_wait_a_dispatch_delay(self, rec: dict[str, Any]) -> None:
        """A job submitted, then the next of the dispatch delays waited (the kill lands that long after)."""
        delay = self.dispatch_delays[len(self.log) % len(self.dispatch_delays)]
        rec["job"] = self.sub.submit()
        time.sleep(delay)
        rec["delay_s"] = delay

    def worker_kill_dispatch(self, rec: dict[str, Any]) -> None:
        self._submit_and_wait_a_dispatch_delay(rec)
        self._restart_worker(rec)

    def worker_kill_run(self, rec: dict[str, Any]) -> None:
        rec["job"] = self.running_job()
        self._restart_worker(rec)

    def redis_restart(self, rec: dict[str, Any]) -> None:
        rec["job"] = self.running_job()
        redis = self.dep.dep.redis
        assert redis is not None
        try:
            redis.stop()
            time.sleep(self.outage_s)
        finally:
            redis.start()

    def pg_restart(self, rec: dict[str, Any]) -> None:
        job = rec["job"] = self.running_job()
        path = f"/jobs/{job}" if job else "/jobs"
        codes: Counter[str] = Counter()

        def get() -> int | str:
            try:
                return self.dep.get(path, timeout=10).status_code
            except RETRYABLE as exc:
                return type(exc).__name__

        try:
            postgres.pg_ctl("stop")
            codes, back = postgres.answers_while_down(get, self.outage_s)
            self.pg_back_early.update(back)
        finally:
            postgres.pg_ctl("start")
            postgres.ensure_up()
        t_up = time.time()
        recovered = None
        while time.time() - t_up < 60:
            with contextlib.suppress(*RETRYABLE):
                if self.dep.get(path).status_code == 200:
                    recovered = time.time() - t_up
                    break
            time.sleep(0.2)
        rec["outage_503s"] = codes.pop("503", 0)
        self.pg_503 += rec["outage_503s"]
        self.pg_other.update(codes)
        rec["outage_other_answers"] = dict(codes)
        rec["answers_after_early_restart"] = sum(self.pg_back_early.values())
        rec["api_recovered_s"] = None if recovered is None else round(recovered, 1)
        if recovered is not None:
            self.pg_recovery_s.append(recovered)

    def api_restart(self, rec: dict[str, Any]) -> None:
        self.dep.dep.kill9("api")
        t0 = time.time()
        self.dep.dep.start_server()
        rec["api_back_s"] = round(time.time() - t0, 1)

    def _restart_up(self, rec: dict[str, Any]) -> None:
        dep = self.dep.dep
        before = dep.worker_ready_count()
        worker = dep.worker_pid()
        dep.kill9("up")
        # The worker follows `ftq up` down (PDEATHSIG); a second one must never run next to the new one.
        deadline = time.time() + 30
        while worker is not None and pid_alive(worker) and time.time() < deadline:
            time.sleep(0.1)
        rec["old_worker_gone"] = worker is None or not pid_alive(worker)
        t0 = time.time()
        dep.start_server()
        rec["api_back_s"] = round(time.time() - t0, 1)
        rec["worker_back_s"] = round(dep.wait_worker_ready(before), 1)

    def up_kill_dispatch(self, rec: dict[str, Any]) -> None:
        self._submit_and_wait_a_dispatch_delay(rec)
        self._restart_up(rec)

    def up_kill_run(self, rec: dict[str, Any]) -> None:
        rec["job"] = self.running_job()
        self._restart_up(rec)


# Audit ------------------------------------------------------------------------------------------------------


def wait_all_terminal(dep: Series, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    final: dict[str, dict[str, Any]] = {}
    deadline = time.time() + timeout
    pending = list(ids)
    while pending and time.time() < deadline:
        for job_id in list(pending):
            try:
                r = dep.get(f"/jobs/{job_id}")
            except RETRYABLE:
                continue
            if r.status_code == 404:
                final[job_id] = {"status": "missing"}
                pending.remove(job_id)
            elif r.status_code == 200:
                final[job_id] = r.json()
                if final[job_id]["status"] in TERMINAL:
                    pending.remove(job_id)
        if pending:
            time.sleep(2)
    return final


def all_job_ids(dep: Series) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 100}
        if cursor:
            params["cursor"] = cursor
        page = dep.get("/jobs", params=params).json()
        ids += [j["id"] for j in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            return ids


def audit(dep: Series, sub: Submitter, final: dict[str, dict[str, Any]]) -> dict[str, Any]:
    lost, not_terminal, not_succeeded, twice, incomplete = [], [], [], [], []
    for job_id, meta in sub.jobs.items():
        job = final.get(job_id, {"status": "unknown"})
        if job["status"] in ("missing", "unknown"):
            lost.append(job_id)
            continue
        if job["status"] not in TERMINAL:
            not_terminal.append(f"{job_id}: {job['status']}")
            continue
        if job["status"] != "succeeded":
            not_succeeded.append(f"{job_id}: {job['status']} {job.get('error')}")
        run_dir = dep.data / "runs" / job_id
        launches = _lines(run_dir / "launches.log")
        starts = "\n".join(_lines(run_dir / "train.log")).count(TRAINER_START)
        metric_steps = [json.loads(line)["step"] for line in _lines(run_dir / "metrics.jsonl")]
        if len(launches) > 1 or starts > 1 or len(metric_steps) != len(set(metric_steps)):
            twice.append(
                f"{job_id}: launches.log {len(launches)}, trainer starts {starts}, "
                f"metrics.jsonl steps {metric_steps}"
            )
        elif job["status"] == "succeeded" and (len(launches) != 1 or starts != 1):
            twice.append(f"{job_id}: succeeded with {len(launches)} launch lines and {starts} trainer starts")
        page = dep.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000}).json()
        steps = [p["step"] for p in page["data"]]
        want = list(range(1, meta["max_steps"] + 1))
        if steps != want or not page["complete"] or job["progress"]["step"] != meta["max_steps"]:
            incomplete.append(
                f"{job_id}: steps {steps} (want 1..{meta['max_steps']}), complete "
                f"{page['complete']}, progress {job['progress']}"
            )
    stored = all_job_ids(dep)
    phantom = sorted(set(stored) - set(sub.jobs))
    leftovers = marked_pids(set(sub.jobs))
    return {
        "jobs_submitted": len(sub.jobs),
        "post_retries": sub.retries,
        "submissions_never_accepted": len(sub.unsubmitted),
        "submissions_refused": sub.refused,
        "jobs_in_store": len(stored),
        "jobs_in_store_not_submitted": phantom,
        "succeeded": sum(1 for j in sub.jobs if final.get(j, {}).get("status") == "succeeded"),
        "lost": lost,
        "not_terminal": not_terminal,
        "not_succeeded": not_succeeded,
        "launched_twice": twice,
        "metrics_incomplete": incomplete,
        "processes_left_behind": {k: v for k, v in leftovers.items()},
    }


def _lines(path: Path) -> list[str]:
    try:
        return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


# Main -------------------------------------------------------------------------------------------------------


def run_series(
    store: str,
    faults: int,
    inflight: int,
    outage_s: float,
    gap_s: float,
    drain_s: float,
    seed: int,
    budget_s: float,
) -> dict[str, Any]:
    rng = random.Random(seed)
    tiny = tiny_assets()
    dep = Series(store, tiny)
    started = time.time()
    print(f"[{store}] data dir {dep.data}", flush=True)
    try:
        dep.start()
        sub = Submitter(dep, tiny, inflight, rng)
        inj = Injector(dep, sub, outage_s, rng)
        sub.start()
        kinds = KINDS[store]
        # Let the first jobs reach training, so faults land on real runs from the start.
        inj.running_job(timeout=240)
        for i in range(faults):
            if time.time() - started > budget_s or STOP_FAULTS.is_set():
                print(f"[{store}] stopping after {i} faults (time budget or SIGUSR1)", flush=True)
                break
            kind = kinds[i % len(kinds)]
            try:
                rec = inj.inject(kind)
            finally:
                dep.ensure_services()
            print(f"[{store}] fault {i + 1}/{faults} {json.dumps(rec)}  jobs {len(sub.jobs)}", flush=True)
            time.sleep(gap_s)
        sub.stop()
        faults_done = time.time()
        final = wait_all_terminal(dep, list(sub.jobs), drain_s)
        result = audit(dep, sub, final)
        by_kind = Counter(r["kind"] for r in inj.log)
        result.update(
            {
                "store": store,
                "faults_requested": faults,
                "faults_injected": len(inj.log),
                "faults_by_kind": dict(by_kind),
                "faults_without_a_running_job": sum(
                    1
                    for r in inj.log
                    if r["kind"].endswith(("_run", "restart"))
                    and r.get("job") is None
                    and r["kind"] != "api_restart"
                ),
                "pg_outage_503s": inj.pg_503,
                "pg_outage_other_answers": dict(inj.pg_other),
                "pg_answers_after_an_early_restart_by_others": dict(inj.pg_back_early),
                "pg_api_recovery_s_max": round(max(inj.pg_recovery_s), 1) if inj.pg_recovery_s else None,
                "http_status_counts": dict(dep.codes),
                "http_500s": len(dep.errors_500),
                "http_500_samples": dep.errors_500[:10],
                "series_s": round(faults_done - started, 1),
                "drain_s": round(time.time() - faults_done, 1),
                "data_dir": str(dep.data),
                "load_avg": os.getloadavg()[0],
                "fault_log": inj.log,
            }
        )
        return result
    finally:
        dep.close()


def failed_checks(r: dict[str, Any]) -> list[str]:
    bad = []
    for key in (
        "lost",
        "not_terminal",
        "not_succeeded",
        "launched_twice",
        "metrics_incomplete",
        "jobs_in_store_not_submitted",
        "submissions_refused",
    ):
        if r[key]:
            bad.append(f"{key}: {len(r[key])}")
    if r["submissions_never_accepted"]:
        bad.append(f"submissions_never_accepted: {r['submissions_never_accepted']}")
    if r["http_500s"]:
        bad.append(f"http_500s: {r['http_500s']}")
    if r["pg_outage_other_answers"]:
        bad.append(f"pg_outage_other_answers: {r['pg_outage_other_answers']}")
    if r["processes_left_behind"]:
        bad.append(f"processes_left_behind: {len(r['processes_left_behind'])}")
    return bad


def save(out: Path, store: str, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Both stores may run at once: read-modify-write under a lock.
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(out.read_text()) if out.exists() else {}
        data[store] = result
        out.write_text(json.dumps(data, indent=2) + "\n")


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=["postgres", "embedded"], default="postgres")
    ap.add_argument("--faults", type=int, default=50)
    ap.add_argument("--inflight", type=int, default=3, help="jobs kept active while faults are injected")
    ap.add_argument("--outage", type=float, default=4.0, help="seconds Redis or PostgreSQL stays down")
    ap.add_argument("--gap", type=float, default=2.0, help="seconds from one fault's recovery to the next")
    ap.add_argument("--drain", type=float, default=900.0, help="seconds allowed for every job to end")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--budget",
        type=float,
        default=float("inf"),
        help="seconds after which no new fault is started (the audit still runs in full)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "fault_series.json")
    args = ap.parse_args()
    signal.signal(signal.SIGUSR1, lambda *_: STOP_FAULTS.set())
    # SIGTERM (and SIGINT, which a shell ignores in background jobs) unwinds, so every process,
    # PostgreSQL and Redis are left as found.
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGINT, _raise_exit)
    result = run_series(
        args.store, args.faults, args.inflight, args.outage, args.gap, args.drain, args.seed, args.budget
    )
    save(args.out, args.store, result)
    bad = failed_checks(result)
    summary = {
        k: result[k]
        for k in (
            "faults_requested",
            "faults_injected",
            "faults_by_kind",
            "jobs_submitted",
            "post_retries",
            "succeeded",
            "pg_outage_503s",
            "http_500s",
            "series_s",
            "drain_s",
        )
    }
    for key in ("lost", "launched_twice", "metrics_incomplete", "not_terminal"):
        summary[key] = len(result[key])
    print(f"[{args.store}] " + json.dumps(summary), flush=True)
    print(f"[{args.store}] " + ("FAILED: " + "; ".join(bad) if bad else "all checks passed"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
