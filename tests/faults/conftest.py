"""Fixtures for the fault tests: `ftq api` + `ftq worker` on PostgreSQL + Redis, and `ftq up`, both with
API tokens. Built on the runtime tests' Stack (tests/worker/conftest.py); a Redis database of its own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.worker import conftest as runtime
from tests.worker.conftest import PG_ADMIN, REDIS_PORT, Stack, base_env, free_port, redis_cli, start_redis

tiny_dir = runtime.tiny_dir  # the runtime tests' fixture: examples/tiny, or a fresh build

REDIS_DB = 8
TOKEN = "faults-token"
OWNER = "faults"


def _with_tokens(stack: Stack) -> Stack:
    stack.http.headers["Authorization"] = f"Bearer {TOKEN}"
    return stack


@pytest.fixture(scope="module")
def production_stack(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    start_redis()
    name = f"ftq_faults_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    redis_cli("-n", str(REDIS_DB), "flushdb")
    data = tmp_path_factory.mktemp("faults-prod")
    port = free_port()
    env = base_env(data, tiny_dir, port)
    env["FTQ_DATABASE_URL"] = f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    env["FTQ_BROKER_URL"] = f"redis://127.0.0.1:{REDIS_PORT}/{REDIS_DB}"
    env["FTQ_API_TOKENS"] = f"{TOKEN}:{OWNER}"
    stack = _with_tokens(Stack(data, env, port))
    try:
        stack.start("api", ["api", "--port", str(port)])
        stack.wait_ready()
        stack.start_worker()
        yield stack
    finally:
        stack.shutdown()
        from bench.fault_series import ensure_pg

        ensure_pg()
        start_redis()
        redis_cli("-n", str(REDIS_DB), "flushdb")
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def embedded_stack(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("faults-up")
    port = free_port()
    env = base_env(data, tiny_dir, port)
    env["FTQ_API_TOKENS"] = f"{TOKEN}:{OWNER}"
    stack = _with_tokens(Stack(data, env, port))
    stack.start("up", ["up", "--port", str(port)])
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.shutdown()
