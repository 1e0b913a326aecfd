"""Server-side commands: `ftq up` (everything, embedded defaults), `ftq api`, `ftq worker`, `ftq migrate`."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import signal
import subprocess
import sys
from typing import Annotated

import typer

from ftq.settings import get_settings

server_app = typer.Typer(add_completion=False)

HostOpt = Annotated[str | None, typer.Option("--host", help="Address to listen on (FTQ_HOST).")]
PortOpt = Annotated[int | None, typer.Option("--port", help="Port to listen on (FTQ_PORT).")]


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


def _migrate() -> None:
    from service.migrate import upgrade

    settings = get_settings()
    settings.data_path.mkdir(parents=True, exist_ok=True)
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.sqlalchemy_url)


def _die_with_parent() -> None:
    # A worker started by `ftq up` must not outlive it (a SIGKILLed `ftq up` would leave it behind and
    # a restart would start a second one). Training runs are in their own sessions and do survive.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def worker_argv(*, beat: bool, concurrency: int) -> list[str]:
    settings = get_settings()
    argv = [
        sys.executable, "-m", "celery", "-A", "worker.celery_app:celery_app", "worker",
        "--pool", "threads", "--concurrency", str(concurrency), "--loglevel", "INFO",
        "--without-gossip", "--without-mingle",
    ]
    if beat:
        argv += ["--beat", "--schedule", str(settings.data_path / "celerybeat-schedule")]
    return argv


@server_app.command("migrate")
def migrate() -> None:
    """Bring the store's schema to the latest migration."""
    _migrate()
    typer.echo("ftq: schema is at head")


@server_app.command("api")
def api(host: HostOpt = None, port: PortOpt = None) -> None:
    """Serve the HTTP API (and the dashboard)."""
    import uvicorn

    settings = get_settings()
    host = host or settings.host
    port = port or settings.port
    _check_listen(host)
    _migrate()
    uvicorn.run("service.app:create_app", factory=True, host=host, port=port, log_level="info", access_log=False)


@server_app.command("worker")
def worker(
    beat: Annotated[bool, typer.Option("--beat/--no-beat", help="Also run the periodic scheduler.")] = True,
    concurrency: Annotated[int, typer.Option(help="Tasks run at once.")] = 4,
) -> None:
    """Run a Celery worker (submit, cancel, reconcile, ingest, relay). Run one with --beat."""
    _migrate()
    os.execv(sys.executable, worker_argv(beat=beat, concurrency=concurrency))


@server_app.command("up")
def up(host: HostOpt = None, port: PortOpt = None) -> None:
    """API + worker + scheduler with the embedded defaults: one command on a bare machine."""
    import uvicorn

    settings = get_settings()
    host = host or settings.host
    port = port or settings.port
    _check_listen(host)
    _migrate()
    worker_proc = subprocess.Popen(worker_argv(beat=True, concurrency=4), preexec_fn=_die_with_parent)
    typer.echo(f"ftq: API on http://{host}:{port}  data in {settings.data_path}  worker pid {worker_proc.pid}")
    try:
        uvicorn.run("service.app:create_app", factory=True, host=host, port=port, log_level="info", access_log=False)
    finally:
        worker_proc.terminate()
        try:
            worker_proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker_proc.kill()
