"""An upload streams to disk: a 100 MB file, raw and as a multipart form, grows a real `ftq api`'s peak
RSS by less than 50 MB (bench/upload_memory.py measures 500 MB the same way)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.upload_memory import deployment, make_file, measure
from tests.harness import Deployment

SIZE = 100 * 1024 * 1024
LIMIT_KIB = 50 * 1024


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    return path, make_file(path, SIZE)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployment(tmp_path_factory.mktemp("upload-memory"), 4 * SIZE) as dep:
        yield dep


@pytest.mark.parametrize("multipart", [False, True], ids=["raw", "multipart"])
def test_a_100_mb_upload_grows_the_api_by_less_than_50_mb(
    api: Deployment, big: tuple[Path, str], multipart: bool
) -> None:
    path, sha = big
    got = measure(api, path, multipart=multipart)
    assert got["sha256"] == sha and got["bytes"] == path.stat().st_size
    assert got["growth_kib"] < LIMIT_KIB, got
