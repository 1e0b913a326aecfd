"""A small disk of a test's own: a tmpfs mounted on a folder (tests run as root here), for what a full disk
does. The suite runs as root (CI too): where mounting is not permitted the test fails, saying why, since a
skipped full-disk test would prove nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """`where` (made if missing) as a tmpfs of `size` (mount's form: `2m`, `64m`), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    assert os.geteuid() == 0 and shutil.which("mount"), (
        "this test mounts a tmpfs: run it as root, with mount(8)"
    )
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    assert res.returncode == 0, (
        f"this test mounts a tmpfs, which is not permitted here: {res.stderr.decode()}"
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
