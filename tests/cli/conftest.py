"""Fixtures for the CLI tests: the shared real server (tests/e2e/ftq_e2e.py) and its finished tiny job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from ftq_e2e import (
    FinishedJob,
    Server,
    finished_tiny_job,
    shared_auth_server,
    shared_server,
)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Server:
    return shared_server(lambda: tmp_path_factory.mktemp("e2e"), request.addfinalizer)


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Server:
    return shared_auth_server(lambda: tmp_path_factory.mktemp("e2e"), request.addfinalizer)


@pytest.fixture(scope="session")
def finished_job(server: Server) -> FinishedJob:
    return finished_tiny_job(server)
