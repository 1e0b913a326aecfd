"""`GET /usage`: what each owner's runs used (HTTP only; the rules are in service.usage.service)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, Query

from ftq.contract.schemas import ErrorBody, UsagePage
from service.deps import RepoDep
from service.errors import SpecError
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
    from_: str | None = Query(
        None,
        alias="from",
        description="Runs that ended at or after this time (RFC 3339 with a zone; default: all).",
        json_schema_extra={"format": "date-time"},
    ),
    to: str | None = Query(
        None,
        description="Runs that ended before this time (RFC 3339 with a zone; default: now).",
        json_schema_extra={"format": "date-time"},
    ),
    group_by: Literal["owner", "day"] = Query(
        "owner", description="owner: one row per owner; day: one row per owner and UTC day the runs ended."
    ),
) -> UsagePage:
    """Each run counts its devices (GPUs, or CPU processes) x its wall time from launch to end (SLURM's own
    start and end where known), once, on the day it ended. An owner sees their own usage."""
    since, until = _rfc3339("from", from_), _rfc3339("to", to)
    if since is not None and until is not None and until < since:
        raise _query_error("to", "to is before from")
    return service.usage(repo, since, until, group_by)


def _query_error(name: str, msg: str) -> SpecError:
    return SpecError([{"loc": ["query", name], "msg": msg, "type": "value_error"}])


# RFC 3339 as JSON Schema's date-time means it: a number (which pydantic would take as a Unix time) or a
# date without a time or zone is refused, so `from=0.5` is a 422, not every run since 1970.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    if not _RFC3339.fullmatch(value):
        raise _query_error(name, f"{name} must be an RFC 3339 time with a zone, e.g. 2026-12-01T00:00:00Z")
    try:
        parsed = datetime.fromisoformat(f"{value[:10]}T{value[11:]}".replace("z", "Z"))
    except ValueError as e:
        raise _query_error(name, f"{name} is not a valid time: {e}") from e
    try:
        # Its UTC instant must exist too: 9999-12-31T23:59:59-23:59 is past the last datetime.
        return parsed.astimezone(UTC)
    except OverflowError as e:
        raise _query_error(name, f"{name} is out of range once converted to UTC") from e
