"""Fixtures for the worker runtime tests: real `ftq up` / `ftq api` + `ftq worker` processes.

Everything here is self-contained: a private data dir, settings through the environment, a free
port, and for the production setup a fresh PostgreSQL database and a Redis database number of its
own. Processes are started in their own sessions and stopped by their ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

REPO = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("FTQ_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_PORT = 6379
REDIS_DB = int(os.environ.get("FTQ_TEST_RUNTIME_REDIS_DB", "5"))
TERMINAL = {"succeeded", "failed", "cancelled"}
FTQ_BIN = str(Path(sys.executable).parent / "ftq")


# Tiny model and data -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and data: `examples/tiny` when `make install` built it, else a fresh copy."""
    shipped = REPO / "examples" / "tiny"
    if (shipped / "model" / "config.json").exists() and (shipped / "data" / "train.jsonl").exists():
        return shipped
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [sys.executable, "-m", "trainer.tiny", "--out", str(out)],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    return out


def tiny_spec(
    tiny: Path, *, max_steps: int = 6, processes: int = 1, dataset: str = "train.jsonl", name: str = "tiny-rt"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "model": {"name_or_path": str(tiny / "model"), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(tiny / "data" / dataset), "text_field": "text"},
        "training": {
            "max_steps": max_steps,
            "max_seq_len": 64,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "mixed_precision": "no",
            "save_steps": None,
            "per_device_train_batch_size": 2,
        },
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": processes},
    }
    if processes > 1:
        spec["distributed"] = {"strategy": "ddp"}
    return spec


# Processes -----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_groups() -> dict[int, list[int]]:
    """pgid -> live member pids, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2 :].split()
        if rest[0] in ("Z", "X"):
            continue
        out.setdefault(int(rest[2]), []).append(int(entry))
    return out


def run_pids(job_id: str) -> list[int]:
    """Live processes of a run, wherever they are: the launcher marks them with FTQ_JOB_ID."""
    groups = proc_groups()
    live = {p for members in groups.values() for p in members}
    needle = f"\0FTQ_JOB_ID={job_id}\0".encode()
    out = []
    for pid in live:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in b"\0" + env:
            out.append(pid)
    return out


def pid_alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


class Stack:
    """One ftq deployment under test: its settings, its processes, and an HTTP client."""

    def __init__(self, data_dir: Path, env: dict[str, str], port: int):
        self.data_dir = data_dir
        self.env = env
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # processes
    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / f"{name}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        proc = subprocess.Popen(
            [FTQ_BIN, *argv],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def kill9(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with _suppress():
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=25)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.http.get("/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{self.url} not ready; logs in {self.data_dir}")

    def start_worker(self) -> None:
        log = self.data_dir / "worker.log"
        mark = log.stat().st_size if log.exists() else 0
        self.start("worker", ["worker"])
        deadline = time.time() + 90
        while time.time() < deadline:
            if log.exists() and " ready." in log.read_bytes()[mark:].decode(errors="replace"):
                return
            time.sleep(0.2)
        raise AssertionError("the worker never became ready")

    def wait_gone(self, pids: list[int], timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.2)
        assert not any(pid_alive(p) for p in pids), f"still alive: {pids}"

    def shutdown(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        # Training runs live in their own sessions: stop any left by a failed test (ids from the run dirs).
        for record in (self.data_dir / "runs").glob("*/launch.json"):
            try:
                pgid = int(json.loads(record.read_text())["pgid"])
            except (ValueError, KeyError, OSError):
                continue
            if pgid in proc_groups():
                with _suppress():
                    os.killpg(pgid, signal.SIGKILL)
        self.http.close()

    # API helpers
    def post_job(self, spec: dict[str, Any], **headers: str) -> dict[str, Any]:
        r = self.http.post("/jobs", json=spec, headers=headers)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def job(self, job_id: str) -> dict[str, Any]:
        # 503 is the contract's answer while the store restarts (other suites restart PostgreSQL).
        deadline = time.time() + 60
        while True:
            r = self.http.get(f"/jobs/{job_id}")
            if r.status_code != 503 or time.time() > deadline:
                break
            time.sleep(1)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_for(
        self, job_id: str, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str = "condition"
    ) -> dict[str, Any]:
        deadline = time.time() + timeout
        job: dict[str, Any] = {}
        while time.time() < deadline:
            try:
                job = self.job(job_id)
            except httpx.HTTPError:
                time.sleep(0.5)
                continue
            if pred(job):
                return job
            if job["status"] in TERMINAL:
                break
            time.sleep(0.25)
        raise AssertionError(f"{what} not reached for {job_id}: {job}\n{self.log_tail(job_id)}")

    def wait_terminal(self, job_id: str, timeout: float = 240) -> dict[str, Any]:
        return self.wait_for(job_id, lambda j: j["status"] in TERMINAL, timeout, "terminal status")

    def run_dir(self, job_id: str) -> Path:
        return self.data_dir / "runs" / job_id

    def log_tail(self, job_id: str) -> str:
        path = self.run_dir(job_id) / "train.log"
        text = path.read_text(errors="replace")[-3000:] if path.exists() else "(no train.log)"
        logs = []
        for p in self.data_dir.glob("*.log"):
            logs.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:])
        return f"--- train.log\n{text}\n" + "\n".join(logs)

    def pgid_of(self, job_id: str) -> int:
        return int(json.loads((self.run_dir(job_id) / "launch.json").read_text())["pgid"])


def _suppress() -> contextlib.suppress:
    return contextlib.suppress(ProcessLookupError, PermissionError)


def base_env(data_dir: Path, tiny: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    env.update(
        {
            "FTQ_ENV": "test",
            "FTQ_DATA_DIR": str(data_dir),
            "FTQ_LOCAL_ROOTS": f"{tiny}:{data_dir}",
            "FTQ_PORT": str(port),
            "FTQ_CPU_SLOTS": "4",
            "FTQ_CANCEL_GRACE_SECONDS": "5",
            "FTQ_RECONCILE_INTERVAL_SECONDS": "1",
            "FTQ_INGEST_INTERVAL_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


# Deployments ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`ftq up` on its defaults: SQLite file, filesystem broker, local launcher."""
    data = tmp_path_factory.mktemp("ftq-up")
    port = free_port()
    stack = Stack(data, base_env(data, tiny_dir, port), port)
    stack.start("up", ["up", "--port", str(port)])
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.shutdown()


def redis_cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = ["redis-cli", "-p", str(REDIS_PORT), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10)


def redis_up() -> bool:
    try:
        return redis_cli("ping").stdout.strip() == "PONG"
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_redis() -> None:
    if redis_up():
        return
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            str(REDIS_PORT),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ],
        check=True,
        timeout=20,
    )
    deadline = time.time() + 20
    while time.time() < deadline and not redis_up():
        time.sleep(0.2)
    assert redis_up(), "redis did not come back"


@pytest.fixture(scope="module")
def production(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`ftq api` + `ftq worker` as separate processes on PostgreSQL and Redis."""
    start_redis()
    name = f"ftq_test_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    redis_cli("-n", str(REDIS_DB), "flushdb")
    data = tmp_path_factory.mktemp("ftq-prod")
    port = free_port()
    env = base_env(data, tiny_dir, port)
    env["FTQ_DATABASE_URL"] = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    env["FTQ_BROKER_URL"] = f"redis://127.0.0.1:{REDIS_PORT}/{REDIS_DB}"
    stack = Stack(data, env, port)
    try:
        stack.start("api", ["api", "--port", str(port)])
        stack.wait_ready()
        stack.start_worker()
        yield stack
    finally:
        stack.shutdown()
        start_redis()
        redis_cli("-n", str(REDIS_DB), "flushdb")
        drop_database(name)


def drop_database(name: str) -> None:
    for attempt in range(10):
        try:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.OperationalError:
            if attempt == 9:
                raise
            time.sleep(2)
