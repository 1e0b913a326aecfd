"""Shared fixtures: a fresh data dir and store per test, on SQLite and (where asked) on PostgreSQL."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "examples" / "tiny"
PG_ADMIN_URL = os.environ.get("FTQ_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("FTQ_TEST_REDIS", "redis://127.0.0.1:6379")


def _reset_caches() -> None:
    from ftq.settings import get_settings
    from ftq.store.db import reset_engine_cache

    get_settings.cache_clear()
    reset_engine_cache()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards."""
    name = f"ftq_test_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _reset_pg(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ftq.db'}"
    url: str = request.getfixturevalue("pg_database")
    _reset_pg(url)
    return url


@pytest.fixture
def ftq_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """FTQ_ settings pointing at a private data dir; caches reset around the test."""
    data = tmp_path / "data"
    data.mkdir()
    env = {"FTQ_DATA_DIR": str(data), "FTQ_ENV": "test"}
    for key in list(os.environ):
        if key.startswith("FTQ_") and not key.startswith("FTQ_TEST_"):
            monkeypatch.delenv(key)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _reset_caches()
    yield env
    _reset_caches()


@pytest.fixture
def make_client(ftq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Build an in-process API client on a migrated store with the given extra settings."""
    from fastapi.testclient import TestClient

    clients: list[TestClient] = []

    def make(database_url: str | None = None, **settings: str) -> TestClient:
        if database_url:
            monkeypatch.setenv("FTQ_DATABASE_URL", database_url)
        for k, v in settings.items():
            monkeypatch.setenv(f"FTQ_{k.upper()}", v)
        _reset_caches()
        from ftq.settings import get_settings
        from ftq.store.migrate import upgrade
        from service.app import create_app

        upgrade(get_settings().sqlalchemy_url)
        client = TestClient(create_app())
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def tiny_spec() -> dict:
    """A valid CPU spec on the tiny model and data that `make install` builds."""
    assert (TINY / "model" / "config.json").exists(), (
        "run `make install` (python -m trainer.tiny --out examples/tiny)"
    )
    return {
        "name": "tiny",
        "model": {"name_or_path": "./tiny/model"},
        "dataset": {"name_or_path": "./tiny/data/train.jsonl", "text_field": "text"},
        "training": {
            "max_steps": 4,
            "max_seq_len": 64,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "mixed_precision": "no",
            "save_steps": 2,
        },
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "resources": {"device": "cpu", "processes_per_node": 1},
    }
