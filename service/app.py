"""The FastAPI app: error answers, routes, the OpenAPI document, middleware (the body-size cap is
here), health and readiness."""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ftq import __version__, sandbox
from ftq.contract.graders import clean_loc
from ftq.contract.schemas import Health
from ftq.contract.spec import JobSpec
from ftq.runtime import logs
from ftq.runtime.settings import Settings, get_settings
from ftq.store.db import get_engine, open_async_read_pool
from service.artifacts.router import router as artifacts_router
from service.errors import (
    FtqError,
    InsufficientStorage,
    PayloadTooLarge,
    SandboxUnavailable,
    ServiceUnavailable,
)
from service.evaluations.router import router as evaluations_router
from service.events.router import router as events_router
from service.exports.router import router as exports_router
from service.files.router import router as files_router
from service.graders.router import router as graders_router
from service.guard import RequestGuard, send_error
from service.jobs.poll import MetricsPollPath
from service.jobs.router import RateLimiter
from service.jobs.router import router as jobs_router
from service.observability import router as metrics_router
from service.openai import errors as openai_errors
from service.openai.router import STREAMED_V1_UPLOADS
from service.openai.router import router as openai_router
from service.serving.engines import EngineManager
from service.serving.proxy import Transport
from service.serving.router import router as deployments_router
from service.serving.router import v1_router as serving_v1_router
from service.tinker.native import router as training_clients_router
from service.tinker.router import router as tinker_router
from service.tinker.runtime import Runtime as TinkerRuntime
from service.ui.router import router as ui_router
from service.usage.router import router as usage_router
from service.webhooks.router import add_webhook_docs
from service.webhooks.router import router as webhooks_router

log = logging.getLogger(__name__)

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
# Routes that stream their bodies to disk under caps of their own (see BodySizeLimit).
STREAMED_UPLOADS = frozenset({("POST", "/files"), ("POST", "/files/")})


class BodySizeLimit:
    """Refuse bodies over FTQ_MAX_BODY_BYTES before they are read into memory (413).

    `streamed` routes (method, path) read their bodies as streams and enforce caps of their own while
    they do (`POST /files`: FTQ_MAX_FILE_BYTES and the owner's quota), so this cap does not apply there."""

    def __init__(self, app: ASGIApp, max_bytes: int, streamed: frozenset[tuple[str, str]] = frozenset()):
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _streamed(scope, self.streamed):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await send_error(
                    send, PayloadTooLarge(f"the body is over {self.max_bytes} bytes"), scope["path"]
                )
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await send_error(send, PayloadTooLarge(f"the body is over {self.max_bytes} bytes"), scope["path"])


class _TooLarge(Exception):
    pass


def _streamed(scope: Scope, streamed: frozenset[tuple[str, str]]) -> bool:
    method, path = scope.get("method"), scope.get("path", "")
    return (method, path) in streamed or (
        method == "POST" and STREAMED_V1_UPLOADS.fullmatch(path) is not None
    )


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    logs.configure(get_settings().log_level)
    # Polls read on the event loop through this pool (PostgreSQL); without a lifespan (an app driven
    # without startup, as some tests do) they take the thread path instead.
    app.state.read_pool = open_async_read_pool()
    try:
        yield
    finally:
        if app.state.read_pool is not None:
            await app.state.read_pool.close()
        app.state.read_pool = None
        # The serving engines this process started (service.serving.engines) go with it.
        app.state.engines.close()
        app.state.tinker.close()


def create_app() -> FastAPI:
    """The API: its error answers, routes, OpenAPI document and middleware, each added by a step below."""
    settings = get_settings()
    app = FastAPI(
        lifespan=_lifespan,
        title="ftq",
        version=__version__,
        description=(
            "Fine-tuning jobs as a service: POST a spec, ftq renders the accelerate launch (FSDP, DeepSpeed "
            "ZeRO, DDP), runs it locally or on SLURM, and serves its logs, loss and learning-rate curves."
        ),
        separate_input_output_schemas=False,
    )
    app.state.rate_limiter = RateLimiter()
    app.state.engines = EngineManager(settings)
    app.state.engine_transport = Transport()
    app.state.tinker = TinkerRuntime()
    _add_error_handlers(app)
    _add_routes(app)
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    _add_middleware(app, settings)
    return app


# Error answers ------------------------------------------------------------------------------------------


async def _ftq_error(request: Request, exc: Exception) -> Response:
    err = cast(FtqError, exc)
    if openai_errors.under_v1(request.url.path):
        return openai_errors.from_ftq(err)
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    http = cast(StarletteHTTPException, exc)
    v1 = openai_errors.under_v1(request.url.path)
    if http.status_code != 405:
        if v1:
            return openai_errors.from_http(
                http.status_code, http.detail, request.method, request.url.path, headers=http.headers
            )
        return await http_exception_handler(request, http)
    # Starlette's Allow names only the first route on the path; RFC 9110 wants every method there.
    routes = request.app.router.routes
    allowed = {
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    }
    headers = dict(http.headers or {})
    if allowed:
        headers["Allow"] = ", ".join(sorted(allowed))
    if v1:
        return openai_errors.from_http(405, http.detail, request.method, request.url.path, headers=headers)
    return JSONResponse({"detail": http.detail}, status_code=405, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    errors = [
        {
            "loc": clean_loc(list(e.get("loc", []))),
            "msg": e.get("msg", ""),
            "type": e.get("type", "value_error"),
        }
        for e in cast(RequestValidationError, exc).errors()
    ]
    if openai_errors.under_v1(request.url.path):
        return openai_errors.from_validation(errors)
    return JSONResponse({"detail": errors}, status_code=422)


async def _store_down(request: Request, exc: Exception) -> Response:
    # The store is unreachable (restarting, network): tell clients to come back, do not 500.
    log.warning("store unavailable: %s", str(exc).splitlines()[0])
    err: FtqError = ServiceUnavailable("the job store is unavailable; retry shortly")
    if "database or disk is full" in str(exc) or "No space left on device" in str(exc):
        err = _NO_ROOM
    if openai_errors.under_v1(request.url.path):
        return openai_errors.from_ftq(err)
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


_NO_ROOM = InsufficientStorage(
    "the server's disk is full: nothing was stored; try again later, or ask the operator to free space "
    "where ftq keeps its data (FTQ_DATA_DIR)"
)


async def _sandbox_down(request: Request, exc: Exception) -> Response:
    # Where bubblewrap cannot start, tenant code is refused with the fix, never run weaker.
    log.error("tenant-code sandbox unavailable: %s", exc)
    return await _ftq_error(request, SandboxUnavailable(str(exc)))


async def _os_error(request: Request, exc: Exception) -> Response:
    # A full disk (or file system quota) under any request is the server's state, said as a 507, never a
    # 500; any other OSError is a bug, left to the 500 handler.
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        log.warning("no room on disk: %s %s: %s", request.method, request.url.path, exc)
        if openai_errors.under_v1(request.url.path):
            return openai_errors.from_ftq(_NO_ROOM)
        return JSONResponse(_NO_ROOM.body(), status_code=_NO_ROOM.status_code, headers=_NO_ROOM.headers)
    raise exc


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as `{"detail", "code"}` (service.errors), validation errors as FastAPI's list, a 405
    with its full Allow header, and a store that does not answer as a 503; under `/v1`, each of them in
    OpenAI's error envelope (service.openai.errors)."""
    app.add_exception_handler(FtqError, _ftq_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(DBAPIError, _store_down)
    app.add_exception_handler(OperationalError, _store_down)
    app.add_exception_handler(OSError, _os_error)
    app.add_exception_handler(sandbox.SandboxUnavailable, _sandbox_down)


# Routes -------------------------------------------------------------------------------------------------


async def healthz() -> Health:
    # On the event loop, no thread-pool hop: liveness means the loop answers, even while every
    # worker thread is busy (parsing bodies, reading the store).
    return Health(status="ok")


def readyz() -> Any:
    checks = {"store": _check_store(), "broker": _check_broker()}
    ok = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


def _add_routes(app: FastAPI) -> None:
    """The API's routers, health and readiness, the dashboard and /metrics (in this order: the OpenAPI
    document lists paths as they are added)."""
    for router in (jobs_router, exports_router, evaluations_router, events_router, webhooks_router):
        app.include_router(router)
    add_webhook_docs(app)
    for router in (usage_router, artifacts_router, files_router, graders_router, deployments_router):
        app.include_router(router)
    app.include_router(training_clients_router)
    app.add_api_route("/healthz", healthz, response_model=Health, tags=["health"], summary="Liveness")
    app.add_api_route(
        "/readyz",
        readyz,
        response_model=Health,
        tags=["health"],
        summary="Readiness: the store and the broker answer",
        responses={503: {"model": Health, "description": "Not ready"}},
    )
    app.include_router(openai_router)
    app.include_router(serving_v1_router)
    app.include_router(tinker_router)
    app.include_router(ui_router)
    app.include_router(metrics_router)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, built once, with the job spec's schema (the spec body is read by hand, JSON
    or YAML, so FastAPI does not see it)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        webhooks=app.webhooks.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    spec_schema = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in spec_schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components["JobSpec"] = spec_schema
    app.openapi_schema = schema
    return schema


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    """Each added here runs before the ones added above it: the guard first (header limits, the Host
    and the origin, before anything is read), then the body-size cap, then the plain metrics poll's
    short way (service.jobs.poll), so that way passes both checks like any route."""
    app.add_middleware(MetricsPollPath)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, streamed=STREAMED_UPLOADS)
    app.add_middleware(RequestGuard, settings=settings)


def _check_store() -> str:
    try:
        with get_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"error: {str(exc).splitlines()[0][:200]}"


def _check_broker() -> str:
    settings = get_settings()
    try:
        if settings.uses_embedded_broker:
            folder = settings.state_path("broker") / "queue"
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / ".ready-probe"
            probe.write_text("ok")
            probe.unlink()
            return "ok"
        from kombu import Connection

        with Connection(settings.celery_broker_url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"error: {str(exc).splitlines()[0][:200]}"
