"""A small disk of a test's own: a tmpfs mounted on a folder (tests run as root here), for what a full disk
does. Skips the test, saying why, where mounting is not permitted."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """`where` (made if missing) as a tmpfs of `size` (mount's form: `2m`, `64m`), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root and mount(8), which this machine does not give the test")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {res.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
