"""Security tests: a real `ftq api` (or `ftq up`) process per module, local assets under a private root."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
FTQ = str(Path(sys.executable).with_name("ftq"))

# A config.json the memory estimate can read and a weights file that preflight looks for (nothing here
# loads the model, so its content does not matter).
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (path / "model.safetensors").write_bytes(b"")
    return path


def make_dataset_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": f"hello {i}"}) + "\n" for i in range(8)))
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local root holding a tiny model config and a dataset (what FTQ_LOCAL_ROOTS points at)."""
    root = tmp_path_factory.mktemp("assets").resolve()
    make_model_dir(root / "model")
    make_dataset_file(root / "data" / "train.jsonl")
    return root


def base_spec(**resources: Any) -> dict[str, Any]:
    """A valid CPU spec on the assets' model and data (relative paths resolve under the roots)."""
    return {
        "name": "sec",
        "model": {"name_or_path": "./model"},
        "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
        "training": {"max_steps": 2, "max_seq_len": 32, "logging_steps": 1, "mixed_precision": "no"},
        "resources": {"device": "cpu", "processes_per_node": 1, **resources},
    }


def clean_env(**settings: str) -> dict[str, str]:
    """The caller's environment minus every FTQ_ setting, plus the given ones (key: FTQ_ name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    env.update({"FTQ_ENV": "test", "PYTHONUNBUFFERED": "1"})
    env.update(settings)
    return env


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kw.pop("timeout", 30.0), **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            # The server runs in its own session: stop it and anything it started (the worker of `ftq up`).
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start_server(
    workdir: Path,
    *,
    command: str = "api",
    settings: dict[str, str] | None = None,
    timeout: float = 60.0,
    data_name: str = "data",
) -> Server:
    """Start `ftq <command>` on a free loopback port with a private data dir; wait until it answers."""
    data = workdir / data_name
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = clean_env(FTQ_DATA_DIR=str(data), **(settings or {}))
    log_path = workdir / f"ftq-{command}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [FTQ, command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(url=f"http://127.0.0.1:{port}", proc=proc, data_dir=data, log_path=log_path, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ftq {command} exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"ftq {command} did not answer within {timeout}s:\n{server.log()}")


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start servers for this module; all are stopped at its end."""
    started: list[Server] = []

    def make(command: str = "api", *, data_name: str = "data", **settings: str) -> Server:
        workdir = tmp_path_factory.mktemp(f"ftq-{command}")
        env = {f"FTQ_{k.upper()}": v for k, v in settings.items()}
        server = start_server(workdir, command=command, settings=env, data_name=data_name)
        started.append(server)
        return server

    yield make
    for s in started:
        s.stop()


# Shared servers ----------------------------------------------------------------------------------------
# Server start-ups dominate this folder's time on a small machine, so most tests share one `ftq api`
# (and the slow real-launch tests one `ftq up`), each test with owners of its own.

TOKENS = {
    "alice": "alice-secret-token-0001",
    "bob": "bob-secret-token-0002",
    "mallory": "mallory-token-0003",
    "sec": "sec-token-0004",
}
# Fixed values: test modules import them, and must see the ones the servers were given.
HF_TOKEN = "hf_9f3c2a7be1d04c5e8a6b9d2f1c3e5a7b"
WANDB_KEY = "wandb-4e8d1c7a2b9f6e3d5c0a8b1f"
# The operator's secrets, in the environment of the shared servers (FTQ_PASS_ENV names them).
OPERATOR_ENV = {"HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_KEY}

# Stands in for the interpreter that runs `accelerate launch` (FTQ_PYTHON):
# - with STUB_OUT set (a test running a rendered script itself): record argv there, start nothing;
# - for a job named `leaky`: prove the secret arrived (its hash, in the run dir), print it the way a
#   careless library would, and fail with the trainer's `ftq-error:` line quoting it;
# - otherwise: the real interpreter, so `ftq up` runs the real accelerate and trainer.
STUB_PYTHON = """#!{python}
import hashlib, json, os, sys
argv = sys.argv[1:]
out = os.environ.get("STUB_OUT")
if out:
    with open(out, "a") as f:
        f.write(json.dumps(argv) + "\\n")
    sys.exit(0)
spec = argv[argv.index("--spec") + 1] if "--spec" in argv else ""
name = json.load(open(spec)).get("name") if os.path.isfile(spec) else None
if name == "leaky":
    value = os.environ.get("HF_TOKEN", "")
    with open("received.sha256", "w") as f:
        f.write(hashlib.sha256(value.encode()).hexdigest())
    print("requests: GET https://huggingface.co/api/models?token=" + value, flush=True)
    print("ftq-error: model_error: the hub refused token " + value + " for this model", flush=True)
    sys.exit(1)
os.execv({python!r}, [{python!r}, *argv])
"""
STUB_SRUN = """#!/bin/bash
# srun: drop its own options, then run the step command on "this node".
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
export SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0
exec "$@"
"""
STUB_SCONTROL = """#!/bin/bash
echo node-a
"""


@pytest.fixture(scope="session")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stubs")
    for name, text in (
        ("python", STUB_PYTHON.format(python=sys.executable)),
        ("srun", STUB_SRUN),
        ("scontrol", STUB_SCONTROL),
    ):
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    return d


def _tokens() -> str:
    return ",".join(f"{t}:{o}" for o, t in TOKENS.items())


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory, stubs: Path) -> Iterator[Server]:
    """One `ftq api` on the default roots (its data dir and examples/), holding the tiny model and data
    the operator put there, with a data dir whose path needs quoting (a space and a quote)."""
    workdir = tmp_path_factory.mktemp("shared")
    data = workdir / "data dir's"
    make_model_dir(data / "model")
    make_dataset_file(data / "data" / "train.jsonl")
    server = start_server(
        workdir,
        data_name=data.name,
        settings={
            **OPERATOR_ENV,
            "FTQ_API_TOKENS": _tokens(),
            "FTQ_PASS_ENV": "HF_TOKEN,WANDB_API_KEY",
            "FTQ_PYTHON": str(stubs / "python"),
            "FTQ_POST_RATE_PER_MINUTE": "100000",
            "FTQ_MAX_ACTIVE_JOBS_PER_OWNER": "100000",
        },
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def shared_up(tmp_path_factory: pytest.TempPathFactory, stubs: Path, shared: Server) -> Iterator[Server]:
    """One `ftq up` (API, worker, scheduler) that really launches; it reads the shared server's files."""
    workdir = tmp_path_factory.mktemp("shared-up")
    server = start_server(
        workdir,
        command="up",
        data_name="up data's dir",
        settings={
            **OPERATOR_ENV,
            "FTQ_API_TOKENS": _tokens(),
            "FTQ_PASS_ENV": "HF_TOKEN",
            "FTQ_PYTHON": str(stubs / "python"),
            "FTQ_LOCAL_ROOTS": str(shared.data_dir),
            "FTQ_CPU_SLOTS": "4",
        },
    )
    yield server
    server.stop()


LIMITS = {"max_body_bytes": 4096, "max_active": 3, "rate": 6, "ttl_hours": 0.001}
LIMIT_TOKENS = {o: f"lim-{o}" for o in ("big", "cap", "rate", "other", "ttl")}


@pytest.fixture(scope="session")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An `ftq api` with small limits: body size, active jobs and submissions per owner, key lifetime."""
    workdir = tmp_path_factory.mktemp("limited")
    data = workdir / "data"
    make_model_dir(data / "model")
    make_dataset_file(data / "data" / "train.jsonl")
    server = start_server(
        workdir,
        settings={
            "FTQ_API_TOKENS": ",".join(f"{t}:{o}" for o, t in LIMIT_TOKENS.items()),
            "FTQ_MAX_BODY_BYTES": str(LIMITS["max_body_bytes"]),
            "FTQ_MAX_ACTIVE_JOBS_PER_OWNER": str(LIMITS["max_active"]),
            "FTQ_POST_RATE_PER_MINUTE": str(LIMITS["rate"]),
            "FTQ_IDEMPOTENCY_TTL_HOURS": str(LIMITS["ttl_hours"]),
        },
    )
    yield server
    server.stop()
