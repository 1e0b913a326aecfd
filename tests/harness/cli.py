"""The `ftq` command run as a user runs it: a subprocess against a server URL, output captured."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.harness.env import FTQ, REPO, clean_env


@dataclass
class CliResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_ftq(
    *args: str,
    url: str | None,
    token: str | None = None,
    timeout: float = 120,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    ftq: str = FTQ,
) -> CliResult:
    """`ftq ARGS` with FTQ_URL (and FTQ_TOKEN, and `env`) set, in a clean environment; never raises on its
    status. `ftq`: another install's command (the client distribution's venv) instead of this checkout's."""
    extra: dict[str, str] = dict(env or {})
    if url:
        extra["FTQ_URL"] = url
    if token:
        extra["FTQ_TOKEN"] = token
    start = time.monotonic()
    proc = subprocess.run(
        [ftq, *args],
        cwd=cwd,
        env=clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return CliResult(list(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)
