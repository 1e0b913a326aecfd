"""A real `ftq up` server and one finished tiny job, shared by tests/cli and tests/ui.

Both conftests import this module, so its module-level registry makes one server and one tiny run per
test session whichever folder asks first. The server is a subprocess with its own data dir and port;
nothing here is mocked. Teardown cancels what is still active (training runs live in their own
sessions and would otherwise outlive the server), then stops the server's process group.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FTQ = str(Path(sys.executable).parent / "ftq")
# FTQ_TEST_TINY_SPEC: another tiny spec while developing; the suite uses the shipped example.
TINY_SPEC = Path(os.environ.get("FTQ_TEST_TINY_SPEC") or REPO / "examples" / "tiny-cpu.yaml")
CURL_SH = REPO / "examples" / "curl.sh"
ARTIFACTS = REPO / "tests" / "_artifacts"
TERMINAL = ("succeeded", "failed", "cancelled")
AUTH_TOKEN = "e2e-secret-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without FTQ_ settings, so a developer's shell cannot leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    # Wide, colourless output: rich tables and lines are then easy to assert on.
    env.update({"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


@dataclass
class Server:
    url: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def get(self, path: str, **params: Any) -> Any:
        with self.client() as c:
            resp = c.get(path, params=params)
            resp.raise_for_status()
            return resp.json()

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def wait_for_job(
        self, job_id: str, until: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.get(f"/jobs/{job_id}")
            if until(job):
                return job
            time.sleep(0.5)
        raise AssertionError(f"{job_id} stuck in {job.get('status')}; server log:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self._cancel_active()
            except Exception as exc:
                print(f"e2e: could not cancel active jobs: {exc}", file=sys.stderr)
        _stop_group(self.proc)

    def _cancel_active(self) -> None:
        with self.client() as c:
            active = c.get("/jobs", params={"status": "queued,starting,running,cancelling", "limit": 500})
            ids = [j["id"] for j in active.json()["data"]]
            for job_id in ids:
                c.post(f"/jobs/{job_id}/cancel")
            deadline = time.monotonic() + 30
            while ids and time.monotonic() < deadline:
                ids = [i for i in ids if c.get(f"/jobs/{i}").json()["status"] not in TERMINAL]
                time.sleep(0.5)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def start_server(root: Path, *, command: str = "up", tokens: str | None = None) -> Server:
    """`ftq up` (API + worker + scheduler) or `ftq api`, on a free loopback port, ready on /healthz."""
    if not (REPO / "examples" / "tiny" / "model" / "config.json").exists():
        raise RuntimeError("examples/tiny is missing: run `make install` (it runs python -m trainer.tiny)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    data = root / "data"
    log_path = root / f"ftq-{command}.log"
    extra = {"FTQ_DATA_DIR": str(data)}
    if tokens:
        extra["FTQ_API_TOKENS"] = tokens
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [FTQ, command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=clean_env(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(
        url=f"http://127.0.0.1:{port}",
        data_dir=data,
        log_path=log_path,
        proc=proc,
        token=AUTH_TOKEN if tokens else None,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ftq {command} exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    _stop_group(proc)
    raise RuntimeError(f"ftq {command} did not answer /healthz in 120 s:\n{server.log_tail()}")


@dataclass
class CliResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_ftq(
    *args: str, url: str | None, token: str | None = None, timeout: float = 120, cwd: Path = REPO
) -> CliResult:
    """Run the real `ftq` command as a user would, against `url`."""
    extra: dict[str, str] = {}
    if url:
        extra["FTQ_URL"] = url
    if token:
        extra["FTQ_TOKEN"] = token
    start = time.monotonic()
    proc = subprocess.run(
        [FTQ, *args],
        cwd=cwd,
        env=clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(list(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def tiny_spec(**training: Any) -> dict[str, Any]:
    """examples/tiny-cpu.yaml as a dict, with training fields overridden."""
    spec: dict[str, Any] = yaml.safe_load(TINY_SPEC.read_text())
    spec.setdefault("training", {}).update(training)
    return spec


@dataclass
class FinishedJob:
    """`ftq submit examples/tiny-cpu.yaml --follow`, run once per session."""

    result: CliResult
    job_id: str


@dataclass
class _Registry:
    server: Server | None = None
    auth_server: Server | None = None
    finished: FinishedJob | None = None
    curl: subprocess.Popen[str] | None = None
    curl_log: Path | None = None
    root: Path | None = None


REGISTRY = _Registry()


def _root(make_root: Callable[[], Path]) -> Path:
    if REGISTRY.root is None:
        REGISTRY.root = make_root()
    return REGISTRY.root


Finalizer = Callable[[Callable[[], None]], None]


def shared_server(make_root: Callable[[], Path], add_finalizer: Finalizer) -> Server:
    if REGISTRY.server is None:
        REGISTRY.server = start_server(_root(make_root) / "main")
        add_finalizer(_teardown)
    return REGISTRY.server


def shared_auth_server(make_root: Callable[[], Path], add_finalizer: Finalizer) -> Server:
    """`ftq api` (no worker) with FTQ_API_TOKENS set: for the 401 and token paths."""
    if REGISTRY.auth_server is None:
        root = _root(make_root) / "auth"
        REGISTRY.auth_server = start_server(root, command="api", tokens=f"{AUTH_TOKEN}:erin")
        add_finalizer(REGISTRY.auth_server.stop)
    return REGISTRY.auth_server


def finished_tiny_job(server: Server) -> FinishedJob:
    """The session's tiny job, followed to its end by the CLI.

    examples/curl.sh is started in the background just before, so its own tiny run overlaps this one
    instead of adding a second minute to the session (see `curl_walkthrough`).
    """
    if REGISTRY.finished is None:
        start_curl_walkthrough(server)
        result = run_ftq("submit", str(TINY_SPEC), "--follow", url=server.url, timeout=600)
        match = re.search(r"submitted (job_[0-9a-f]+)", result.stdout)
        assert match, f"no job id in the output of ftq submit:\n{result.stdout}\n{result.stderr}"
        REGISTRY.finished = FinishedJob(result=result, job_id=match.group(1))
    return REGISTRY.finished


def start_curl_walkthrough(server: Server) -> None:
    if REGISTRY.curl is not None:
        return
    assert REGISTRY.root is not None
    REGISTRY.curl_log = REGISTRY.root / "curl-walkthrough.log"
    with REGISTRY.curl_log.open("w") as log:
        REGISTRY.curl = subprocess.Popen(
            ["bash", str(CURL_SH)],
            cwd=REPO,
            env=clean_env(FTQ_URL=server.url),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )


def curl_walkthrough(server: Server, timeout: float = 600) -> tuple[int, str]:
    """Exit status and output of examples/curl.sh run against the shared server."""
    start_curl_walkthrough(server)
    assert REGISTRY.curl is not None and REGISTRY.curl_log is not None
    try:
        code = REGISTRY.curl.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(REGISTRY.curl.pid, signal.SIGKILL)
        code = -9
    return code, REGISTRY.curl_log.read_text(errors="replace")


def _teardown() -> None:
    if REGISTRY.curl is not None and REGISTRY.curl.poll() is None:
        os.killpg(REGISTRY.curl.pid, signal.SIGKILL)
        REGISTRY.curl.wait(timeout=10)
    if REGISTRY.server is not None:
        REGISTRY.server.stop()


# The session fixtures of the folders that use this server (tests/cli, tests/ui, tests/perf): their
# conftests import these names, so each folder gets the same fixtures without a copy of them.


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Server:
    return shared_server(lambda: tmp_path_factory.mktemp("e2e"), request.addfinalizer)


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Server:
    return shared_auth_server(lambda: tmp_path_factory.mktemp("e2e"), request.addfinalizer)


@pytest.fixture(scope="session")
def finished_job(server: Server) -> FinishedJob:
    return finished_tiny_job(server)
