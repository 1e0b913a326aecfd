"""The fault campaign of issue 28: what the newer features added, under the faults of a bad day.

One `ftq up` (SQLite, the embedded broker, two owners' worth of settings) whose data dir is a small
tmpfs (when this runs as root; otherwise a plain folder and the full-disk phase is skipped), and a
webhook receiver on 127.0.0.1. Each round runs these phases, in the spirit of bench/fault_series.py:

    upload_kill      SIGKILL `ftq up` while uploads stream in, start it again: every upload that got a
                     201 validates, no upload's room stays reserved (a new upload fits), and no `.part`
                     file of a dead upload counts against the quota
    export_kill      SIGKILL `ftq up` while an export runs, start it again: the export ends succeeded,
                     launched once
    webhook_kill     SIGKILL `ftq up` while a job's events are being delivered, start it again: the
                     job succeeds, launched once, and every event it wrote reaches the receiver
    full_disk        the data dir filled up: an upload is refused (4xx or 507, never a 500), reads keep
                     answering, a job that checkpoints fails with `disk_full`
    deleted_run_dir  a training job's run directory deleted under it: the job fails, and not as "killed
                     (SIGKILL, e.g. by the out-of-memory killer)"

The audit counts jobs (and exports) lost (never terminal, or gone), run twice (more than one line in
launches.log, or the trainer started twice), reported with the wrong cause (a failure whose code is not
the one the fault calls for), and 5xx answers (every answer of every request is counted; 503 while the
server restarts, and 507 while the disk is full, are the answers asked for and counted apart).

    python -m bench.fault_campaign [--rounds 1] [--disk-mb 256]

Results go to bench/out/fault_campaign.json; RESULT lines for bench.run_all. Exit status 1 when a check
fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench import OUT, log, note, result, scratch
from tests.harness import Deployment, pid_alive, tiny_assets, tiny_spec
from tests.harness.webhooks import Receiver

TOKEN = "fault-campaign-token"
TERMINAL = {"succeeded", "failed", "cancelled"}
TRAINER_START = "trainer INFO strategy"
EVENT_TYPES = ["job.queued", "job.started", "job.checkpoint", "job.succeeded", "job.failed"]
OOM_WORDS = ("out-of-memory", "SIGKILL")


class Campaign:
    def __init__(self, root: Path, tiny: Path, disk_mb: int) -> None:
        self.root = root
        self.tiny = tiny
        data = root / "data"
        data.mkdir(parents=True)
        self.tmpfs = False
        if os.geteuid() == 0 and shutil.which("mount"):
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,mode=0700", "tmpfs", str(data)],
                capture_output=True,
                check=False,
            )
            self.tmpfs = done.returncode == 0
            if not self.tmpfs:
                log(f"no tmpfs ({done.stderr.decode().strip()}); the full-disk phase is skipped")
        settings = {
            "cpu_slots": 2,
            "cancel_grace_seconds": 5,
            "reconcile_interval_seconds": 1,
            "ingest_interval_seconds": 1,
            "local_roots": f"{tiny}:{data}",
            "max_file_bytes": 4 * 1024 * 1024,
            "file_quota_bytes": 12 * 1024 * 1024,
            "webhook_allowed_networks": "127.0.0.0/8",
            "webhook_interval_seconds": 0.5,
            "webhook_retry_base_seconds": 1,
            "webhook_retry_max_delay_seconds": 2,
            "webhook_retry_total_seconds": 600,
            "post_rate_per_minute": 1000,
        }
        self.dep = Deployment(root, mode="up", tokens={"ops": TOKEN}, settings=settings, data_dir=data)
        self.codes: Counter[str] = Counter()
        self.errors_5xx: list[str] = []
        self.restart_503s = 0
        self.disk_full_507s = 0
        self.jobs: dict[str, dict[str, Any]] = {}  # job id -> {"phase", "expect": code or "succeeded"}
        self.exports: dict[str, str] = {}  # export id -> job id
        self.findings: list[str] = []
        self.receiver = Receiver().start()
        self._restarting = threading.Event()
        self._disk_full = threading.Event()  # the full_disk phase's fault: a 507 then is the answer asked for

    # HTTP, counted -----------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, tries: int = 60, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}
        for attempt in range(tries):
            try:
                r = httpx.request(method, f"{self.dep.url}{path}", headers=headers, timeout=60, **kw)
            except httpx.TransportError:
                if attempt == tries - 1:
                    raise
                time.sleep(0.5)
                continue
            self.codes[str(r.status_code)] += 1
            if r.status_code == 503 and self._restarting.is_set():
                self.restart_503s += 1
            elif r.status_code == 507 and self._disk_full.is_set():
                self.disk_full_507s += 1
            elif r.status_code >= 500:
                self.errors_5xx.append(f"{method} {path} -> {r.status_code}: {r.text[:200]}")
            return r
        raise AssertionError("unreachable")

    def submit(self, phase: str, expect: str, **training: Any) -> str:
        spec = tiny_spec(self.tiny, name=f"fc-{phase}", **training)
        r = self.request("POST", "/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = str(r.json()["id"])
        self.jobs[job_id] = {"phase": phase, "expect": expect}
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/jobs/{job_id}").json())

    def wait(self, job_id: str, what: str, ok: Any, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if ok(job):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job_id}: no {what} in {timeout:.0f}s (status {job['status']})")
            time.sleep(0.3)

    def restart_up(self) -> float:
        """SIGKILL `ftq up` (its workers follow it down) and start it again; seconds until it serves."""
        dep = self.dep
        before = dep.worker_ready_count()
        worker = dep.worker_pid()
        self._restarting.set()
        dep.kill9("up")
        deadline = time.time() + 30
        while worker is not None and pid_alive(worker) and time.time() < deadline:
            time.sleep(0.1)
        t0 = time.monotonic()
        dep.start_server()
        dep.wait_worker_ready(before)
        self._restarting.clear()
        return time.monotonic() - t0

    # Phases ------------------------------------------------------------------------------------------

    def upload_kill(self) -> dict[str, Any]:
        line = b'{"text": "' + b"y" * 1000 + b'"}\n'
        answers: list[int | str] = []

        def slowly() -> Iterator[bytes]:
            for _ in range(40):  # 40 x 26 KB, over about 2 s
                time.sleep(0.05)
                yield line * 26

        def one() -> None:
            try:
                r = httpx.post(
                    f"{self.dep.url}/files",
                    content=slowly(),
                    headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/jsonl"},
                    timeout=60,
                )
                answers.append(r.status_code)
            except httpx.HTTPError as exc:
                answers.append(type(exc).__name__)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        back = self.restart_up()
        for t in threads:
            t.join(120)
        parts = sorted(p.name for p in (self.dep.data_dir / "files").rglob(".*.part"))
        # Room for a new upload of the size cap: dead uploads' .part files reserve nothing.
        fresh = self.request(
            "POST", "/files", content=line * 3000, headers={"Content-Type": "application/jsonl"}
        ).status_code
        listed = self.request("GET", "/files", params={"limit": 100}).json()["data"]
        stuck = []
        deadline = time.monotonic() + 60
        for f in listed:
            while f["status"] == "validating" and time.monotonic() < deadline:
                time.sleep(0.5)
                f = self.request("GET", f"/files/{f['id']}").json()
            if f["status"] != "ready":
                stuck.append(f"{f['id']}: {f['status']}")
        for f in listed:
            self.request("DELETE", f"/files/{f['id']}")
        if fresh != 201:
            self.findings.append(f"upload_kill: an upload after the restart got {fresh}, not 201")
        if stuck:
            self.findings.append(f"upload_kill: files not ready: {stuck}")
        return {
            "answers_of_killed_uploads": [str(a) for a in answers],
            "restart_s": round(back, 1),
            "parts_left": len(parts),
            "upload_after_restart": fresh,
            "files_not_ready": stuck,
        }

    def export_kill(self, job_id: str) -> dict[str, Any]:
        r = self.request("POST", f"/jobs/{job_id}/exports", json={"kind": "merged", "dtype": "fp32"})
        assert r.status_code == 202, r.text
        export_id = str(r.json()["id"])
        self.exports[export_id] = job_id
        deadline = time.monotonic() + 120
        status = "queued"
        while status in ("queued", "starting") and time.monotonic() < deadline:
            time.sleep(0.2)
            status = self.request("GET", f"/jobs/{job_id}/exports/{export_id}").json()["status"]
        back = self.restart_up()
        return {"export": export_id, "status_at_kill": status, "restart_s": round(back, 1)}

    def webhook_kill(self) -> dict[str, Any]:
        job_id = self.submit("webhook_kill", "succeeded", save_steps=2, max_steps=4)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.receiver.of(job_id):
            time.sleep(0.1)
        back = self.restart_up()
        return {"job": job_id, "restart_s": round(back, 1)}

    def full_disk(self) -> dict[str, Any]:
        if not self.tmpfs:
            return {"skipped": "no tmpfs"}
        filler = self.dep.data_dir / "filler"
        free = shutil.disk_usage(self.dep.data_dir).free
        self._disk_full.set()
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            block = b"\0" * (1024 * 1024)
            for _ in range(max(0, free // len(block) - 1)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        job_id = self.submit("full_disk", "disk_full", save_steps=1, max_steps=4)
        upload = self.request(
            "POST",
            "/files",
            content=b'{"text": "z"}\n' * 200_000,
            headers={"Content-Type": "application/jsonl"},
        )
        reads = [self.request("GET", p).status_code for p in ("/jobs", "/files", "/usage", "/healthz")]
        # The embedded store is on the same disk: nothing can be recorded while it is full. The disk
        # stays full until the run has died of it (a minute or two), then there is room again.
        run_dir = self.dep.run_dir(job_id)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run_dir / "exit_status").exists():
            if "No space left" in "\n".join(_lines(run_dir / "train.log")[-50:]):
                break
            time.sleep(1)
        filler.unlink(missing_ok=True)
        self._disk_full.clear()
        job = self.wait(job_id, "an end", lambda j: j["status"] in TERMINAL, timeout=300)
        return {
            "job": job_id,
            "upload_on_full_disk": upload.status_code,
            "upload_detail": upload.text[:200],
            "reads": reads,
            "job_status": job["status"],
            "job_error": job.get("error"),
        }

    def deleted_run_dir(self) -> dict[str, Any]:
        job_id = self.submit("deleted_run_dir", "not_oom", max_steps=60, save_steps=None)
        self.wait(job_id, "a step", lambda j: ((j.get("progress") or {}).get("step") or 0) >= 1, timeout=240)
        shutil.rmtree(self.dep.run_dir(job_id), ignore_errors=True)
        job = self.wait(job_id, "an end", lambda j: j["status"] in TERMINAL, timeout=300)
        return {"job": job_id, "job_status": job["status"], "job_error": job.get("error")}

    # Audit -------------------------------------------------------------------------------------------

    def audit(self) -> dict[str, Any]:
        lost, twice, misreported = [], [], []
        for job_id, meta in self.jobs.items():
            try:
                job = self.wait(job_id, "an end", lambda j: j["status"] in TERMINAL, timeout=300)
            except TimeoutError as exc:
                lost.append(str(exc))
                continue
            run_dir = self.dep.run_dir(job_id)
            launches = _lines(run_dir / "launches.log")
            starts = "\n".join(_lines(run_dir / "train.log")).count(TRAINER_START)
            if meta["phase"] != "deleted_run_dir" and (len(launches) > 1 or starts > 1):
                twice.append(f"{job_id} ({meta['phase']}): {len(launches)} launches, {starts} trainer starts")
            error = job.get("error") or {}
            expect = meta["expect"]
            wrong = {
                "succeeded": job["status"] != "succeeded",
                "disk_full": error.get("code") != "disk_full",
                "not_oom": job["status"] != "failed"
                or error.get("code") == "out_of_memory"
                or any(w in (error.get("message") or "") for w in OOM_WORDS),
            }[expect]
            if wrong:
                misreported.append(f"{job_id} ({meta['phase']}): {job['status']} {error}")
        for export_id, job_id in self.exports.items():
            deadline = time.monotonic() + 300
            export = self.request("GET", f"/jobs/{job_id}/exports/{export_id}").json()
            while export["status"] not in TERMINAL and time.monotonic() < deadline:
                time.sleep(0.5)
                export = self.request("GET", f"/jobs/{job_id}/exports/{export_id}").json()
            if export["status"] not in TERMINAL:
                lost.append(f"export {export_id}: {export['status']}")
                continue
            launches = _lines(self.dep.run_dir(job_id) / "exports" / export_id / "launches.log")
            if len(launches) > 1:
                twice.append(f"export {export_id}: {len(launches)} launches")
            if export["status"] != "succeeded":
                misreported.append(f"export {export_id}: {export['status']} {export.get('error')}")
        # Every event a job wrote of the subscribed types reached the receiver (at least once).
        undelivered = []
        deadline = time.monotonic() + 120
        for job_id in self.jobs:
            while True:
                events = self.request("GET", f"/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
                want = {f"evt_{e['id']}" for e in events if e["type"] in EVENT_TYPES}
                got = {d.headers["webhook-id"] for d in self.receiver.of(job_id)}
                if want <= got or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            undelivered += sorted(want - got)
        duplicates = sum(
            n - 1 for n in Counter(d.headers["webhook-id"] for d in self.receiver.received).values() if n > 1
        )
        return {
            "jobs": len(self.jobs),
            "exports": len(self.exports),
            "lost": lost,
            "run_twice": twice,
            "misreported": misreported,
            "http_5xx": self.errors_5xx,
            "http_503_while_restarting": self.restart_503s,
            "http_507_while_disk_full": self.disk_full_507s,
            "events_undelivered": undelivered,
            "deliveries_repeated": duplicates,
            "answers": dict(self.codes),
            "findings": self.findings,
        }

    def close(self) -> None:
        self.receiver.stop()
        self.dep.close(cancel_active=True)
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.dep.data_dir)], check=False)


def _lines(path: Path) -> list[str]:
    try:
        return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


def run(rounds: int, disk_mb: int) -> dict[str, Any]:
    tiny = tiny_assets()
    root = scratch("fault-campaign-")
    camp = Campaign(root, tiny, disk_mb)
    phases: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        camp.dep.start()
        r = camp.request("POST", "/webhooks", json={"url": camp.receiver.url, "events": EVENT_TYPES})
        assert r.status_code == 201, r.text
        base = camp.submit("export_base", "succeeded", max_steps=2)
        camp.wait(base, "success", lambda j: j["status"] == "succeeded", timeout=300)
        for n in range(rounds):
            for name in ("upload_kill", "export_kill", "webhook_kill", "full_disk", "deleted_run_dir"):
                log(f"round {n + 1}: {name}")
                started = time.monotonic()
                try:
                    out = getattr(camp, name)(base) if name == "export_kill" else getattr(camp, name)()
                except Exception as exc:  # a phase that breaks is a finding, and the campaign goes on
                    out = {"error": f"{type(exc).__name__}: {exc}"}
                    camp.findings.append(f"{name}: {type(exc).__name__}: {exc}")
                out.update(phase=name, round=n + 1, seconds=round(time.monotonic() - started, 1))
                phases.append(out)
        audit = camp.audit()
    finally:
        camp.close()
    seconds = round(time.monotonic() - t0)
    return {"rounds": rounds, "tmpfs": camp.tmpfs, "phases": phases, **audit, "seconds": seconds}


def failed_checks(r: dict[str, Any]) -> list[str]:
    return [
        f"{key}: {len(r[key])}"
        for key in ("lost", "run_twice", "misreported", "http_5xx", "events_undelivered", "findings")
        if r[key]
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--disk-mb", type=int, default=256, help="size of the tmpfs data dir")
    ap.add_argument("--out", type=Path, default=OUT / "fault_campaign.json")
    args = ap.parse_args()
    r = run(args.rounds, args.disk_mb)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(r, indent=2) + "\n")
    for key in ("lost", "run_twice", "misreported", "http_5xx", "events_undelivered"):
        result(f"fault_campaign_{key}", len(r[key]), "count", jobs=r["jobs"], exports=r["exports"])
    note(f"fault campaign: {r['rounds']} round(s) of five phases on `ftq up`, {r['seconds']} s")
    bad = failed_checks(r)
    print(json.dumps({k: r[k] for k in r if k != "phases"}, indent=1), flush=True)
    print("FAILED: " + "; ".join(bad) if bad else "all checks passed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
