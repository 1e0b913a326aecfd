"""Ingest: metrics.jsonl lines reach the API fast, and soon after the trainer writes them.

    python -m bench.ingest_bench [--lines 100000] [--pace 100] [--lag-seconds 15]

The pace is a stated trainer pace of 100 lines/s (`--pace`): ten times what the tiny CPU job logs and
far above an LLM fine-tune logging every step. Two figures, on PostgreSQL with a real `ftq api`:

1. Throughput: 100,000 lines land in a running job's metrics.jsonl; a separate process runs the
   worker's `worker.ingest.ingest_job` (what the periodic ingest task calls for each running job) until
   it has nothing left, then the API serves the last point. That time is set against the time the
   trainer took to write the lines at its pace (target: under 1/10).
2. Lag: a writer appends lines at the pace; the ingest process runs ingest_job every
   FTQ_INGEST_INTERVAL_SECONDS (1 s, the worker's schedule); a client polls GET /jobs/{id}/metrics
   every 100 ms. Lag = when a step is first served - when its line was written (target p95 < 2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import REPO, log, note, result
from bench.seed import api_server, copy_jobs
from tests.harness import postgres

_INGEST_LOOP = r"""
import sys, time
from worker.ingest import ingest_job
job_id, mode, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode == "drain":
    t = time.perf_counter()
    total = 0
    while True:
        n = ingest_job(job_id)
        total += n
        if n == 0:
            break
    print(f"INGESTED {total} {time.perf_counter() - t:.3f}", flush=True)
else:
    while True:
        start = time.monotonic()
        ingest_job(job_id)
        time.sleep(max(0.0, interval - (time.monotonic() - start)))
"""


def point_line(step: int) -> str:
    return (
        json.dumps(
            {
                "step": step,
                "epoch": step / 1000,
                "loss": 3.0 - step * 1e-5,
                "learning_rate": 2e-4,
                "grad_norm": 1.25,
                "tokens_per_second": 5120.5,
                "time": time.time(),
            }
        )
        + "\n"
    )


def ingest_env(url: str, data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_")}
    env.update(
        {"FTQ_DATABASE_URL": url, "FTQ_DATA_DIR": str(data), "FTQ_ENV": "test", "PYTHONPATH": str(REPO)}
    )
    return env


def bench_throughput(url: str, data: Path, lines: int, pace: float) -> None:
    import httpx

    job = "job_ingest00000001"
    copy_jobs(url, [(job, "running")], max_steps=lines)
    run = data / "runs" / job
    run.mkdir(parents=True)
    with (run / "metrics.jsonl").open("w") as f:
        f.writelines(point_line(s) for s in range(1, lines + 1))
    with api_server(url, data) as server:
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _INGEST_LOOP, job, "drain", "0"],
            env=ingest_env(url, data),
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        page = httpx.get(
            f"{server.url}/jobs/{job}/metrics", params={"after_step": lines - 1}, timeout=30
        ).json()
        elapsed = time.perf_counter() - t
    assert page["data"] and page["data"][-1]["step"] == lines, page
    ingested = out.stdout.split()
    log(f"ingest: {ingested[1]} points in {ingested[2]} s inside the worker; {elapsed:.1f} s to the API")
    written = lines / pace
    result("ingest_write_at_pace", written, "s", pace=f"{pace:g}lines/s")
    result(
        "ingest_100k_to_api",
        elapsed,
        "s",
        baseline="ingest_write_at_pace",
        target="<=0.1",
        lines_per_s=f"{lines / elapsed:.0f}",
    )


def bench_lag(url: str, data: Path, pace: float, seconds: float) -> None:
    import httpx

    job = "job_ingestlag00001"
    n = int(pace * seconds)
    copy_jobs(url, [(job, "running")], max_steps=n)
    run = data / "runs" / job
    run.mkdir(parents=True)
    path = run / "metrics.jsonl"
    path.touch()
    written: dict[int, float] = {}
    seen: dict[int, float] = {}
    done = threading.Event()

    def writer() -> None:
        start = time.monotonic()
        with path.open("a") as f:
            for step in range(1, n + 1):
                delay = start + step / pace - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                f.write(point_line(step))
                f.flush()  # the trainer flushes every line (metrics.jsonl callback)
                written[step] = time.monotonic()

    with api_server(url, data) as server:
        ingest = subprocess.Popen(
            [sys.executable, "-c", _INGEST_LOOP, job, "loop", "1.0"], env=ingest_env(url, data), cwd=REPO
        )
        try:
            w = threading.Thread(target=writer)
            w.start()

            def poller() -> None:
                after = 0
                with httpx.Client(base_url=server.url, timeout=10) as client:
                    while not done.is_set():
                        page = client.get(f"/jobs/{job}/metrics", params={"after_step": after}).json()
                        now = time.monotonic()
                        for p in page["data"]:
                            seen.setdefault(p["step"], now)
                        after = page["next_after_step"]
                        if after >= n:
                            return
                        time.sleep(0.1)

            p = threading.Thread(target=poller)
            p.start()
            w.join()
            p.join(timeout=30)
            done.set()
        finally:
            ingest.terminate()
            ingest.wait(timeout=20)
    lags = sorted(seen[s] - written[s] for s in written if s in seen)
    missing = n - len(lags)
    p50, p95 = lags[len(lags) // 2], lags[int(len(lags) * 0.95)]
    log(
        f"lag over {len(lags)} points: p50 {p50:.2f} s, p95 {p95:.2f} s, max {lags[-1]:.2f} s, "
        f"missing {missing}"
    )
    result("ingest_lag_p50", p50, "s")
    result("ingest_lag_p95", p95, "s", target="<2", missing=missing)
    note(
        f"ingest lag: {n} lines written at {pace:g} lines/s, ingest_job every 1 s in its own process (the "
        "worker's schedule), the API polled every 100 ms"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--pace", type=float, default=100.0, help="the trainer's lines per second")
    ap.add_argument("--lag-seconds", type=float, default=15.0)
    args = ap.parse_args(argv)
    try:
        import worker.ingest  # noqa: F401
    except ImportError:
        note("ingest bench pending: worker/ingest.py is not in the tree yet")
        return 0
    with (
        postgres.database("ftq_perfbench_ingest", migrate=True) as url,
        tempfile.TemporaryDirectory(prefix="ftq-bench-ingest-") as tmp,
    ):
        data = Path(tmp)
        bench_throughput(url, data, args.lines, args.pace)
        bench_lag(url, data, args.pace, args.lag_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
