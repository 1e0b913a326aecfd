"""Fixtures for the preflight and failure tests: a real `ftq up` on a private data dir.

Processes start in sessions of their own and are stopped by their ids; mounts and cgroups a test makes
are removed by that test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE_CONFIGS = REPO / "tests" / "worker" / "fixtures"
TERMINAL = {"succeeded", "failed", "cancelled"}
FTQ_BIN = str(Path(sys.executable).parent / "ftq")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and data: `examples/tiny` when `make install` built it, else a fresh copy."""
    shipped = REPO / "examples" / "tiny"
    needed = (shipped / "model" / "model.safetensors", shipped / "data" / "no_text_field.jsonl")
    if all(p.exists() for p in needed):
        return shipped
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [sys.executable, "-m", "trainer.tiny", "--out", str(out)],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    return out


def tiny_spec(tiny: Path, *, max_steps: int = 4, name: str = "tiny-pf", **training: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name_or_path": str(tiny / "model"), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(tiny / "data" / "train.jsonl"), "text_field": "text"},
        "training": {
            "max_steps": max_steps,
            "max_seq_len": 64,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "mixed_precision": "no",
            "save_steps": None,
            "per_device_train_batch_size": 2,
            **training,
        },
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": 1},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marked_pids(job_id: str) -> list[int]:
    """Live processes of a run: the local launcher marks each with FTQ_JOB_ID in its environment."""
    needle = f"\0FTQ_JOB_ID={job_id}\0".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and needle in b"\0" + env:
            out.append(int(entry))
    return out


class Stack:
    """One `ftq up` under test: its environment, its process, an HTTP client."""

    def __init__(self, data_dir: Path, env: dict[str, str], port: int):
        self.data_dir = data_dir
        self.env = env
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = port

    def start(self) -> None:
        log = open(self.data_dir / "up.log", "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [FTQ_BIN, "up", "--port", str(self.port)],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + 90
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/readyz").status_code == 200:
                    return
            assert self.proc.poll() is None, (self.data_dir / "up.log").read_text()[-3000:]
            time.sleep(0.3)
        raise AssertionError(f"ftq up not ready: {(self.data_dir / 'up.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=25)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Runs live in sessions of their own: stop any a failed test left behind, by their recorded ids.
        for record in self.data_dir.glob("runs/*/launch.json"):
            with contextlib.suppress(ValueError, KeyError, OSError, ProcessLookupError):
                os.killpg(int(json.loads(record.read_text())["pgid"]), signal.SIGKILL)
        self.http.close()

    # API
    def dry_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post("/jobs", params={"dry_run": "true"}, json=spec)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def post(self, spec: dict[str, Any]) -> httpx.Response:
        return self.http.post("/jobs", json=spec)

    def post_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        r = self.post(spec)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def run_dir(self, job_id: str) -> Path:
        return self.data_dir / "runs" / job_id

    def log_of(self, job_id: str) -> str:
        path = self.run_dir(job_id) / "train.log"
        return path.read_text(errors="replace") if path.exists() else "(no train.log)"

    def wait_for(
        self, job_id: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 240
    ) -> dict[str, Any]:
        deadline = time.time() + timeout
        job: dict[str, Any] = {}
        while time.time() < deadline:
            job = self.job(job_id)
            if pred(job) or job["status"] in TERMINAL:
                break
            time.sleep(0.3)
        assert pred(job), f"{job}\n--- train.log\n{self.log_of(job_id)[-4000:]}"
        return job

    def wait_terminal(self, job_id: str, timeout: float = 240) -> dict[str, Any]:
        return self.wait_for(job_id, lambda j: j["status"] in TERMINAL, timeout)


def stack_env(data_dir: Path, roots: list[Path], port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    env.update(
        {
            "FTQ_ENV": "test",
            "FTQ_DATA_DIR": str(data_dir),
            "FTQ_LOCAL_ROOTS": ":".join(str(r) for r in roots),
            "FTQ_CPU_SLOTS": "4",
            "FTQ_CANCEL_GRACE_SECONDS": "5",
            "FTQ_RECONCILE_INTERVAL_SECONDS": "1",
            "FTQ_INGEST_INTERVAL_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    return env


@contextlib.contextmanager
def running_stack(data_dir: Path, roots: list[Path], **extra: str) -> Iterator[Stack]:
    port = free_port()
    stack = Stack(data_dir, stack_env(data_dir, roots, port, **extra), port)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding only config.json files for the articles' models (no weights)."""
    data = tmp_path_factory.mktemp("ftq-pf")
    for name, fixture in (("llama-2-70b", "llama-2-70b-hf"), ("falcon-180B", "falcon-180B")):
        folder = data / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text((FIXTURE_CONFIGS / fixture / "config.json").read_text())
    return data


@pytest.fixture(scope="module")
def stack(models_root: Path, tiny_dir: Path) -> Iterator[Stack]:
    with running_stack(models_root, [models_root, tiny_dir]) as s:
        yield s
