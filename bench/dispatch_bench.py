"""Dispatch latency and overhead of running a job through ftq.

1. Latency from POST /jobs to `running` (p50, p95) on the embedded broker (`ftq up`) and on Redis
   (`ftq api` + `ftq worker` on PostgreSQL + Redis). Server-side: the job's `started_at - created_at`;
   client-side: from sending the POST to the first GET that says `running`. Each job is cancelled as
   soon as it runs, so the samples do not queue behind each other's training.
2. Wall time of the tiny job through ftq (POST to `succeeded`) against the same rendered
   `accelerate launch` command run directly, as a ratio.

    python -m bench.dispatch_bench [--samples 10] [--skip-redis] [--out bench/out/dispatch_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import OUT, REPO
from bench.seed import tiny_deployment
from tests.harness import Deployment, tiny_assets, tiny_spec


def deployment(kind: str, tiny: Path) -> Deployment:
    """`ftq up` ("embedded") or `ftq api` + `ftq worker` on PostgreSQL and a private Redis ("redis")."""
    return tiny_deployment(
        f"dispatch-{kind}-",
        tiny,
        production=kind == "redis",
        cancel_grace_seconds=3,
        reconcile_interval_seconds=1,
    )


def wait(
    dep: Deployment, job_id: str, statuses: set[str], timeout: float = 600, poll: float = 0.02
) -> dict[str, Any]:
    """The job once in one of `statuses`, polled every `poll` s (the latency measured depends on it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = dep.http.get(f"/jobs/{job_id}")
        if r.status_code == 200 and r.json()["status"] in statuses:
            return dict(r.json())
        time.sleep(poll if r.status_code == 200 else 1.0)  # 503 while the store restarts
    raise TimeoutError(f"{job_id} never reached {statuses}")


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def latency(dep: Deployment, tiny: Path, samples: int) -> dict[str, Any]:
    server, client = [], []
    for _ in range(samples):
        t0 = time.perf_counter()
        job = dep.http.post("/jobs", json=tiny_spec(tiny, name="bench", max_steps=100_000)).json()
        running = wait(dep, job["id"], {"running", "failed", "succeeded"})
        client.append(time.perf_counter() - t0)
        assert running["status"] == "running", running
        server.append(_ts(running["started_at"]) - _ts(running["created_at"]))
        dep.http.post(f"/jobs/{job['id']}/cancel")
        wait(dep, job["id"], {"cancelled", "failed", "succeeded"}, poll=0.2)
    return {"server_s": summary(server), "client_s": summary(client)}


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return {"p50": round(statistics.median(xs), 3), "p95": round(p95, 3), "n": len(xs)}


def overhead(dep: Deployment, tiny: Path, max_steps: int, repeats: int) -> dict[str, Any]:
    """The tiny job run by hand and through ftq, alternately `repeats` times each; medians."""
    spec = tiny_spec(tiny, name="bench", max_steps=max_steps)
    # Direct: the very command ftq renders, in a scratch run directory, with the same kind of env.
    plan = dep.http.post("/jobs", params={"dry_run": "true"}, json=spec).json()
    threads = str(max(1, (os.cpu_count() or 1) // 4))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads, "PYTHONPATH": str(REPO)}
    direct, through = [], []
    for _ in range(repeats):
        run_dir = Path(tempfile.mkdtemp(prefix="ftq-bench-direct-"))
        argv = [a.replace(str(dep.run_dir("dry-run")), str(run_dir)) for a in plan["command"]]
        (run_dir / "spec.json").write_text(json.dumps(spec))
        (run_dir / "accelerate_config.yaml").write_text(plan["accelerate_config_yaml"])
        t0 = time.perf_counter()
        with open(run_dir / "train.log", "ab") as log:
            subprocess.run(argv, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
        direct.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        job = dep.http.post("/jobs", json=spec).json()
        done = wait(dep, job["id"], {"succeeded", "failed", "cancelled"}, poll=0.1)
        through.append(time.perf_counter() - t0)
        assert done["status"] == "succeeded", done
    d, f = statistics.median(direct), statistics.median(through)
    return {
        "max_steps": max_steps,
        "repeats": repeats,
        "direct_s": round(d, 2),
        "ftq_s": round(f, 2),
        "ratio": round(f / d, 3),
    }


def result(name: str, value: float, unit: str, **extra: Any) -> None:
    """A RESULT line for bench/run_all.py (its docstring has the protocol)."""
    tail = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"RESULT {name} {value:.4g} {unit} {tail}".rstrip(), flush=True)


def report(results: dict[str, Any]) -> None:
    for kind in ("embedded", "redis"):
        lat = results.get(kind, {}).get("post_to_running")
        if not lat:
            continue
        c, s = lat["client_s"], lat["server_s"]
        result(
            f"post_to_running_{kind}_p50",
            c["p50"],
            "s",
            target="<0.5",
            p95_s=c["p95"],
            n=c["n"],
            server_p50_s=s["p50"],
        )
    tiny = results.get("embedded", {}).get("tiny_job")
    if tiny:
        result("tiny_job_by_hand", tiny["direct_s"], "s", steps=tiny["max_steps"], repeats=tiny["repeats"])
        result("tiny_job_through_ftq", tiny["ftq_s"], "s", baseline="tiny_job_by_hand", target="<=1.1")
    print(
        "NOTE dispatch: POST /jobs to the first GET that says running, measured by the client (server_p50 "
        "is the job's started_at - created_at); embedded is `ftq up` (SQLite, filesystem broker), redis is "
        "`ftq api` + `ftq worker` on PostgreSQL and Redis. Each job is cancelled once running."
    )
    print(
        "NOTE dispatch: the tiny job's wall time from POST to succeeded, against the same rendered "
        "`accelerate launch` command run by hand in a scratch directory; alternated, medians."
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="tiny runs each way (by hand, through ftq)")
    ap.add_argument("--skip-redis", action="store_true")
    ap.add_argument("--skip-embedded", action="store_true")
    ap.add_argument("--out", default=str(OUT / "dispatch_bench.json"))
    args = ap.parse_args()
    tiny = tiny_assets()
    results: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()[0]}
    if not args.skip_embedded:
        with deployment("embedded", tiny) as dep:
            dep.wait_worker_ready(0)  # the first sample is not the worker's start-up
            results["embedded"] = {"post_to_running": latency(dep, tiny, args.samples)}
            print("embedded", results["embedded"], flush=True)
            results["embedded"]["tiny_job"] = overhead(dep, tiny, args.steps, args.repeats)
            print("embedded", results["embedded"], flush=True)
    if not args.skip_redis:
        with deployment("redis", tiny) as dep:
            results["redis"] = {"post_to_running": latency(dep, tiny, args.samples)}
            print("redis", results["redis"], flush=True)
    results["load_avg_at_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    report(results)


if __name__ == "__main__":
    main()
