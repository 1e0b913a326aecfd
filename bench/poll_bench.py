"""Metrics polling: ftq against /healthz on the same server, against MLflow, and as history grows.

    python -m bench.poll_bench [--seconds 10] [--jobs 1000] [--points 2000] [--no-mlflow] [--rounds 3]
        [--only poll|mlflow|history|status|workers|up|openai ...]

A fresh PostgreSQL database gets `--jobs` jobs with `--points` points each (COPY), a real `ftq api`
process serves it, and wrk (64 connections, one client thread so the load generator leaves the server
its core) polls `GET /jobs/{id}/metrics?after_step=S` on random jobs with S a few steps before the
end, the incremental poll a dashboard makes every few seconds. The same wrk run against `/healthz`
is the baseline. The peer is an MLflow tracking server (sqlite store, one worker) holding the same
runs' loss history, polled through its metric-history endpoint by the same wrk.

Then: an incremental poll on a job with 100,000 points against one with 100, and `GET
/jobs?status=running` with 10,000 jobs against 100 (the running set stays 20: history grows, the
running jobs do not), each with the plan PostgreSQL uses.

Last (`--only up`), the figure a dashboard on a laptop sees: `ftq up` on its embedded defaults (SQLite),
a finished job with 2,000 points, 16 client threads polling its metrics for 4 s, then /healthz for 4 s,
three rounds; the median round's ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench import OUT, REPO, log, note, result, scratch
from bench.seed import analyze, api_server, copy_jobs, copy_points, explain, job_ids, spec_json
from bench.wrk import have_wrk, interleaved, measured, sequential_latency, threads_load, wrk_run
from tests.harness import Deployment, free_port, postgres, wait_until

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

CONNECTIONS = 64


def _answers(url: str, proc: subprocess.Popen[bytes], logfile: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"exited with {proc.returncode}:\n{logfile.read_text()[-2000:]}")
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


def poll_paths(ids: list[str], points: int, n: int = 4000) -> list[str]:
    rng = random.Random(7)
    return [f"/jobs/{rng.choice(ids)}/metrics?after_step={points - rng.randint(1, 10)}" for _ in range(n)]


def bench_poll_vs_health(url: str, seconds: float, n_jobs: int, n_points: int) -> dict[str, float]:
    ids = job_ids(n_jobs)
    t = time.perf_counter()
    copy_jobs(url, [(i, "running") for i in ids])
    rows = copy_points(url, ids, n_points)
    analyze(url)
    log(f"loaded {n_jobs} jobs, {rows} points in {time.perf_counter() - t:.1f} s")
    plan = explain(
        url,
        "SELECT * FROM metric_points WHERE job_id = %s AND step > %s ORDER BY step LIMIT 1000",
        (ids[0], n_points - 5),
    )
    note(f"metrics poll plan: {plan}")
    paths = poll_paths(ids, n_points)
    with api_server(url) as server:
        wrk_run(server.url, paths[:200], connections=CONNECTIONS, seconds=2)  # warm the pool and the caches
        both = interleaved(
            server, {"healthz": ["/healthz"], "metrics": paths}, connections=CONNECTIONS, seconds=seconds
        )
        health, poll = both["healthz"], both["metrics"]
        # A dashboard polls every few seconds: latency at half the saturated rate is what its users see.
        # Each client waits a random 0..2x think_ms (think_ms on average) between polls, so a cycle of
        # CONNECTIONS / (rate / 2) seconds gives half the rate.
        think = int(CONNECTIONS / (poll["req_s"] / 2) * 1000)
        half = measured(server, paths, connections=CONNECTIONS, seconds=seconds, think_ms=max(1, think))
    log(f"healthz {health}")
    log(f"metrics {poll}")
    log(f"metrics at half load {half}")
    result(
        "healthz",
        health["req_s"],
        "req/s",
        p99_ms=f"{health['p99_ms']:.1f}",
        cpu_ms=f"{health['cpu_ms']:.2f}",
        errors=health["errors"],
    )
    result(
        "metrics_poll",
        poll["req_s"],
        "req/s",
        baseline="healthz",
        target=">=0.5",
        p99_ms=f"{poll['p99_ms']:.1f}",
        cpu_ms=f"{poll['cpu_ms']:.2f}",
        errors=poll["errors"],
    )
    result("healthz_cpu_per_req", health["cpu_ms"], "ms")
    result("metrics_poll_cpu_per_req", poll["cpu_ms"], "ms", baseline="healthz_cpu_per_req", target="<=2")
    result(
        "metrics_poll_p99_half_load",
        half["p99_ms"],
        "ms",
        target="<50",
        rate=f"{half['req_s']:.0f}req/s",
        errors=half["errors"],
    )
    result("metrics_poll_p99_saturated", poll["p99_ms"], "ms")
    note(
        f"p99 under saturation is queueing: {CONNECTIONS} clients with no pause between requests wait "
        f"{CONNECTIONS}/throughput on average whatever the server does; the latency figure that matters is "
        "at half the saturated rate (each client pausing a random 0..2x interval between polls)"
    )
    poll["half_p99_ms"] = half["p99_ms"]
    return poll


def bench_api_workers(url: str, seconds: float, n_jobs: int, n_points: int) -> None:
    """`ftq api --workers 2` against `--workers 1` on the same store and load: what the second API process
    adds on this machine (2 cores: the second process competes with wrk and PostgreSQL for them)."""
    ids = job_ids(n_jobs, "w")
    copy_jobs(url, [(i, "running") for i in ids])
    copy_points(url, ids, n_points)
    analyze(url)
    paths = poll_paths(ids, n_points)
    rates: dict[int, dict[str, float]] = {}
    for workers in (1, 2):
        root = scratch(f"api-workers{workers}-")
        dep = Deployment(
            root, mode="api", store="postgres", database_url=url, server_args=("--workers", str(workers))
        )
        with dep as server:
            wrk_run(server.url, paths[:200], connections=CONNECTIONS, seconds=2)
            # Throughput and latency only: the server's CPU per request would count the parent process,
            # not the uvicorn workers that serve.
            rates[workers] = wrk_run(server.url, paths, connections=CONNECTIONS, seconds=seconds)
        log(f"--workers {workers}: {rates[workers]}")
        result(
            f"metrics_poll_api_workers_{workers}",
            rates[workers]["req_s"],
            "req/s",
            p99_ms=f"{rates[workers]['p99_ms']:.1f}",
        )
    ratio = rates[2]["req_s"] / max(rates[1]["req_s"], 1e-9)
    result("metrics_poll_second_api_process", ratio, "x", baseline="metrics_poll_api_workers_1")
    note(
        f"`ftq api --workers 2` serves {ratio:.2f}x the metrics polls of one process on "
        f"{os.cpu_count()} cores (wrk and PostgreSQL share them)"
    )


# MLflow --------------------------------------------------------------------------------------------------

_MLFLOW_LOG = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

uri, n_runs, n_points = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = MlflowClient(tracking_uri=uri)
exp = client.create_experiment("ftq-bench")
runs = [client.create_run(exp).info.run_id for _ in range(n_runs)]

def log(run_id):
    for start in range(1, n_points + 1, 1000):
        batch = [Metric("loss", 3.0 - s * 1e-5, 1_700_000_000_000 + s, s)
                 for s in range(start, min(start + 1000, n_points + 1))]
        client.log_batch(run_id, metrics=batch)

with ThreadPoolExecutor(4) as pool:
    list(pool.map(log, runs))
print(json.dumps(runs))
"""


def mlflow_bin() -> Path | None:
    """mlflow from the project venv, else from bench/out/mlflow-venv (made on first use)."""
    here = Path(sys.executable).parent / "mlflow"
    if here.exists():
        return here
    side = OUT / "mlflow-venv" / "bin" / "mlflow"
    if side.exists():
        return side
    if os.environ.get("FTQ_BENCH_NO_INSTALL"):
        return None
    # Kept out of the project venv: MLflow brings a large dependency tree the service does not need.
    log("installing mlflow into bench/out/mlflow-venv (once)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(OUT / "mlflow-venv")], check=True)
        subprocess.run([str(OUT / "mlflow-venv" / "bin" / "pip"), "install", "-q", "mlflow"], check=True)
    except subprocess.CalledProcessError:
        return None
    return side if side.exists() else None


def bench_mlflow(seconds: float, n_runs: int, n_points: int, ftq_poll: dict[str, float]) -> None:
    mlflow = mlflow_bin()
    if mlflow is None:
        note("MLflow peer skipped: mlflow could not be installed (no package index?)")
        return
    version = subprocess.run([str(mlflow), "--version"], capture_output=True, text=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="ftq-bench-mlflow-"))
    port = free_port()
    logfile = OUT / "mlflow-server.log"
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(mlflow),
                "server",
                "--backend-store-uri",
                f"sqlite:///{tmp / 'mlflow.db'}",
                "--artifacts-destination",
                str(tmp / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until("the MLflow server", lambda: _answers(base + "/health", proc, logfile), timeout=180)
        t = time.perf_counter()
        py = mlflow.parent / "python"
        out_ = subprocess.run(
            [str(py), "-c", _MLFLOW_LOG, base, str(n_runs), str(n_points)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs: list[str] = json.loads(out_.stdout.strip().splitlines()[-1])
        log(f"mlflow: logged {n_runs} runs x {n_points} points in {time.perf_counter() - t:.1f} s")
        rng = random.Random(7)
        history = [
            f"/api/2.0/mlflow/metrics/get-history?run_id={rng.choice(runs)}&metric_key=loss"
            for _ in range(4000)
        ]
        # One request alone first: on a store this size MLflow answers in seconds, so the load run gets
        # a timeout and a length that let requests finish (wrk counts only finished ones).
        single = sequential_latency(base + history[0], n=2, warm=1, timeout_s=300)
        log(f"mlflow get-history, one at a time: {single}")
        slow = single["p50_ms"] / 1000
        length = min(max(seconds, 20 * slow, 30), 300)
        hist = wrk_run(
            base, history, connections=CONNECTIONS, seconds=length, timeout_s=min(max(10, 100 * slow), length)
        )
        log(f"mlflow get-history {hist}")
    except subprocess.CalledProcessError as exc:
        note(f"MLflow peer failed: {exc.stderr[-500:] if exc.stderr else exc}")
        return
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    result(
        "mlflow_get_history",
        hist["req_s"],
        "req/s",
        p99_ms=f"{hist['p99_ms']:.1f}",
        errors=hist["errors"],
        single_ms=f"{single['p50_ms']:.0f}",
    )
    result("metrics_poll_vs_mlflow", ftq_poll["req_s"], "req/s", baseline="mlflow_get_history", target=">=3")
    note(
        f"MLflow peer: {version}, `mlflow server --workers 1` on a sqlite store, {n_runs} runs x {n_points} "
        "`loss` points logged with MlflowClient.log_batch; polled with GET "
        "/api/2.0/mlflow/metrics/get-history (it has no after-step filter, so each poll returns the whole "
        "history of one key, while ftq's returns the few newest points with all seven fields)"
    )


# Poll cost as history grows -------------------------------------------------------------------------


def bench_history(url: str, seconds: float) -> None:
    """An incremental poll on a job with 100,000 points against one with 100 (same database)."""
    big, small = "job_hist0000100000", "job_hist0000000100"
    copy_jobs(url, [(big, "running"), (small, "running")])
    copy_points(url, [big], 100_000)
    copy_points(url, [small], 100)
    analyze(url)
    plan = explain(
        url,
        "SELECT * FROM metric_points WHERE job_id = %s AND step > %s ORDER BY step LIMIT 1000",
        (big, 99_995),
    )
    note(f"poll on 100,000 points, plan: {plan}")
    with api_server(url) as server:
        figures = {}
        for job, n in ((small, 100), (big, 100_000)):
            paths = [f"/jobs/{job}/metrics?after_step={n - k}" for k in range(1, 11)]
            seq = sequential_latency(server.url + paths[4], n=400)
            load = wrk_run(server.url, paths, connections=CONNECTIONS, seconds=seconds / 2)
            figures[n] = (seq, load)
            log(f"history {n}: {seq} {load}")
    _small_and_big("poll_100_points", "poll_100k_points", figures[100], figures[100_000], "<=1.5", ">=0.67")


def _small_and_big(
    small: str,
    big: str,
    small_figures: tuple[dict[str, float], dict[str, float]],
    big_figures: tuple[dict[str, float], dict[str, float]],
    latency_target: str,
    rps_target: str,
) -> None:
    """One poll on a small and a big store, (sequential latency, wrk load) each: the median latency and
    the req/s under load, the big one's as a ratio to the small one's (`<name>`, `<name>_rps`)."""
    (s_seq, s_load), (b_seq, b_load) = small_figures, big_figures
    result(small, s_seq["p50_ms"], "ms")
    result(big, b_seq["p50_ms"], "ms", baseline=small, target=latency_target)
    result(f"{small}_rps", s_load["req_s"], "req/s")
    result(f"{big}_rps", b_load["req_s"], "req/s", baseline=f"{small}_rps", target=rps_target)


def bench_status(seconds: float) -> None:
    """`GET /jobs?status=running` with 100 jobs, then with 10,000 (20 of them running both times)."""
    rng = random.Random(11)
    with postgres.database("ftq_perfbench_status", migrate=True) as url:
        figures: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
        have = 0
        for total in (100, 10_000):
            ids = job_ids(total - have, tag="sa" if total == 100 else "sb")  # distinct per batch
            copy_jobs(url, [(i, "succeeded") for i in ids])
            have = total
            # 20 running jobs spread over the whole history, oldest to newest.
            import psycopg

            with psycopg.connect(url) as conn:
                conn.execute("UPDATE jobs SET status = 'succeeded' WHERE status = 'running'")
                seqs = sorted(rng.sample(range(1, total + 1), 20))
                conn.execute("UPDATE jobs SET status = 'running' WHERE seq = ANY(%s)", (seqs,))
            analyze(url)
            plan = explain(
                url,
                "SELECT * FROM jobs WHERE owner = %s AND status IN (%s) ORDER BY seq DESC LIMIT 51",
                ("local", "running"),
            )
            note(f"status poll plan with {total} jobs: {plan}")
            with api_server(url) as server:
                seq = sequential_latency(server.url + "/jobs?status=running", n=200)
                load = wrk_run(
                    server.url, ["/jobs?status=running"], connections=CONNECTIONS, seconds=seconds / 2
                )
            figures[total] = (seq, load)
            log(f"status {total}: {seq} {load}")
    _small_and_big(
        "status_poll_100_jobs", "status_poll_10k_jobs", figures[100], figures[10_000], "<=2", ">=0.5"
    )


# `ftq up` (SQLite) -----------------------------------------------------------------------------------

UP_JOB = "job_00000000up000001"
UP_POINTS = 2000
UP_THREADS = 16


@contextlib.contextmanager
def _seed_job(data_dir: Path, job_id: str, name: str, points: int) -> Iterator[Session]:
    """A succeeded job of `local` and its points, written in the SQLite store `ftq up` made in data_dir;
    yields the session for more rows, committed when the block ends."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from ftq.store import repository
    from tests.harness.rows import job_row, training_points

    engine = create_engine(f"sqlite:///{data_dir.resolve() / 'ftq.db'}")
    try:
        with Session(engine) as s:
            s.add(job_row(job_id, name=name, owner="local", status="succeeded", spec=json.loads(spec_json())))
            s.flush()
            repository.upsert_points(s, job_id, training_points(points))
            yield s
            s.commit()
    finally:
        engine.dispose()


def _seed_up(data_dir: Path) -> None:
    """The finished job and its points (all this bench reads)."""
    with _seed_job(data_dir, UP_JOB, "poll", UP_POINTS):
        pass


def bench_up(seconds: float = 4.0, rounds: int = 3) -> None:
    """The metrics poll against /healthz on `ftq up` (SQLite), 16 client threads, median of `rounds`."""
    root = scratch("up-")
    with Deployment(root, mode="up") as server:
        _seed_up(server.data_dir)

        def polls(r: int) -> list[str]:
            # Dashboards that have caught up: each asks for the points after one of the last 16 steps.
            # Another `limit` each round (as large as ever needed), so each round reads the store again
            # before the poll cache serves its repeats.
            metrics = f"/jobs/{UP_JOB}/metrics"
            return [f"{metrics}?after_step={UP_POINTS - 1 - k}&limit={1000 - r}" for k in range(16)]

        def run(paths: list[str]) -> tuple[float, int, float]:
            before, client_before = server.cpu_seconds(), time.process_time()
            load = threads_load(server.url, paths, threads=UP_THREADS, seconds=seconds)
            n = max(1.0, load["req_s"] * seconds)
            log(f"client CPU per request {(time.process_time() - client_before) * 1000 / n:.2f} ms")
            return load["req_s"], int(load["errors"]), (server.cpu_seconds() - before) * 1000 / n

        threads_load(server.url, ["/healthz"], threads=UP_THREADS, seconds=1)  # warm both paths
        threads_load(server.url, polls(rounds), threads=UP_THREADS, seconds=1)
        ratios: list[float] = []
        rounds_out: list[tuple[tuple[float, int, float], tuple[float, int, float]]] = []
        for r in range(rounds):
            health, poll = run(["/healthz"]), run(polls(r))
            rounds_out.append((health, poll))
            ratios.append(poll[0] / health[0])
            log(
                f"ftq up round {r}: healthz {health[0]:.0f} req/s ({health[2]:.2f} ms CPU), "
                f"metrics poll {poll[0]:.0f} req/s ({poll[2]:.2f} ms CPU)"
            )
    median = sorted(range(rounds), key=lambda i: ratios[i])[rounds // 2]
    health, poll = rounds_out[median]
    errors = sum(h[1] + p[1] for h, p in rounds_out)
    result("up_healthz", health[0], "req/s", cpu_ms=f"{health[2]:.2f}", errors=errors)
    result(
        "up_metrics_poll",
        poll[0],
        "req/s",
        baseline="up_healthz",
        target=">=1.2",
        cpu_ms=f"{poll[2]:.2f}",
        rounds=",".join(f"{x:.2f}" for x in ratios),
    )
    note(
        f"up: `ftq up` on SQLite (cpu_ms: its server process's CPU per request), one finished job with "
        f"{UP_POINTS} points; {UP_THREADS} client threads (keep-alive sockets) for {seconds:.0f} s on "
        "/healthz, "
        "then on the metrics poll after one of the last 16 steps (another limit each round, so each round "
        f"reads the store before the poll cache answers), {rounds} rounds; the figures are the median round's"
    )


# The OpenAI-compatible surface against the native one (`ftq up`, SQLite) ------------------------------

V1_JOB = "job_00000000000a1001"
V1_POINTS = 200
V1_EVENTS = 12


def _seed_v1(data_dir: Path) -> None:
    """A succeeded job made through /v1 (its openai_jobs row), its points and events, in `ftq up`'s store."""
    from ftq.contract.events import EventType
    from ftq.store import events
    from ftq.store.models import OpenAIJob

    with _seed_job(data_dir, V1_JOB, "v1", V1_POINTS) as s:
        s.add(
            OpenAIJob(
                job_id=V1_JOB,
                model="ftq-tiny",
                suffix="bench",
                seed=42,
                method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}}},
            )
        )
        for i in range(V1_EVENTS):
            events.record(
                s, V1_JOB, EventType.checkpoint, {"step": i * 10, "path": f"checkpoint-{i}"}, owner="local"
            )


def bench_openai(seconds: float = 3.0, rounds: int = 3) -> None:
    """Polling a job and its events through /v1 against the native routes, on one `ftq up` (SQLite), 16
    client threads, each pair measured back to back, the median of `rounds`."""
    root = scratch("v1-")
    v1_id = "ftjob-" + V1_JOB.removeprefix("job_")
    pairs = {
        "job": ([f"/jobs/{V1_JOB}"], [f"/v1/fine_tuning/jobs/{v1_id}"]),
        "events": ([f"/jobs/{V1_JOB}/events?limit=20"], [f"/v1/fine_tuning/jobs/{v1_id}/events?limit=20"]),
    }
    with Deployment(root, mode="up") as server:
        _seed_v1(server.data_dir)
        for native, v1 in pairs.values():
            for paths in (native, v1):
                answer = httpx.get(server.url + paths[0], timeout=10)
                assert answer.status_code == 200, (paths, answer.text)
                threads_load(server.url, paths, threads=UP_THREADS, seconds=1)  # warm
        for name, (native, v1) in pairs.items():
            ratios: list[float] = []
            figures: list[tuple[float, float, int]] = []
            for r in range(rounds):
                a = threads_load(server.url, native, threads=UP_THREADS, seconds=seconds)
                b = threads_load(server.url, v1, threads=UP_THREADS, seconds=seconds)
                ratios.append(b["req_s"] / a["req_s"])
                figures.append((a["req_s"], b["req_s"], int(a["errors"] + b["errors"])))
                log(f"v1 {name} round {r}: native {a['req_s']:.0f} req/s, /v1 {b['req_s']:.0f} req/s")
            median = sorted(range(rounds), key=lambda i: ratios[i])[rounds // 2]
            a_rps, b_rps, _ = figures[median]
            errors = sum(f[2] for f in figures)
            result(f"native_{name}_poll", a_rps, "req/s", errors=errors)
            result(
                f"v1_{name}_poll",
                b_rps,
                "req/s",
                baseline=f"native_{name}_poll",
                target=">=0.9",
                rounds=",".join(f"{x:.2f}" for x in ratios),
            )
    note(
        f"openai: `ftq up` on SQLite, one succeeded /v1 job with {V1_POINTS} points and {V1_EVENTS} events; "
        f"{UP_THREADS} client threads for {seconds:.0f} s on the native route then on its /v1 projection "
        f"(GET /jobs/{{id}} vs GET /v1/fine_tuning/jobs/{{id}}; GET /jobs/{{id}}/events?limit=20 vs "
        f"GET /v1/fine_tuning/jobs/{{id}}/events?limit=20), {rounds} rounds; the median round's figures"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--seconds", type=float, help="length of each load run (default: wrk's 10, `up`'s 4, `openai`'s 3)"
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--no-mlflow", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the `up` and `openai` figures")
    ap.add_argument(
        "--only",
        choices=["poll", "mlflow", "history", "status", "workers", "up", "openai"],
        action="append",
    )
    args = ap.parse_args(argv)
    threads = {"rounds": args.rounds} | ({"seconds": args.seconds} if args.seconds else {})
    args.seconds = args.seconds or 10.0
    # `ftq up`'s figure and /v1's are benches of their own in run_all (keys `up`, `openai`).
    only = set(args.only or ["poll", "mlflow", "history", "status", "workers"])
    if only - {"up", "openai"} and not have_wrk():  # the `ftq up` figure's clients are Python threads
        print("poll_bench needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    poll: dict[str, Any] = {}
    if only & {"poll", "mlflow", "history", "workers"}:
        note(
            "ftq side: one `ftq api` process (uvicorn, one worker: what `ftq api` runs) on PostgreSQL; load "
            f"from wrk, {CONNECTIONS} connections, 1 thread, {args.seconds:.0f} s per figure"
        )
        with postgres.database("ftq_perfbench", migrate=True) as url:
            _on_postgres(url, args, only, poll)
    if "status" in only:
        bench_status(args.seconds)
    if "mlflow" in only and not args.no_mlflow:
        bench_mlflow(args.seconds, args.jobs, args.points, poll)
    if "up" in only:
        bench_up(**threads)
    if "openai" in only:
        bench_openai(**threads)
    return 0


def _on_postgres(url: str, args: argparse.Namespace, only: set[str], poll: dict[str, Any]) -> None:
    """The figures on the PostgreSQL database `url` (`poll` gets the metrics poll's, for the MLflow peer)."""
    if only & {"poll", "mlflow"}:
        poll.update(bench_poll_vs_health(url, args.seconds, args.jobs, args.points))
    if "history" in only:
        bench_history(url, args.seconds)
    if "workers" in only:
        bench_api_workers(url, args.seconds, min(args.jobs, 200), min(args.points, 200))


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
