"""Settings for code run inside the test process (an app under TestClient, the controller's reconcile):
the environment's FTQ_ settings replaced for one test, and the caches that hold them reset."""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ftq.runtime.settings import Settings, get_settings
from tests.harness.env import ftq_settings

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

# The `make_client` fixture: make_client(database_url=None, **settings) -> an in-process API client
# (fastapi's TestClient) on a migrated store, with FTQ_ settings given by name without the prefix.
MakeClient = Callable[..., "TestClient"]


def reset_caches() -> None:
    """Forget the cached settings and store engines (the next use reads the environment again)."""
    from ftq.store.db import reset_engine_cache

    get_settings.cache_clear()
    reset_engine_cache()


def use_settings(monkeypatch: pytest.MonkeyPatch, **settings: object) -> Settings:
    """This test's FTQ_ settings are `settings` (by name without the prefix) and nothing else of the
    caller's (FTQ_TEST_ knobs stay); restored by monkeypatch at the end of the test."""
    for key in list(os.environ):
        if key.startswith("FTQ_") and not key.startswith("FTQ_TEST_"):
            monkeypatch.delenv(key)
    for key, value in ftq_settings(settings).items():
        monkeypatch.setenv(key, value)
    reset_caches()
    return get_settings()


def migrate() -> None:
    """The configured store, migrated to head. A new SQLite file (most in-process tests' store) is a copy
    of one this process migrated with Alembic once, which is a second per test less than running every
    migration again (tests/unit/ftq/store/test_migrate.py runs them for real, up and down)."""
    from ftq.store.migrate import upgrade

    url = get_settings().sqlalchemy_url
    prefix = "sqlite:///"
    target = Path(url.removeprefix(prefix)) if url.startswith(prefix) and "?" not in url else None
    if target is None or target.exists():
        upgrade(url)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(_migrated_sqlite()) as source, sqlite3.connect(target) as copy:
        source.backup(copy)  # page by page, whatever journal mode the template is in


_TEMPLATE: list[Path] = []


def _migrated_sqlite() -> Path:
    """A SQLite file migrated to head by Alembic, made once per test process."""
    if not _TEMPLATE:
        from ftq.store.migrate import upgrade

        folder = Path(tempfile.mkdtemp(prefix="ftq-migrated-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = folder / "ftq.db"
        upgrade(f"sqlite:///{path}")
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


def quiesce_controller(data_dir: Path, timeout: float = 30) -> None:
    """End what an in-process controller left running: its runs' process groups, then the reaper threads
    that wait on them. A reaper sweeps when its run ends, with whatever settings are current then, and
    keeps retrying for seconds while another sweep holds the lock: left alone, it would claim and launch
    the next test's queued jobs in that test's store, under its assertions."""
    from tests.harness.procs import kill_runs

    kill_runs(data_dir)
    for thread in threading.enumerate():
        if thread.name.startswith("reap-"):
            thread.join(timeout)  # its sweep runs in the thread: joined, nothing of it is left
