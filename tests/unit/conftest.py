"""Unit tests: in process, no subprocess, server or training. The store is a SQLite file of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """The store the store tests run on here (tests/integration/store runs them on PostgreSQL too)."""
    return f"sqlite:///{tmp_path / 'ftq.db'}"
