"""The `ftq up` the preflight and failure tests run against."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness import QUICK_SETTINGS, Deployment


@contextmanager
def running_up(
    root: Path, tiny: Path, data_dir: Path | None = None, **settings: object
) -> Iterator[Deployment]:
    """`ftq up` with quick sweeps, its data dir and the tiny assets as its roots, and `settings`."""
    data = data_dir or root / "data"
    dep = Deployment(
        root, data_dir=data, settings={**QUICK_SETTINGS, "local_roots": f"{data}:{tiny}", **settings}
    )
    with dep:
        yield dep
