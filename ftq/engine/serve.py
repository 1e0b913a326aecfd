"""`python -m ftq.engine.serve <folder>`: the process a deployment's launch runs (worker.deployments). It
reads the engine the worker asked for (`engine.json`) and its key (`engine.key`, owner-only), picks a free
port, writes where it will answer (`endpoint.json`, which the API reads), and becomes vLLM's server
(exec: the launcher's process group, and SLURM's job, is the server itself, so a cancel stops it).

A missing vLLM is a user-fixable failure (`ftq-error: launch_error: ...` naming the command that installs
it), as the trainer reports its own."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from ftq.contract.errors import EXIT_USER_ERROR, USER_ERROR_PREFIX
from ftq.contract.runs import ENDPOINT, write_endpoint
from ftq.engine.base import EngineConfig, EngineNotInstalled
from ftq.engine.local import LocalEngine, free_port

REQUEST = "engine.json"
KEY = "engine.key"


def advertised_host(bind: str) -> str:
    """The address other hosts reach a server bound to `bind` on: itself, or this node's name."""
    return socket.getfqdn() if bind in ("0.0.0.0", "::") else bind


def main(argv: list[str]) -> int:
    folder = Path(argv[1]).resolve()
    request = json.loads((folder / REQUEST).read_text())
    config = EngineConfig(**{**request["config"], "model": Path(request["config"]["model"])})
    bind = str(request.get("host") or "127.0.0.1")
    engine = LocalEngine(config, venv=Path(request["venv"]), host=bind)
    try:
        python = engine.python()
    except EngineNotInstalled as exc:
        print(f"{USER_ERROR_PREFIX} launch_error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    engine.port = free_port(bind)
    args = engine.arguments()
    env = engine.environment()
    env["VLLM_API_KEY"] = (folder / KEY).read_text().strip()
    (folder / ENDPOINT).unlink(missing_ok=True)
    write_endpoint(folder, f"http://{advertised_host(bind)}:{engine.port}/v1")
    print(f"ftq: engine for {config.name} on port {engine.port}", flush=True)
    os.execve(str(python), [str(python), *args], env)  # noqa: S606 (argv, no shell)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
