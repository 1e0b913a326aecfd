"""The metrics poll every open dashboard repeats (`GET /jobs/{id}/metrics?after_step=`): its body, and
the short way a plain poll takes through the app.

`poll_body` is the answer: from the poll cache, else read (on PostgreSQL on the event loop, on SQLite in
one thread hop) and built from rows directly, the bytes `MetricsPage` would give.

`MetricsPollPath` is ASGI middleware, inside the request guard and the body-size cap, that answers a
plain poll (GET, `after_step` and `limit` written as plain integers in range, a valid owner, a job it
can read) without FastAPI's routing and parameter solving, which cost more CPU than the cached poll
itself (against `/healthz`, which does neither, the poll fell below 1x on `ftq up`). Whatever is not
plain passes on to the app, whose route (`service.jobs.router.get_metrics`, the one the OpenAPI
document describes) gives the same body or the error the request earns: a 401, 404, 422 or 503 is
never answered here.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import Response
from sqlalchemy.exc import DBAPIError
from starlette.types import ASGIApp, Receive, Scope, Send

from ftq.runtime.logs import job_context
from ftq.runtime.settings import get_settings
from service.deps import owner_of
from service.errors import NotFound, Unauthorized
from service.jobs import metrics
from service.jobs.poll_cache import PollCache
from service.jobs.reads import in_thread
from service.routes import ID_MAX_LENGTH

AFTER_STEP_DEFAULT, AFTER_STEP_MIN, AFTER_STEP_MAX = -1, -1, 2**31 - 1
LIMIT_DEFAULT, LIMIT_MIN, LIMIT_MAX = 1000, 1, 10000

_cache = PollCache()


async def poll_body(state: Any, owner: str, job_id: str, *, after_step: int, limit: int) -> bytes:
    """The poll's JSON body for `owner` (NotFound when the owner cannot read the job). `state` is the
    app's: its `read_pool` (PostgreSQL, opened in the lifespan) reads on the event loop."""
    key = (owner, job_id, after_step, limit)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    pool = getattr(state, "read_pool", None)
    if pool is not None:
        body, final = await metrics.metrics_page_json_on_loop(
            pool, owner, job_id, after_step=after_step, limit=limit
        )
    else:
        body, final = await in_thread(
            lambda: metrics.metrics_page_json(owner, job_id, after_step=after_step, limit=limit)
        )
    _cache.put(key, body, final=final)
    return body


def json_response(body: bytes) -> Response:
    return Response(content=body, media_type="application/json")


_PREFIX, _SUFFIX = "/jobs/", "/metrics"
# Integers as a client writes them; anything else ("+5", "05", "5.0", " 5") is left to the route's
# validation, which accepts or refuses it as it always has.
_PLAIN_INT = re.compile(rb"-1|0|[1-9][0-9]{0,9}")
_QUERY_NAMES = (b"after_step", b"limit")


def plain_poll(scope: Scope) -> tuple[str, int, int] | None:
    """(job id, after_step, limit) of a plain metrics poll, else None."""
    if scope.get("method") != "GET" or scope.get("root_path"):
        return None
    path: str = scope.get("path", "")
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    job_id = path[len(_PREFIX) : -len(_SUFFIX)]
    if not 1 <= len(job_id) <= ID_MAX_LENGTH or "/" in job_id:
        return None
    query = _plain_query(scope.get("query_string", b""))
    if query is None:
        return None
    after_step = query.get(b"after_step", AFTER_STEP_DEFAULT)
    limit = query.get(b"limit", LIMIT_DEFAULT)
    if not (AFTER_STEP_MIN <= after_step <= AFTER_STEP_MAX and LIMIT_MIN <= limit <= LIMIT_MAX):
        return None
    return job_id, after_step, limit


def _plain_query(query_string: bytes) -> dict[bytes, int] | None:
    """after_step and limit, each at most once and as a plain integer, and nothing else; else None."""
    found: dict[bytes, int] = {}
    if not query_string:
        return found
    for pair in query_string.split(b"&"):
        name, eq, value = pair.partition(b"=")
        if not eq or name not in _QUERY_NAMES or name in found or not _PLAIN_INT.fullmatch(value):
            return None
        found[name] = int(value)
    return found


def _authorization(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return ""


class MetricsPollPath:
    """The short way for a plain metrics poll; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A request traced by FastAPI's telemetry takes the routed way, so its span names its route.
        traced = scope.get("fastapi.telemetry") is not None
        poll = plain_poll(scope) if scope["type"] == "http" and not traced else None
        body = None if poll is None else await self._answer(scope, *poll)
        if body is None:
            await self.app(scope, receive, send)
            return
        await json_response(body)(scope, receive, send)

    async def _answer(self, scope: Scope, job_id: str, after_step: int, limit: int) -> bytes | None:
        try:
            owner = owner_of(_authorization(scope), get_settings())
        except Unauthorized:
            return None
        with job_context(job_id):
            try:
                return await poll_body(scope["app"].state, owner, job_id, after_step=after_step, limit=limit)
            except (NotFound, DBAPIError):
                # The route reads again and answers the 404, or the 503 (the store may be back by then).
                return None
