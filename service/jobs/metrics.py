"""The metrics poll every open dashboard repeats: one prebuilt statement, the response's bytes built
from rows without model validation (see `ftq.store.repository.MetricsPoll`)."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import pydantic_core
from sqlalchemy import Engine

from ftq.contract.metrics import POINT_FIELDS
from ftq.contract.status import TERMINAL, JobStatus
from ftq.store.db import AsyncReadPool, get_engine
from ftq.store.repository import MetricsPoll
from service.errors import NotFound

_POINT_KEYS = ("step", *POINT_FIELDS, "extra")


@lru_cache(maxsize=4)
def _metrics_poll(engine: Engine) -> MetricsPoll:
    return MetricsPoll(engine)


def metrics_page_json(owner: str, job_id: str, *, after_step: int, limit: int) -> tuple[bytes, bool]:
    """The same bytes as MetricsPage(...).model_dump_json(), built from rows without model validation,
    and whether the job is terminal (its points will not change again)."""
    found = _metrics_poll(get_engine()).rows(owner, job_id, after_step, limit)
    return _metrics_page_body(found, job_id, after_step, limit)


async def metrics_page_json_on_loop(
    pool: AsyncReadPool, owner: str, job_id: str, *, after_step: int, limit: int
) -> tuple[bytes, bool]:
    """metrics_page_json() on the event loop (PostgreSQL)."""
    found = await _metrics_poll(get_engine()).rows_on_loop(pool, owner, job_id, after_step, limit)
    return _metrics_page_body(found, job_id, after_step, limit)


def _metrics_page_body(
    found: tuple[str, list[Any]] | None, job_id: str, after_step: int, limit: int
) -> tuple[bytes, bool]:
    if found is None:
        raise NotFound(f"job {job_id} not found")
    status, rows = found
    data = [dict(zip(_POINT_KEYS, r, strict=True)) for r in rows]
    for point in data:
        if isinstance(point["extra"], str):  # SQLite's driver leaves JSON as its text
            point["extra"] = json.loads(point["extra"])
    next_after = rows[-1][0] if rows else after_step
    terminal = JobStatus(status) in TERMINAL
    complete = terminal and len(rows) < limit
    # pydantic_core writes floats exactly as the response model would (0.00001, 1e+20).
    return pydantic_core.to_json(
        {"data": data, "next_after_step": next_after, "complete": complete}
    ), terminal
