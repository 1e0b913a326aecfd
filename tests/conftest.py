"""Fixtures for every level (unit, integration, e2e): the tiny assets, and ftq's settings and API for code
that runs inside the test process. Processes and deployments are tests/harness's; each level's conftest
adds its own."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.harness import TINY_RELATIVE, tiny_assets, tiny_spec
from tests.harness.groups import GROUPS_DIR, scheduler, write_groups
from tests.harness.inprocess import MakeClient, migrate, reset_caches, use_settings

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


def _xdist_controller(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") == "loadgroup" and not os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    """On the xdist controller: a folder for the groups its workers compute (tests/harness/groups.py).
    Where tests are collected (a worker, or pytest without xdist): the garbage collector off until the
    collection is done, as trainer/lean.py imports (a worker's collection: ~3 CPU-s less of ~10)."""
    if _xdist_controller(config):
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="ftq-xdist-groups-")
    else:
        gc.disable()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # What the collection imported and built lives as long as the session: frozen, later collections
    # do not walk it again.
    gc.freeze()
    gc.enable()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _xdist_controller(config) and os.environ.get(GROUPS_DIR):
        shutil.rmtree(os.environ.pop(GROUPS_DIR), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: which tests run on the same worker, for the controller to read."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        write_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`: by the groups of tests/harness/groups.py, the heaviest first."""
    return scheduler(config, log) if config.getoption("dist") == "loadgroup" else None


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """examples/tiny (built by `make install`, or here if it has not run)."""
    return tiny_assets()


@pytest.fixture
def ftq_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """FTQ_ settings for this test alone: a private data dir, nothing from the caller's environment."""
    data = tmp_path / "data"
    data.mkdir()
    use_settings(monkeypatch, data_dir=data, env="test")
    yield {"FTQ_DATA_DIR": str(data), "FTQ_ENV": "test"}
    reset_caches()


@pytest.fixture
def make_client(ftq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeClient]:
    """Build an in-process API client (TestClient) on a migrated store, with extra settings by name."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    clients: list[TestClient] = []

    def make(database_url: str | None = None, **settings: str) -> TestClient:
        if database_url:
            monkeypatch.setenv("FTQ_DATABASE_URL", database_url)
        for k, v in settings.items():
            monkeypatch.setenv(f"FTQ_{k.upper()}", v)
        reset_caches()
        migrate()
        client = TestClient(create_app())
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def tiny_job(tiny_dir: Path) -> dict[str, Any]:
    """A valid tiny CPU job as a POST body, its paths relative to the server's default roots (examples/
    is one), checkpointing every 2 of its 4 steps."""
    return tiny_spec(TINY_RELATIVE, save_steps=2)
