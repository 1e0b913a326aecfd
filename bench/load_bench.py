"""Load: 200 concurrent pollers of status, logs and metrics while jobs write, on PostgreSQL.

    python -m bench.load_bench [--seconds 60] [--pollers 200] [--jobs 20]

A fresh database holds `--jobs` running jobs (plus 500 finished ones, so listing has history to skip)
whose run directories grow while the load runs: a writer appends 10 train.log lines and 10
metrics.jsonl lines per second to each, and a separate process runs the worker's ingest_job for each
running job every second. wrk keeps `--pollers` connections busy with a mix of GET /jobs/{id} (status),
GET /jobs/{id}/logs?offset=..., GET /jobs/{id}/metrics?after_step=... and GET /jobs?status=running,
sending the next request as soon as the last returns, for `--seconds`. Target: zero errors (socket
errors, timeouts, non-2xx). Then the same mix with each poller pausing a random 0..2 s between
requests (dashboards polling about once a second) for the latency people see.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import REPO, log, note, result
from bench.ingest_bench import ingest_env, point_line
from bench.seed import api_server, copy_jobs, copy_points, job_ids
from bench.wrk import measured
from tests.harness import postgres

_INGEST_ALL = r"""
import sys, time
from worker.ingest import ingest_job
ids = sys.argv[1].split(",")
while True:
    start = time.monotonic()
    for job_id in ids:
        ingest_job(job_id)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))
"""


def mix(ids: list[str], seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    paths = []
    for _ in range(3000):
        job = rng.choice(ids)
        kind = rng.random()
        if kind < 0.3:
            paths.append(f"/jobs/{job}")
        elif kind < 0.6:
            paths.append(f"/jobs/{job}/metrics?after_step={rng.randint(0, 200)}")
        elif kind < 0.9:
            paths.append(f"/jobs/{job}/logs?offset={rng.randint(0, 20000)}&limit=4096")
        else:
            paths.append("/jobs?status=running&limit=20")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the saturated run")
    ap.add_argument("--paced-seconds", type=float, default=20.0, help="length of the paced run")
    ap.add_argument("--pollers", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=20)
    args = ap.parse_args(argv)
    ids = job_ids(args.jobs, tag="load")
    stop = threading.Event()
    with (
        postgres.database("ftq_perfbench_load", migrate=True) as url,
        tempfile.TemporaryDirectory(prefix="ftq-bench-load-") as tmp,
    ):
        data = Path(tmp)
        copy_jobs(url, [(i, "succeeded") for i in job_ids(500, tag="done")])
        copy_jobs(url, [(i, "running") for i in ids])
        copy_points(url, job_ids(500, tag="done"), 200)
        for job in ids:
            (data / "runs" / job).mkdir(parents=True)
            (data / "runs" / job / "train.log").write_text(
                "".join(f"step {s} loss 3.0\n" for s in range(1000))
            )

        def writer() -> None:
            step = 0
            while not stop.is_set():
                step += 10
                for job in ids:
                    run = data / "runs" / job
                    with (run / "train.log").open("a") as f:
                        f.writelines(
                            f"{time.time():.3f} step {step + k} loss {3 - step * 1e-4:.4f}\n"
                            for k in range(10)
                        )
                    with (run / "metrics.jsonl").open("a") as f:
                        f.writelines(point_line(step + k) for k in range(10))
                stop.wait(1.0)

        w = threading.Thread(target=writer, daemon=True)
        w.start()
        ingest = subprocess.Popen(
            [sys.executable, "-c", _INGEST_ALL, ",".join(ids)], env=ingest_env(url, data), cwd=REPO
        )
        try:
            with api_server(url, data) as server:
                paths = mix(ids)
                measured(server, paths[:300], connections=32, seconds=2)  # warm up
                sat = measured(server, paths, connections=args.pollers, seconds=args.seconds)
                paced = measured(
                    server, paths, connections=args.pollers, seconds=args.paced_seconds, think_ms=1000
                )
        finally:
            stop.set()
            ingest.terminate()
            ingest.wait(timeout=20)
    log(f"saturated {sat}")
    log(f"paced {paced}")
    result("load_requests", sat["requests"], "req", errors=sat["errors"])
    result("load_errors", sat["errors"], "errors", target="<=0")
    result("load_req_s", sat["req_s"], "req/s", cpu_ms=f"{sat['cpu_ms']:.2f}")
    result("load_p50", sat["p50_ms"], "ms")
    result("load_p99", sat["p99_ms"], "ms")
    result("load_paced_p50", paced["p50_ms"], "ms", rate=f"{paced['req_s']:.0f}req/s")
    result("load_paced_p99", paced["p99_ms"], "ms", errors=paced["errors"])
    result("load_paced_errors", paced["errors"], "errors", target="<=0")
    note(
        f"load: {args.pollers} wrk connections, one `ftq api` process on PostgreSQL, {args.jobs} running "
        "jobs growing by 10 log lines and 10 points per second each while ingest runs; mix 30% status, "
        f"30% metrics, 30% logs, 10% list; saturated for {args.seconds:.0f} s, then paced (random 0..2 s "
        f"between polls) for {args.paced_seconds:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
