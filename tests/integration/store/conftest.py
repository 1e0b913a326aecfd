"""The store on the machine's PostgreSQL: one database for the session, emptied before each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import postgres


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh database for this test session, dropped afterwards."""
    with postgres.database("ftq_test") as url:
        yield url


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The session's database with an empty schema."""
    postgres.reset_schema(pg_database)
    return pg_database


@pytest.fixture
def store_url(pg_url: str) -> str:
    """For the store tests of tests/unit run here again: the store is PostgreSQL."""
    return pg_url
