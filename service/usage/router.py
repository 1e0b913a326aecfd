"""`GET /usage`: what each owner's runs used (HTTP only; the rules are in service.usage.service)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Query

from ftq.schemas import UsagePage
from service.deps import RepoDep
from service.errors import SpecError
from service.jobs.schemas import ErrorBody
from service.usage import service

router = APIRouter(prefix="/usage", tags=["usage"])


@router.get(
    "",
    response_model=UsagePage,
    responses={401: {"model": ErrorBody}},
    summary="Device-seconds of ended runs, per owner or per owner and day",
)
def get_usage(
    repo: RepoDep,
    from_: datetime | None = Query(
        None, alias="from", description="Runs that ended at or after this time (RFC 3339; default: all)."
    ),
    to: datetime | None = Query(
        None, description="Runs that ended before this time (RFC 3339; default: now)."
    ),
    group_by: Literal["owner", "day"] = Query(
        "owner", description="owner: one row per owner; day: one row per owner and UTC day the runs ended."
    ),
) -> UsagePage:
    """Each run counts its devices (GPUs, or CPU processes) x its wall time from launch to end (SLURM's own
    start and end where known), once, on the day it ended. An owner sees their own usage."""
    for name, value in (("from", from_), ("to", to)):
        if value is not None and value.tzinfo is None:
            raise _query_error(name, f"{name} needs a time zone, e.g. 2026-12-01T00:00:00Z")
    if from_ is not None and to is not None and to < from_:
        raise _query_error("to", "to is before from")
    return service.usage(repo, from_, to, group_by)


def _query_error(name: str, msg: str) -> SpecError:
    return SpecError([{"loc": ["query", name], "msg": msg, "type": "value_error"}])
