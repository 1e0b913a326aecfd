"""One ftq deployment as real processes: `ftq up` on its embedded defaults, or `ftq api` and `ftq worker` as
separate processes on SQLite or on PostgreSQL + Redis.

    with Deployment(tmp_path, mode="api+worker", store="postgres", broker="redis") as dep:
        job = dep.post_job(tiny_spec(tiny_assets()))
        dep.wait_terminal(job["id"])

Every process runs this checkout's `ftq` in a session of its own with a clean environment (no FTQ_ setting
of the caller's leaks in), logs to <root>/<name>.log, and is stopped by its process group. `close()` also
kills the runs the deployment launched (they live in sessions of their own), drops the PostgreSQL database
it made and stops the Redis it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx

from tests.harness import postgres
from tests.harness.api import Job, JobsApi
from tests.harness.env import FTQ, REPO, clean_env, ftq_settings
from tests.harness.procs import (
    cmdline,
    cpu_seconds,
    free_port,
    kill_runs,
    pid_alive,
    proc_children,
    run_pids,
    stop_group,
)
from tests.harness.redis import PrivateRedis

Mode = Literal["up", "api", "api+worker", "worker"]
Store = Literal["sqlite", "postgres"]
Broker = Literal["default", "redis"]

# Settings that make a deployment under test react in about a second instead of the production defaults'
# several (the reconcile and ingest sweeps, the grace a cancelled run gets before SIGKILL).
QUICK_SETTINGS: dict[str, object] = {
    "cpu_slots": 4,
    "cancel_grace_seconds": 5,
    "reconcile_interval_seconds": 1,
    "ingest_interval_seconds": 1,
}
WORKER_READY = " ready."  # what Celery logs once its consumer is up: `celery@<host> ready.`
# `ftq up` also runs the webhook sender, a Celery worker of its own (node `webhooks@<host>`) that logs
# to the same output: its readiness says nothing about the worker that launches jobs.
WEBHOOK_SENDER_NODE = "webhooks@"


def worker_ready_lines(log: str) -> int:
    """How many times the job worker (not the webhook sender) became ready in `log`."""
    return sum(1 for line in log.splitlines() if WORKER_READY in line and WEBHOOK_SENDER_NODE not in line)


class Deployment:
    """One ftq deployment under test; see the module docstring.

    root:      folder for the process logs (and the data dir, unless `data_dir` is given)
    mode:      "up" (API, worker and scheduler in one command), "api" (no worker), "api+worker" (two
               processes), "worker" (a worker alone, no HTTP)
    store:     "sqlite" (the default file in the data dir) or "postgres" (a fresh database on the
               machine's server, dropped at close; or `database_url` to use one that exists)
    broker:    "default" (the filesystem broker in the data dir) or "redis" (a private redis-server)
    tokens:    owner -> token; FTQ_API_TOKENS is made from them and `token` is the first one
    settings:  FTQ_ settings by name without the prefix ({"cpu_slots": 4}); QUICK_SETTINGS for fast sweeps
    env:       other variables for the processes (an operator's HF_TOKEN, ...)
    host:      passed as --host; None leaves the server's default
    """

    def __init__(
        self,
        root: Path,
        *,
        mode: Mode = "up",
        store: Store = "sqlite",
        broker: Broker = "default",
        database_url: str | None = None,
        tokens: Mapping[str, str] | None = None,
        settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
        data_dir: Path | None = None,
        host: str | None = "127.0.0.1",
        port: int | None = None,
        ready_timeout: float = 120,
        server_args: tuple[str, ...] = (),
    ):
        self.root = root
        self.mode: Mode = mode
        self.store: Store = store
        self.broker: Broker = broker
        self.data_dir = data_dir or root / "data"
        self.host = host
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tokens = dict(tokens or {})
        self.token: str | None = next(iter(self.tokens.values()), None)
        self.database_url = database_url
        self.redis: PrivateRedis | None = None
        self.ready_timeout = ready_timeout
        self.server_args = tuple(server_args)  # more arguments of `ftq up` / `ftq api` (`--workers 2`)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._settings = dict(settings or {})
        self._extra_env = dict(env or {})
        self._own_database = False
        self.env: dict[str, str] = {}
        self.http = httpx.Client(base_url=self.url, headers=self._auth(self.token), timeout=30)
        self.api = JobsApi(self.url, self.token, report=self.report)

    # Life cycle ------------------------------------------------------------------------------------------

    def start(self) -> Deployment:
        """Start the processes of `mode` and wait until the API answers /readyz (and the worker is ready)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.store == "postgres" and self.database_url is None:
                self.database_url = postgres.create_database("ftq_test")
                self._own_database = True
            if self.broker == "redis":
                self.redis = PrivateRedis(self.root / "redis").start()
            self.env = self._make_env()
            if self.mode == "worker":
                self.start_worker()
                return self
            self.start_server()
            if self.mode == "api+worker":
                self.start_worker()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self, *, cancel_active: bool = False) -> None:
        """Stop everything: (optionally first cancel what is active, through the API), the processes by
        their groups, the runs they launched, then drop the database and stop Redis if this made them."""
        if cancel_active and self.server_alive():
            try:
                self.api.cancel_active()
            except Exception as exc:  # the teardown goes on: the runs are killed below anyway
                print(f"harness: could not cancel the active jobs of {self.url}: {exc}")
        for name in list(self.procs):
            self.stop(name)
        kill_runs(self.data_dir)
        self.http.close()
        self.api.close()
        if self._own_database and self.database_url:
            postgres.drop_database(self.database_url)
            self._own_database = False
        if self.redis is not None:
            self.redis.close()

    def _make_env(self) -> dict[str, str]:
        env = clean_env(FTQ_ENV="test", FTQ_DATA_DIR=str(self.data_dir))
        env.update(ftq_settings(self._settings))
        if self.tokens:
            env["FTQ_API_TOKENS"] = ",".join(f"{t}:{owner}" for owner, t in self.tokens.items())
        if self.database_url:
            env["FTQ_DATABASE_URL"] = self.database_url
        if self.redis is not None:
            env["FTQ_BROKER_URL"] = self.redis.url()
        env.update(self._extra_env)
        return env

    # Processes -----------------------------------------------------------------------------------------

    @property
    def server_name(self) -> str:
        """The process that serves HTTP: "up" or "api"."""
        return "up" if self.mode == "up" else "api"

    @property
    def separate_worker(self) -> bool:
        return self.mode in ("api+worker", "worker")

    def spawn(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        """`ftq ARGV` as process `name` (log: <root>/<name>.log, appended to across restarts)."""
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen(
                [FTQ, *argv],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def start_server(self) -> None:
        """Start `ftq up` / `ftq api` (again, after a kill) on this deployment's port; wait until ready."""
        argv = [self.server_name]
        # Given FTQ_PORT (env=), the server is left to find its port there, as `FTQ_PORT=... make up` does.
        if self._extra_env.get("FTQ_PORT") != str(self.port):
            argv += ["--port", str(self.port)]
        if self.host is not None:
            argv += ["--host", self.host]
        argv += self.server_args
        self.spawn(self.server_name, *argv)
        self.wait_ready()

    def wait_ready(self, timeout: float | None = None) -> float:
        """Seconds until GET /readyz answers 200 (store and broker reachable); the server dying first, or
        the timeout, is a RuntimeError with its log."""
        timeout = self.ready_timeout if timeout is None else timeout
        t0 = time.monotonic()
        proc = self.procs.get(self.server_name)
        while time.monotonic() - t0 < timeout:
            if proc is not None and proc.poll() is not None:
                tail = self.log_tail(self.server_name)
                raise RuntimeError(f"ftq {self.server_name} exited with {proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError(f"{self.url} not ready in {timeout:.0f}s:\n{self.log_tail(self.server_name)}")

    def server_alive(self) -> bool:
        proc = self.procs.get(self.server_name)
        return proc is not None and proc.poll() is None

    def start_worker(self, *, wait: bool = True) -> None:
        """Start `ftq worker` (mode "api+worker" or "worker"); wait until Celery says it is ready."""
        before = self.worker_ready_count()
        self.spawn("worker", "worker")
        if wait:
            self.wait_worker_ready(before)

    @property
    def worker_log(self) -> Path:
        """Where the worker logs: its own file, or `ftq up`'s (which runs it)."""
        return self.log_path("worker" if self.separate_worker else "up")

    def worker_ready_count(self) -> int:
        """How many times the job worker has become ready in this deployment's logs so far."""
        try:
            return worker_ready_lines(self.worker_log.read_text(errors="replace"))
        except FileNotFoundError:
            return 0

    def wait_worker_ready(self, before: int, timeout: float = 120) -> float:
        """Seconds until a worker became ready more than `before` times."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.worker_ready_count() > before:
                return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError(f"the worker did not become ready:\n{self.log_tail('worker')}")

    def worker_pid(self) -> int | None:
        """The live worker: the `ftq worker` process, or the Celery child `ftq up` supervises."""
        if self.separate_worker:
            proc = self.procs.get("worker")
            return proc.pid if proc is not None and proc.poll() is None else None
        up = self.procs.get("up")
        if up is None or up.poll() is not None:
            return None
        for child in proc_children(up.pid):
            argv = cmdline(child)
            # The worker, not the webhook sender `ftq up` also runs (a Celery worker on its own queue).
            if any(b"celery" in part for part in argv) and b"ftq.webhooks" not in argv:
                return child
        return None

    def kill_worker(self) -> int | None:
        """SIGKILL the worker (a fault): `ftq up` starts its own again; a separate one stays down until
        `start_worker()`. Returns the pid killed, or None when no worker was alive."""
        pid = self.worker_pid()
        if pid is None:
            return None
        if self.separate_worker:
            self.kill9("worker")
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid

    def kill9(self, name: str) -> None:
        """SIGKILL process `name` alone (not its group: what it started is left to cope) and reap it."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self, name: str) -> None:
        """SIGTERM process `name`'s group; SIGKILL after 25 s."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_group(proc)

    def pid(self, name: str | None = None) -> int:
        return self.procs[name or self.server_name].pid

    def pids(self) -> dict[str, int]:
        """Live processes of the deployment by name."""
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None and pid_alive(p.pid)}

    def cpu_seconds(self, name: str | None = None) -> float:
        """CPU seconds process `name` (default: the server) has used so far."""
        return cpu_seconds(self.pid(name))

    # Files ---------------------------------------------------------------------------------------------

    def log_path(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def log(self, name: str | None = None) -> str:
        """The whole log of process `name` (default: the server)."""
        path = self.log_path(name or self.server_name)
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, name: str | None = None, lines: int = 60) -> str:
        text = self.log(name)
        return "\n".join(text.splitlines()[-lines:]) if text else f"(no {name or self.server_name}.log)"

    def run_dir(self, job_id: str) -> Path:
        return self.data_dir / "runs" / job_id

    def train_log(self, job_id: str) -> str:
        path = self.run_dir(job_id) / "train.log"
        return path.read_text(errors="replace") if path.exists() else "(no train.log)"

    def report(self, job_id: str | None = None) -> str:
        """What to read when a test fails: the run's train.log and every process log, each its tail."""
        parts = [f"--- train.log\n{self.train_log(job_id)[-3000:]}"] if job_id else []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def pgid_of(self, job_id: str) -> int:
        """The process group of a local run (its launch record)."""
        return int(json.loads((self.run_dir(job_id) / "launch.json").read_text())["pgid"])

    def deprioritize(self, job_id: str) -> None:
        """Nice 19 for a local run's processes, those alive and those they start (children inherit it): a
        run a test only needs to be running (it holds its slots until cancelled) then leaves the CPUs to
        the runs the test waits for, as it would on a box with a core to spare for it."""
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PGRP, self.pgid_of(job_id), 19)
        for pid in run_pids(job_id):
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, pid, 19)

    # HTTP ----------------------------------------------------------------------------------------------

    @staticmethod
    def _auth(token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        """A new plain HTTP client on this deployment, with `token` (default: none); close it when done."""
        return httpx.Client(base_url=self.url, headers=self._auth(token), timeout=kw.pop("timeout", 30), **kw)

    def get(self, path: str, **params: Any) -> Any:
        """GET path as the default owner; the JSON body (an error status raises)."""
        resp = self.http.get(path, params=params)
        resp.raise_for_status()
        return resp.json()

    def post_job(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        return self.api.post_job(spec, idempotency_key=idempotency_key)

    def dry_run(self, spec: Mapping[str, Any]) -> Job:
        return self.api.dry_run(spec)

    def job(self, job_id: str) -> Job:
        return self.api.job(job_id)

    def cancel(self, job_id: str) -> Job:
        return self.api.cancel(job_id)

    def wait_for(
        self, job_id: str, pred: Callable[[Job], bool], timeout: float = 240, what: str = "condition"
    ) -> Job:
        return self.api.wait_for(job_id, pred, timeout, what)

    def wait_terminal(self, job_id: str, timeout: float = 240) -> Job:
        return self.api.wait_terminal(job_id, timeout)
