"""Server-side commands: `ftq up` (everything, embedded defaults), `ftq api`, `ftq worker`, `ftq migrate`."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Annotated, Any

import typer

from ftq.runtime import logs
from ftq.runtime.settings import get_settings

server_app = typer.Typer(add_completion=False)

HostOpt = Annotated[str | None, typer.Option("--host", help="Address to listen on (FTQ_HOST).")]
PortOpt = Annotated[int | None, typer.Option("--port", help="Port to listen on (FTQ_PORT).")]
LogLevelOpt = Annotated[
    str | None,
    typer.Option(
        "--log-level",
        help="DEBUG, INFO, WARNING or ERROR (FTQ_LOG_LEVEL). INFO shows what happens to jobs; DEBUG adds "
        "Celery's task lines (every periodic sweep's: reconcile, ingest, relay; and each job's).",
    ),
]
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(given: str | None) -> str:
    level = (given or get_settings().log_level).upper()
    if level not in _LEVELS:
        typer.echo(f"ftq: --log-level {given!r} is not one of {', '.join(_LEVELS)}", err=True)
        raise typer.Exit(2)
    return level


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_listen(host: str) -> None:
    settings = get_settings()
    if not settings.auth_enabled and not _is_loopback(host):
        typer.echo(
            f"ftq: refusing to listen on {host} with auth off; set FTQ_API_TOKENS or use 127.0.0.1", err=True
        )
        raise typer.Exit(2)


def _owner_only() -> None:
    """What the service's processes create is their user's alone: the store, the broker's messages,
    locks, run files (the worker it starts, `ftq worker`'s Celery and the runs inherit the umask; a run
    user's runs get theirs from the local launcher)."""
    os.umask(0o077)


def _migrate() -> None:
    from ftq.store.db import ensure_data_dir
    from ftq.store.locks import named_lock
    from ftq.store.migrate import upgrade

    _owner_only()
    settings = get_settings()
    ensure_data_dir(settings)
    # One migration at a time: `ftq api` and several `ftq worker`s may start together on a fresh store.
    with named_lock("migrate", blocking=True):
        upgrade(settings.sqlalchemy_url)


def _prepare_to_listen(host: str | None, port: int | None, log_level: str | None) -> tuple[str, int, str]:
    """What `ftq api` and `ftq up` do before serving: the address and level (the options, else the
    settings), the refusal to listen beyond loopback with auth off, the schema at head."""
    settings = get_settings()
    host = host or settings.host
    level = _log_level(log_level)
    _check_listen(host)
    _migrate()
    return host, port or settings.port, level


def _die_with_parent() -> None:
    # A worker started by `ftq up` must not outlive it (a SIGKILLed `ftq up` would leave it behind and
    # a restart would start a second one). Training runs are in their own sessions and do survive.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def worker_argv(
    *,
    beat: bool,
    concurrency: int,
    log_level: str | None = None,
    queues: tuple[str, ...] | None = None,
    node: str | None = None,
) -> list[str]:
    from ftq.runtime.queue import ALL_QUEUES

    level = log_level or get_settings().log_level
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.celery_app:celery_app",
        # The start-up banner (config, queues, the task list) is 20 lines; DEBUG keeps it.
        *([] if level == "DEBUG" else ["--quiet"]),
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        level,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--queues",
        ",".join(queues or ALL_QUEUES),
        *(["--hostname", node] if node else []),
    ]
    if beat:
        # The periodic schedule lives in memory: its intervals are seconds, so there is nothing worth
        # keeping across restarts, and no shelve file for two workers (or a SIGKILL) to corrupt. Celery's
        # in-memory scheduler, less its busy wait before each run (worker/beat.py).
        argv += ["--beat", "--scheduler", "worker.beat:Scheduler"]
    return argv


class WorkerSupervisor:
    """Runs the worker of `ftq up` and starts it again if it dies, until `stop()`."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-supervisor", daemon=True)

    def start(self) -> subprocess.Popen[bytes]:
        proc = self.proc = self._spawn()
        self._thread.start()
        return proc

    def _spawn(self) -> subprocess.Popen[bytes]:
        # A process group of its own: the terminal's Ctrl-C (SIGINT to the foreground group) reaches
        # `ftq up` alone, which then stops the worker once (SIGTERM, Celery's warm shutdown), instead of
        # the worker ending by itself first and being taken for a crash to restart.
        return subprocess.Popen(self.argv, preexec_fn=_die_with_parent, process_group=0)

    def _run(self) -> None:
        while not self._stopping.is_set():
            proc = self.proc
            if proc is None:
                raise RuntimeError("WorkerSupervisor: the watch thread runs only after start()")
            code = proc.wait()
            if self._stopping.is_set():
                return
            typer.echo(f"ftq: worker exited with {code}; starting it again", err=True)
            # Runs are unaffected (their own sessions); the new worker re-adopts them.
            time.sleep(1.0)
            if not self._stopping.is_set():
                self.proc = self._spawn()

    def stop(self) -> None:
        stop_all(self)

    def _terminate(self) -> subprocess.Popen[bytes] | None:
        self._stopping.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None
        proc.terminate()
        return proc


def stop_all(*supervisors: WorkerSupervisor, timeout: float = 20) -> None:
    """Stop the supervisors' workers together: each is told first (none is restarted from then on) and
    sent SIGTERM (Celery's warm shutdown), then all are waited for, and SIGKILLed after `timeout` s."""
    procs = [p for p in (s._terminate() for s in supervisors) if p is not None]
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve(host: str, port: int, log_level: str, workers: int = 1) -> None:
    import uvicorn

    from ftq.runtime.http_protocol import bounded_http_protocol

    settings = get_settings()
    # uvicorn's own records go through the same root handler as the app's (log_config=None).
    logs.configure(log_level)
    # The request head is bounded while it is read (FTQ_MAX_HEADER_BYTES, FTQ_MAX_HEADER_COUNT).
    protocol: Any = bounded_http_protocol(settings.max_header_bytes, settings.max_header_count)
    if workers > 1:
        # Worker processes get the protocol by import string (a class cannot be pickled to them); each
        # builds the same one from the same FTQ_ settings.
        protocol = "ftq.runtime.http_protocol:FromSettings"
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=host,
        port=port,
        log_config=None,
        log_level=log_level.lower(),
        access_log=False,
        http=protocol or "h11",
        h11_max_incomplete_event_size=settings.max_header_bytes,
        workers=workers,
    )


@server_app.command("migrate")
def migrate() -> None:
    """Bring the store's schema to the latest migration."""
    _migrate()
    typer.echo("ftq: schema is at head")


@server_app.command("api")
def api(
    host: HostOpt = None,
    port: PortOpt = None,
    log_level: LogLevelOpt = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            help="API processes sharing the port (uvicorn workers); each has its own store pool.",
        ),
    ] = 1,
) -> None:
    """Serve the HTTP API (and the dashboard)."""
    _serve(*_prepare_to_listen(host, port, log_level), workers)


@server_app.command("worker")
def worker(
    beat: Annotated[
        bool,
        typer.Option(
            "--beat/--no-beat",
            help="Also run the periodic scheduler (reconcile, ingest, relay). One worker with it is enough; "
            "a second does no harm.",
        ),
    ] = True,
    concurrency: Annotated[int, typer.Option(help="Tasks run at once.")] = 4,
    log_level: LogLevelOpt = None,
    queues: Annotated[
        str,
        typer.Option(
            "--queues",
            help="Comma-separated queues to consume: `celery` (submit, cancel, reconcile, ingest, relay, "
            "exports, validation) and `ftq.webhooks` (the webhook sender). Both by default; a deployment "
            "runs one worker for each so that slow webhook receivers never delay the others.",
        ),
    ] = "celery,ftq.webhooks",
) -> None:
    """Run a Celery worker (submit, cancel, reconcile, ingest, relay, webhooks)."""
    from ftq.runtime.queue import ALL_QUEUES

    level = _log_level(log_level)
    chosen = tuple(q.strip() for q in queues.split(",") if q.strip())
    unknown = [q for q in chosen if q not in ALL_QUEUES]
    if not chosen or unknown:
        typer.echo(f"ftq: --queues takes some of {', '.join(ALL_QUEUES)}; got {queues!r}", err=True)
        raise typer.Exit(2)
    _migrate()
    argv = worker_argv(beat=beat, concurrency=concurrency, log_level=level, queues=chosen)
    os.execv(sys.executable, argv)  # noqa: S606 (an argv list, no shell)


@server_app.command("up")
def up(host: HostOpt = None, port: PortOpt = None, log_level: LogLevelOpt = None) -> None:
    """API + worker + scheduler with the embedded defaults: one command on a bare machine."""
    host, port, level = _prepare_to_listen(host, port, log_level)
    from ftq.runtime.queue import DEFAULT_QUEUE, WEBHOOK_QUEUE

    supervisor = WorkerSupervisor(
        worker_argv(beat=True, concurrency=4, log_level=level, queues=(DEFAULT_QUEUE,))
    )
    # The webhook sender in a process of its own: receivers, however slow, never hold the other tasks.
    sender = WorkerSupervisor(
        worker_argv(beat=False, concurrency=2, log_level=level, queues=(WEBHOOK_QUEUE,), node="webhooks@%h")
    )
    worker_proc = supervisor.start()
    sender_proc = sender.start()
    typer.echo(
        f"ftq: API on http://{host}:{port}  data in {get_settings().data_path}  worker pid {worker_proc.pid}"
        f"  webhook sender pid {sender_proc.pid}"
    )
    # uvicorn handles SIGINT and SIGTERM while it serves, then raises the signal again with the handler it
    # found: this one, so Ctrl-C (or a SIGTERM) is a clean stop with exit 0, not a KeyboardInterrupt.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    try:
        _serve(host, port, level)
    finally:
        # Ignored from here: a second Ctrl-C must not cut the workers' stop short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_all(sender, supervisor)
        typer.echo("ftq: stopped", err=True)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)
