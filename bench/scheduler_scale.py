"""The scheduler at scale on PostgreSQL + Redis: 10,000 queued and 1,000 running job rows.

    python -m bench.scheduler_scale [--queued 10000] [--running 1000] [--dispatch 200] [--workers 1,2,4]
        [--only tick|decide|dispatch ...]

The running jobs are rows whose handle is one cheap stand-in process (`sleep`), so the launcher's poll sees
each of them alive without 1,000 trainers. Figures:

1. One controller tick (`worker.controller.reconcile`: poll every running job, settle none, then one
   scheduling pass that ranks every queued job and writes its position, reason and estimated start), the
   first (every queue row written) and the steady one (only changed rows written); and `schedule()` alone.
2. One scheduling decision (`worker.scheduling.decide`, pure, in memory) on the same numbers.
3. The tick with 0 and with 10,000 finished jobs in the store (ratio: should be ~1), and with 250, 500
   and 1,000 running jobs (time per running job: should stay about flat, i.e. linear).
4. Dispatch throughput: `--dispatch` jobs' slots freed, their `ftq.submit` tasks sent through Redis, and
   1, 2 and 4 `ftq worker` processes (no beat; `--workers`) claiming and launching them (launch.sh starting
   a stand-in interpreter that sleeps): jobs launched per second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import REPO, log, note, result, scratch
from tests.harness import FTQ, postgres
from tests.harness.inprocess import reset_caches
from tests.harness.redis import PrivateRedis

OWNERS = [f"team{i:02d}" for i in range(20)]
_COLUMNS = (
    "id", "name", "owner", "status", "spec", "launcher", "device", "created_at", "updated_at", "started_at",
    "finished_at", "attempt", "metrics_offset", "plan", "priority", "devices", "limit_seconds",
    "estimated_seconds",
    "resources", "pid", "pid_start_ticks", "device_seconds", "run_seconds",
)  # fmt: skip


def _spec() -> str:
    from ftq.contract.spec import JobSpec

    return JobSpec.model_validate(
        {
            "name": "bench",
            "model": {"name_or_path": "org/model-7b"},
            "dataset": {"name_or_path": "org/chat-data", "text_field": "text"},
            "training": {"max_steps": 1000},
            "resources": {"device": "cpu", "processes_per_node": 1},
        }
    ).model_dump_json()


PLACEHOLDER = "job_PLACEHOLDER0000"


def plan_template(data_dir: Path) -> str:
    """The rendered plan of the bench spec as JSON, its job id a placeholder to replace per job (what POST
    /jobs stores; rendering 10,000 plans would take longer than the bench)."""
    from ftq.contract import runs
    from ftq.contract.spec import JobSpec
    from ftq.planning.render import render_plan
    from ftq.runtime.settings import Settings

    # The launch runs the stand-in interpreter (it sleeps), not accelerate: launch.sh names it.
    settings = Settings(data_dir=data_dir, python=str(data_dir / "stub-python"))
    plan = render_plan(
        JobSpec.model_validate_json(_spec()),
        job_id=PLACEHOLDER,
        run_dir=runs.run_dir(settings.runs_dir, PLACEHOLDER),
        settings=settings,
    )
    return plan.model_dump_json()


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def seed(url: str, *, queued: int, running: int, finished: int, stand_in: int, data_dir: Path) -> None:
    """Empty the store's jobs, then COPY the rows in (what POST /jobs and the controller would write)."""
    import psycopg
    from psycopg import sql

    spec = _spec()
    plan = plan_template(data_dir)
    ticks = start_ticks(stand_in)
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        # Every table but the migrations' own, in one statement: a table added later that references jobs
        # (samples did) cannot make the TRUNCATE fail, and no row of an earlier seed is left behind.
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
        )
        tables = [sql.Identifier(name) for (name,) in cur.fetchall()]
        cur.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(tables)))
        with cur.copy(f"COPY jobs ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
            n = 0
            for status, count in (("succeeded", finished), ("running", running), ("queued", queued)):
                for _ in range(count):
                    n += 1
                    at = now - timedelta(hours=2) + timedelta(milliseconds=n)
                    owner = OWNERS[n % len(OWNERS)]
                    run = status == "running"
                    done = status == "succeeded"
                    copy.write_row(
                        (
                            f"job_{n:016x}", "bench", owner, status, spec, "local", "cpu", at, at,
                            now - timedelta(minutes=10) if run else at if done else None,
                            at + timedelta(minutes=5) if done else None, 0, 0,
                            plan.replace(PLACEHOLDER, f"job_{n:016x}"),
                            ("low", "normal", "high")[n % 3], 1, 3600.0, 1800.0,
                            json.dumps({"cpu_slots": 1}) if run else None,
                            stand_in if run else None, ticks if run else None,
                            300.0 if done else None, 300.0 if done else None,
                        )
                    )  # fmt: skip
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")


def configure(url: str, data_dir: Path, **settings: Any) -> None:
    os.environ["FTQ_DATABASE_URL"] = url
    os.environ["FTQ_DATA_DIR"] = str(data_dir)
    for key, value in settings.items():
        os.environ[f"FTQ_{key.upper()}"] = str(value)
    reset_caches()


def timed(fn: Any, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def tick_figures(url: str, data_dir: Path, args: argparse.Namespace, stand_in: int) -> None:
    from worker import controller

    def tick(queued: int, running: int, finished: int, repeats: int = 5) -> tuple[float, float]:
        seed(url, queued=queued, running=running, finished=finished, stand_in=stand_in, data_dir=data_dir)
        configure(url, data_dir, cpu_slots=running)  # every slot held: nothing starts, everything waits
        first = timed(controller.reconcile, 1)[0]
        steady = statistics.median(timed(controller.reconcile, repeats))
        return first, steady

    first, steady = tick(args.queued, args.running, 0)
    result("tick_first", first * 1000, "ms", queued=args.queued, running=args.running)
    result("tick", steady * 1000, "ms", queued=args.queued, running=args.running)
    sched = statistics.median(timed(controller.schedule, 5))
    result("schedule_pass", sched * 1000, "ms", queued=args.queued)
    log(f"tick first {first:.3f}s steady {steady:.3f}s schedule {sched:.3f}s")

    _, with_finished = tick(args.queued, args.running, args.queued)
    result(
        "tick_with_finished",
        with_finished * 1000,
        "ms",
        finished=args.queued,
        ratio=f"{with_finished / steady:.2f}",
    )
    note(
        f"tick with {args.queued} finished jobs in the store: {with_finished / steady:.2f}x the tick without"
    )

    per_job = {}
    for running in (args.running // 4, args.running // 2, args.running):
        _, t = tick(args.queued, running, 0)
        per_job[running] = t
        result(f"tick_running_{running}", t * 1000, "ms", per_running_job_ms=f"{t * 1000 / running:.3f}")
    lo, hi = min(per_job), max(per_job)
    growth = (per_job[hi] - per_job[lo]) / (hi - lo) * 1000
    note(
        f"tick with {lo} / {hi} running jobs: {per_job[lo] * 1000:.0f} / {per_job[hi] * 1000:.0f} ms; "
        f"{growth:.3f} ms per extra running job (time ratio {per_job[hi] / per_job[lo]:.2f} for {hi // lo}x "
        "the running jobs; the rest is the queue's share, fixed here)"
    )


def decide_figure(args: argparse.Namespace) -> None:
    from ftq.runtime.settings import Settings
    from worker import scheduling

    now = time.time()
    need = scheduling.Need("cpu_slots", 1)
    queued = [
        scheduling.RunRequest(f"q{i}", OWNERS[i % 20], need, ("low", "normal", "high")[i % 3], i, 3600, 1800)
        for i in range(args.queued)
    ]
    running = [
        scheduling.Running(f"r{i}", OWNERS[i % 20], {"cpu_slots": 1}, now - i, 3600, 1800)
        for i in range(args.running)
    ]
    settings = Settings(cpu_slots=args.running)
    times = timed(lambda: scheduling.decide(queued, running, settings, now=now), 5)
    result("decide", statistics.median(times) * 1000, "ms", queued=args.queued, running=args.running)


STUB = "#!/bin/sh\nexec sleep 120\n"


def dispatch_figures(url: str, data_dir: Path, args: argparse.Namespace, stand_in: int) -> None:
    """Free `--dispatch` slots, send that many `ftq.submit` tasks through Redis, and time N workers
    claiming and launching them."""
    stub = data_dir / "stub-python"
    redis = PrivateRedis(data_dir / "redis").start()
    rates: dict[int, float] = {}
    try:
        for workers in args.workers:
            # The last round's workers were stopped once its jobs had launched, with submit tasks still
            # queued: left there, the next round's workers launched the jobs from them before the clock
            # started (2 workers: "1,318 jobs/s").
            redis.cli("FLUSHALL")
            seed(
                url,
                queued=args.queued,
                running=args.running,
                finished=0,
                stand_in=stand_in,
                data_dir=data_dir,
            )
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("FTQ_")},
                "FTQ_DATABASE_URL": url,
                "FTQ_BROKER_URL": redis.url(),
                "FTQ_DATA_DIR": str(data_dir),
                "FTQ_CPU_SLOTS": str(args.running + args.dispatch),
                "FTQ_PYTHON": str(stub),
                "FTQ_LOG_LEVEL": "WARNING",
            }
            procs = [
                subprocess.Popen(
                    [FTQ, "worker", "--no-beat", "--concurrency", "2"],
                    env=env,
                    cwd=REPO,
                    stdout=open(data_dir / f"worker{workers}-{i}.log", "wb"),  # noqa: SIM115
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                for i in range(workers)
            ]
            try:
                time.sleep(15 if workers == 1 else 20)  # the workers' start-up (imports), not measured
                configure(url, data_dir, broker_url=redis.url())
                from ftq.runtime import queue

                ids = [f"job_{args.running + i + 1:016x}" for i in range(args.dispatch)]
                t = time.perf_counter()
                for job_id in ids:
                    queue.send(queue.TASK_SUBMIT, job_id)
                launched = _wait_launched(url, args.running + args.dispatch, timeout=600) - args.running
                elapsed = time.perf_counter() - t
            finally:
                for p in procs:
                    os.killpg(p.pid, 15)
                for p in procs:
                    p.wait(30)
                _kill_runs_under(data_dir / "runs")  # the stand-in runs the workers started
            rates[workers] = launched / elapsed
            result(f"dispatch_workers_{workers}", rates[workers], "jobs/s", launched=launched)
            log(f"{workers} worker(s): {launched} launched in {elapsed:.1f}s")
    finally:
        redis.stop()
    if len(rates) > 1:
        first, *more = rates
        note(
            f"dispatch: {' / '.join(str(w) for w in more)} workers launch "
            f"{' / '.join(f'{rates[w] / rates[first]:.2f}x' for w in more)} the jobs per second of {first} "
            "(claims are serialised by the scheduler lock; each pass ranks every queued job)"
        )


def _kill_runs_under(folder: Path) -> None:
    """SIGKILL every process whose working directory is under `folder` (the runs this bench launched)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(folder)):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), 9)


def _wait_launched(url: str, target: int, timeout: float) -> int:
    import psycopg

    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM jobs WHERE pid IS NOT NULL").fetchone()
        n = int(row[0]) if row else 0
        if n >= target:
            break
        time.sleep(0.05)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=1_000)
    ap.add_argument("--dispatch", type=int, default=200)
    ap.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2, 4],
        help="the dispatch figure's numbers of worker processes, comma-separated",
    )
    ap.add_argument("--only", choices=["tick", "decide", "dispatch"], action="append")
    args = ap.parse_args(argv)
    only = set(args.only or ["tick", "decide", "dispatch"])
    data_dir = scratch("sched-scale-")
    stub = data_dir / "stub-python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    stand_in = subprocess.Popen(["sleep", "7200"], start_new_session=True)
    try:
        if "decide" in only:
            decide_figure(args)
        with postgres.database("ftq_schedbench", migrate=True) as url:
            if "tick" in only:
                tick_figures(url, data_dir, args, stand_in.pid)
            if "dispatch" in only:
                dispatch_figures(url, data_dir, args, stand_in.pid)
    finally:
        stand_in.kill()
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
