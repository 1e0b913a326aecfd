"""The Files API against real processes: one `ftq up` (SQLite, the embedded broker, its own worker) with
two owners and small caps, so the size cap and the quota are reached with files of a few megabytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import QUICK_SETTINGS, Deployment, tiny_assets

TOKENS = {
    "alice": "tok-alice-files-0123456789",
    "bob": "tok-bob-files-0123456789",
    "carol": "tok-carol-files-012345",
    "dave": "tok-dave-files-0123456",
}
ALICE, BOB, CAROL, DAVE = TOKENS["alice"], TOKENS["bob"], TOKENS["carol"], TOKENS["dave"]
MAX_FILE_BYTES = 2 * 1024 * 1024
QUOTA_BYTES = 5 * 1024 * 1024


@pytest.fixture(scope="package")
def files_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tiny = tiny_assets()
    root = tmp_path_factory.mktemp("files")
    dep = Deployment(
        root / "up",
        mode="up",
        tokens=TOKENS,
        settings={
            **QUICK_SETTINGS,
            "max_file_bytes": MAX_FILE_BYTES,
            "file_quota_bytes": QUOTA_BYTES,
            "local_roots": f"{tiny}:{root / 'up' / 'data'}",
        },
    )
    dep.start()
    yield dep
    dep.close(cancel_active=True)


@pytest.fixture(scope="package")
def tiny() -> Path:
    return tiny_assets()
