"""Settings for code run inside the test process (an app under TestClient, the controller's reconcile):
the environment's FTQ_ settings replaced for one test, and the caches that hold them reset."""

from __future__ import annotations

import os
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
    """The configured store, migrated to head."""
    from ftq.store.migrate import upgrade

    upgrade(get_settings().sqlalchemy_url)


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
