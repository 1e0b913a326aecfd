"""Benchmarks: `make bench` (python -m bench.run_all) runs them and writes bench/RESULTS.md.

What every bench shares lives here: the RESULT/NOTE line protocol (see bench/run_all.py), a throwaway
PostgreSQL database, a real `ftq api` process, bulk loading of jobs and points with COPY, and a wrk
load run that reports throughput and latency percentiles.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
PG_ADMIN_URL = os.environ.get("FTQ_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


# The line protocol ------------------------------------------------------------------------------------


def result(name: str, value: float, unit: str, **extra: Any) -> None:
    """Print one figure for run_all: `RESULT <name> <value> <unit> [key=value ...]`."""
    fields = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
    print(f"RESULT {name} {value:.6g} {unit} {fields}".rstrip(), flush=True)


def note(text: str) -> None:
    """A sentence run_all copies under the table (how a figure was measured, what was skipped)."""
    print(f"NOTE {' '.join(text.split())}", flush=True)


def log(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


# PostgreSQL -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def pg_database(prefix: str = "ftq_perfbench") -> Iterator[str]:
    """A fresh database migrated to head; dropped afterwards. Yields its postgresql:// URL."""
    import psycopg

    from ftq.store.migrate import upgrade

    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    try:
        upgrade("postgresql+psycopg://" + url.split("://", 1)[1])
        yield url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def spec_json(name: str = "bench") -> str:
    from ftq.spec import JobSpec

    spec = JobSpec.model_validate(
        {
            "name": name,
            "model": {"name_or_path": "org/model-7b"},
            "dataset": {"name_or_path": "org/chat-data", "text_field": "text"},
            "training": {"max_steps": 100_000, "logging_steps": 1},
            "resources": {"device": "cpu", "processes_per_node": 1},
        }
    )
    return spec.model_dump_json()


_JOB_COLUMNS = (
    "id",
    "name",
    "owner",
    "status",
    "spec",
    "plan",
    "launcher",
    "device",
    "created_at",
    "updated_at",
    "started_at",
    "attempt",
    "metrics_offset",
    "progress_step",
    "progress_max_steps",
    "latest_metrics",
)


def copy_jobs(
    url: str, jobs: Iterable[tuple[str, str]], *, owner: str = "local", max_steps: int = 100_000
) -> None:
    """Insert jobs given as (id, status) in one COPY; seq follows the order given (newest last)."""
    import psycopg

    spec = spec_json()
    plan = json.dumps(
        {
            "accelerate_config": {},
            "accelerate_config_yaml": "",
            "command": ["accelerate", "launch"],
            "sbatch_script": None,
            "trainer_args": {},
            "estimate": None,
        }
    )
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY jobs ({', '.join(_JOB_COLUMNS)}) FROM STDIN") as copy:
            for i, (job_id, status) in enumerate(jobs):
                at = t0 + timedelta(seconds=i)
                copy.write_row(
                    (
                        job_id,
                        "bench",
                        owner,
                        status,
                        spec,
                        plan,
                        "local",
                        "cpu",
                        at,
                        at,
                        at,
                        0,
                        0,
                        None,
                        max_steps,
                        None,
                    )
                )
        conn.commit()


def copy_points(url: str, job_ids: Iterable[str], steps: int, *, start: int = 1) -> int:
    """`steps` points (start..start+steps-1) per job, every field set. Returns rows written.

    Rows are generated inside PostgreSQL (generate_series), which loads millions in seconds where
    sending them from Python would take a minute.
    """
    import psycopg

    ids = list(job_ids)
    bulk = len(ids) * steps > 200_000
    with psycopg.connect(url) as conn:
        if bulk:
            # Building the key afterwards (one sort) and skipping the per-row foreign key check halves
            # the load; both constraints come back under the names the migration gave them.
            conn.execute("ALTER TABLE metric_points DROP CONSTRAINT metric_points_pkey")
            conn.execute("ALTER TABLE metric_points DROP CONSTRAINT metric_points_job_id_fkey")
        conn.execute(
            "INSERT INTO metric_points (job_id, step, epoch, loss, learning_rate, grad_norm, eval_loss, "
            "tokens_per_second, time) "
            "SELECT j, s, s / 1000.0, 3.0 - s * 1e-5, 0.0002, 1.25, "
            "CASE WHEN s %% 100 = 0 THEN 2.0 - s * 1e-5 END, 5120.5, 1700000000.0 + s "
            "FROM unnest(%s::text[]) AS j, generate_series(%s::int, %s::int) AS s",
            (ids, start, start + steps - 1),
        )
        if bulk:
            conn.execute(
                "ALTER TABLE metric_points ADD CONSTRAINT metric_points_pkey PRIMARY KEY (job_id, step)"
            )
            conn.execute(
                "ALTER TABLE metric_points ADD CONSTRAINT metric_points_job_id_fkey FOREIGN KEY (job_id) "
                "REFERENCES jobs (id) ON DELETE CASCADE"
            )
        conn.commit()
    return len(ids) * steps


def analyze(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def explain(url: str, sql: str, params: tuple[Any, ...] = ()) -> str:
    """The plan PostgreSQL picks for a statement (EXPLAIN, no ANALYZE)."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("EXPLAIN " + sql, params).fetchall()  # type: ignore[arg-type]
    return " | ".join(r[0].strip() for r in rows)


def job_ids(n: int, tag: str = "") -> list[str]:
    return [f"job_{tag}{i:0{16 - len(tag)}x}" for i in range(n)]


# The API process -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server(str):
    """The base URL of a server process, which also knows the process (for its CPU time)."""

    pid: int

    def __new__(cls, base: str, pid: int) -> Server:
        obj = super().__new__(cls, base)
        obj.pid = pid
        return obj

    def cpu_seconds(self) -> float:
        """User + system CPU the process (all its threads) has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def api_server(
    database_url: str,
    *,
    data_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> Iterator[Server]:
    """A real `ftq api` process on a free port; yields its base URL and stops it afterwards."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="ftq-bench-")) if data_dir is None else None
    data = data_dir or tmp
    assert data is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_")}
    env.update({"FTQ_DATABASE_URL": database_url, "FTQ_DATA_DIR": str(data), "FTQ_ENV": "test"})
    env.update(extra_env or {})
    ftq = shutil.which("ftq", path=str(Path(sys.executable).parent)) or "ftq"
    logfile = OUT / f"api-{port}.log"
    OUT.mkdir(parents=True, exist_ok=True)
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [ftq, "api", "--port", str(port), *(args or [])],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    base = Server(f"http://127.0.0.1:{port}", proc.pid)
    try:
        wait_http(base + "/healthz", proc, logfile)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def wait_http(
    url: str, proc: subprocess.Popen[bytes] | None = None, logfile: Path | None = None, timeout: float = 60.0
) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = logfile.read_text()[-2000:] if logfile else ""
            raise RuntimeError(f"server exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


# Load generation ----------------------------------------------------------------------------------------

# wrk's Lua hooks: `paths` is filled in per run; each thread picks paths at random and the summary is
# printed as one JSON line that `wrk_run` reads back.
_WRK_LUA = r"""
local paths = {%(paths)s}
local headers = {%(headers)s}
local think_ms = %(think_ms)d
function init(args)
  math.randomseed(os.time() + math.floor(os.clock() * 1000000))
end
request = function()
  local p = paths[math.random(#paths)]
  return wrk.format("GET", p, headers)
end
if think_ms > 0 then
  -- Each connection waits a random 0..2x think_ms before its next request: a dashboard's poll
  -- interval, without every client firing in step.
  delay = function()
    return math.random(0, 2 * think_ms)
  end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk_run(
    base: str,
    paths: list[str],
    *,
    connections: int,
    seconds: float,
    threads: int = 1,
    headers: dict[str, str] | None = None,
    think_ms: int = 0,
    timeout_s: float = 10.0,
) -> dict[str, float]:
    """Closed-loop load: `connections` clients each sending the next request as soon as one returns
    (or, with think_ms, after waiting a random 0..2*think_ms, like a dashboard's poll interval).

    Returns req_s, p50_ms, p90_ms, p99_ms, max_ms, errors (socket errors, timeouts and non-2xx/3xx).
    """
    OUT.mkdir(parents=True, exist_ok=True)
    script = OUT / f"wrk-{secrets.token_hex(4)}.lua"
    hdrs = ", ".join(f'["{k}"] = "{v}"' for k, v in (headers or {}).items())
    script.write_text(
        _WRK_LUA % {"paths": ", ".join(json.dumps(p) for p in paths), "headers": hdrs, "think_ms": think_ms}
    )
    try:
        proc = subprocess.run(
            [
                "wrk",
                "-t",
                str(threads),
                "-c",
                str(connections),
                "-d",
                f"{max(1, int(seconds))}s",
                "--timeout",
                f"{max(1, int(timeout_s))}s",
                "-s",
                str(script),
                base,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        script.unlink(missing_ok=True)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("WRKJSON "))
    raw = json.loads(line[len("WRKJSON ") :])
    errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
    return {
        "requests": raw["requests"],
        "req_s": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "errors": errors,
    }


def sequential_latency(
    url: str, *, n: int, headers: dict[str, str] | None = None, warm: int | None = None, timeout_s: float = 10
) -> dict[str, float]:
    """One client, one request at a time: the cost of a single request without queueing."""
    import httpx

    times: list[float] = []
    with httpx.Client(headers=headers, timeout=timeout_s) as client:
        for _ in range(max(5, n // 20) if warm is None else warm):  # warm the connection pool and caches
            client.get(url).raise_for_status()
        for _ in range(n):
            t = time.perf_counter()
            client.get(url).raise_for_status()
            times.append(time.perf_counter() - t)
    times.sort()
    return {
        "p50_ms": times[len(times) // 2] * 1000,
        "p99_ms": times[int(len(times) * 0.99)] * 1000,
        "mean_ms": sum(times) / len(times) * 1000,
    }


def measured(
    server: Server,
    paths: list[str],
    *,
    connections: int,
    seconds: float,
    think_ms: int = 0,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """wrk_run plus the server's CPU milliseconds per request over the same run."""
    before = server.cpu_seconds()
    out = wrk_run(server, paths, connections=connections, seconds=seconds, think_ms=think_ms, headers=headers)
    out["cpu_ms"] = (server.cpu_seconds() - before) * 1000 / max(1, out["requests"])
    return out


def interleaved(
    server: Server, loads: dict[str, list[str]], *, connections: int, seconds: float, rounds: int = 3
) -> dict[str, dict[str, float]]:
    """Each load in turn, `rounds` times, `seconds` in all per load: on a shared machine, a burst of
    someone else's work then hits every load alike. Latency percentiles are the worst round's."""
    total: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for name, paths in loads.items():
            r = measured(server, paths, connections=connections, seconds=seconds / rounds)
            t = total.setdefault(
                name, {"requests": 0, "seconds": 0.0, "cpu": 0.0, "errors": 0, "p50_ms": 0.0, "p99_ms": 0.0}
            )
            t["requests"] += r["requests"]
            t["seconds"] += r["requests"] / r["req_s"] if r["req_s"] else seconds / rounds
            t["cpu"] += r["cpu_ms"] * r["requests"]
            t["errors"] += r["errors"]
            t["p50_ms"] = max(t["p50_ms"], r["p50_ms"])
            t["p99_ms"] = max(t["p99_ms"], r["p99_ms"])
    for t in total.values():
        t["req_s"] = t["requests"] / t["seconds"]
        t["cpu_ms"] = t["cpu"] / max(1, t["requests"])
    return total
