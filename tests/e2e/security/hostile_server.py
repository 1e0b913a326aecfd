"""A real `ftq api` for the hostile-request tests: a subprocess on a free loopback port, private data dir.

Kept apart from the security conftest (which is moving) so these tests need nothing but this module.
The server runs this checkout's code (PYTHONPATH is the repository root).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]

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


def make_assets(data: Path) -> None:
    """A tiny model config (with a weights file preflight looks for) and a dataset, in the data dir."""
    model = data / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    (model / "model.safetensors").write_bytes(b"")
    (data / "data").mkdir(parents=True, exist_ok=True)
    (data / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"hi {i}"}) + "\n" for i in range(8))
    )


def spec(**model: object) -> dict[str, object]:
    """A valid CPU spec on the assets above (relative paths resolve under the data dir)."""
    return {
        "name": "hostile",
        "model": {"name_or_path": "./model", **model},
        "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
        "training": {"max_steps": 2, "max_seq_len": 32, "logging_steps": 1, "mixed_precision": "no"},
        "resources": {"device": "cpu", "processes_per_node": 1},
    }


@dataclass
class Live:
    url: str
    port: int
    data_dir: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextmanager
def live_api(workdir: Path, **settings: str) -> Iterator[Live]:
    """`ftq api` with the given FTQ_ settings (keys without the prefix), stopped on exit."""
    data = workdir / "data"
    make_assets(data)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    env.update(
        {
            "FTQ_ENV": "test",
            "FTQ_DATA_DIR": str(data),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO),
            **{f"FTQ_{k.upper()}": v for k, v in settings.items()},
        }
    )
    log_path = workdir / f"ftq-api-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from ftq.cli import app; app()", "api", "--host", "127.0.0.1",
             "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    live = Live(url=f"http://127.0.0.1:{port}", port=port, data_dir=data, log_path=log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ftq api exited with {proc.returncode}:\n{live.log()}")
            try:
                if httpx.get(f"{live.url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"ftq api did not answer within 60 s:\n{live.log()}")
            time.sleep(0.1)
        yield live
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
