"""The validation task on the production shape: `ftq api` and `ftq worker` as separate processes on
PostgreSQL and Redis. An upload made while the broker is down is not lost: the file row is its own
outbox entry, and the worker's relay sends its validation once Redis is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.e2e.files.helpers import upload_raw, wait_validated
from tests.harness import QUICK_SETTINGS, Deployment

TOKEN = "tok-prod-files-0123456789"


@pytest.fixture(scope="module")
def prod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    dep = Deployment(
        tmp_path_factory.mktemp("files-prod"),
        mode="api+worker",
        store="postgres",
        broker="redis",
        tokens={"dana": TOKEN},
        settings=QUICK_SETTINGS,
    )
    dep.start()
    yield dep
    dep.close()


def _sent_at(dep: Deployment, file_id: str) -> object:
    assert dep.database_url
    engine = create_engine(dep.database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT validation_sent_at FROM files WHERE id = :id"), {"id": file_id}
            ).scalar_one()
    finally:
        engine.dispose()


def test_an_upload_while_redis_is_down_is_validated_once_it_is_back(prod: Deployment, tmp_path: Path) -> None:
    assert prod.redis is not None
    prod.stop("worker")  # nothing validates until it is back
    prod.redis.stop()
    try:
        r = upload_raw(prod, TOKEN, b'{"text": "one"}\n{"text": "two"}\n')
        assert r.status_code == 201, r.text
        file_id = r.json()["id"]
        time.sleep(1.0)  # the API's attempt to send has failed by now
        assert _sent_at(prod, file_id) is None
    finally:
        prod.redis.start()
    prod.start_worker()
    f = wait_validated(prod, TOKEN, file_id, timeout=90)
    assert f["status"] == "ready" and f["rows"] == 2
    assert _sent_at(prod, file_id) is not None
    # With everything up, an upload is validated by the worker through Redis at once.
    g = wait_validated(prod, TOKEN, upload_raw(prod, TOKEN, b'{"oops": 1}\n').json()["id"], timeout=60)
    assert g["status"] == "invalid" and g["errors"][0]["line"] == 1
