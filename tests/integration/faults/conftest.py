"""The fault tests' deployments, with API tokens on: `ftq api` + `ftq worker` on PostgreSQL and a private
Redis (the test stops both the machine's PostgreSQL and that Redis), and `ftq up`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import QUICK_SETTINGS, Deployment, postgres

OWNER = "faults"
TOKENS = {OWNER: "faults-token"}


def fault_settings(root: Path, tiny: Path) -> dict[str, object]:
    return {**QUICK_SETTINGS, "local_roots": f"{tiny}:{root / 'data'}"}


@pytest.fixture(scope="module")
def production_stack(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("faults-prod")
    dep = Deployment(
        root,
        mode="api+worker",
        store="postgres",
        broker="redis",
        tokens=TOKENS,
        settings=fault_settings(root, tiny_dir),
    )
    try:
        with dep:
            yield dep
    finally:
        postgres.ensure_up()  # whatever the test left stopped


@pytest.fixture(scope="module")
def embedded_stack(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("faults-up")
    with Deployment(root, tokens=TOKENS, settings=fault_settings(root, tiny_dir)) as dep:
        yield dep
