"""The fault tests' deployments, with API tokens on: `ftq api` + `ftq worker` on a PostgreSQL server and a
Redis of their own (the test stops both; no other test sees it), and `ftq up`."""

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
def private_postgres() -> Iterator[postgres.PrivatePostgres]:
    server = postgres.PrivatePostgres().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def production_stack(
    tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory, private_postgres: postgres.PrivatePostgres
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("faults-prod")
    dep = Deployment(
        root,
        mode="api+worker",
        store="postgres",
        database_url=private_postgres.create_database(),
        broker="redis",
        tokens=TOKENS,
        settings=fault_settings(root, tiny_dir),
    )
    with dep:
        yield dep


@pytest.fixture(scope="module")
def embedded_stack(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("faults-up")
    with Deployment(root, tokens=TOKENS, settings=fault_settings(root, tiny_dir)) as dep:
        yield dep
