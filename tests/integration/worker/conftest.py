"""The worker runtime's deployments, each shared by its module: `ftq up` on its embedded defaults, and
`ftq api` + `ftq worker` on PostgreSQL and a private Redis. Both may read the tiny assets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import QUICK_SETTINGS, Deployment


def runtime_settings(root: Path, tiny: Path) -> dict[str, object]:
    return {**QUICK_SETTINGS, "local_roots": f"{tiny}:{root / 'data'}"}


@pytest.fixture(scope="module")
def embedded(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """`ftq up` on its defaults: SQLite file, filesystem broker, local launcher."""
    root = tmp_path_factory.mktemp("ftq-up")
    with Deployment(root, settings=runtime_settings(root, tiny_dir)) as dep:
        yield dep


@pytest.fixture(scope="module")
def production(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """`ftq api` + `ftq worker` as separate processes on PostgreSQL and Redis (a private one: the tests
    stop it)."""
    root = tmp_path_factory.mktemp("ftq-prod")
    dep = Deployment(
        root,
        mode="api+worker",
        store="postgres",
        broker="redis",
        settings=runtime_settings(root, tiny_dir),
    )
    with dep:
        yield dep
