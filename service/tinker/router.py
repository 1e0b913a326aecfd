"""The Tinker API's routes under `/api/v1` (issue 52), as the official `tinker` SDK (0.38) calls them.

The key is the SDK's `X-API-Key` header, looked up in the same token table as every other route's bearer
token (FTQ_API_TOKENS; the SDK refuses keys that do not start with `tml-`, so an operator gives Tinker
users tokens of that form). Bodies are read by hand, leniently (a newer SDK's extra fields are ignored),
and forward_backward's is the SDK's protobuf. Every error has a JSON body: the SDK takes an empty 400 for a
proxy's refusal and retries it.

Calls that do work answer with a future at once; `retrieve_future` holds the poll open until the result
is ready (up to `POLL_SECONDS`, then `try_again`: the SDK re-polls without waiting)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, cast

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from ftq.runtime.settings import get_settings
from service.deps import ANONYMOUS_OWNER, SessionDep, owner_of
from service.errors import BadRequest, NotFound, Unauthorized
from service.routes import error
from service.tinker.runtime import Runtime
from service.tinker.service import TinkerService

POLL_SECONDS = 20.0

# What any call may answer besides its result: every error carries a JSON body naming what it refuses.
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: error("A body this server cannot take, or a call or loss it does not support (the body names it)"),
    401: error("No X-API-Key, or one that is not an ftq token (`tml-...`)"),
    404: error("No such session, model, sampler, checkpoint or request of this key's owner"),
    413: error("A body over FTQ_MAX_BODY_BYTES"),
    429: error("Too many calls at once (the SDK backs off and retries)"),
    503: error("The training client or the store cannot answer now (retry)"),
}

router = APIRouter(prefix="/api/v1", tags=["tinker"], responses=_ERRORS)

F = TypeVar("F", bound=Callable[..., Any])


def bad_input(fn: F) -> F:
    """A body field of the wrong type (bodies are read by hand) is the caller's 400, never a 500."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise BadRequest(f"a field of the body is malformed: {type(exc).__name__}: {exc}") from None

        return cast(F, run_async)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise BadRequest(f"a field of the body is malformed: {type(exc).__name__}: {exc}") from None

    return cast(F, run)


def tinker_owner(request: Request) -> str:
    """The owner of the SDK's `X-API-Key` (a bearer token is taken too); 401 without a known one."""
    settings = get_settings()
    if not settings.auth_enabled:
        return ANONYMOUS_OWNER
    key = request.headers.get("x-api-key", "").strip()
    if not key:
        auth = request.headers.get("authorization", "")
        if not auth:
            raise Unauthorized()
        return owner_of(auth, settings)
    return owner_of(f"Bearer {key}", settings)


OwnerDep = Annotated[str, Depends(tinker_owner)]


def service_of(request: Request) -> TinkerService:
    runtime: Runtime = request.app.state.tinker
    svc = TinkerService(get_settings(), runtime, getattr(request.app.state, "engines", None))
    # From the first Tinker call on (a restarted API's too: the SDK's heartbeats come every 10 s), the
    # API saves idle training clients.
    svc.start_idle_sweep()
    return svc


ServiceDep = Annotated[TinkerService, Depends(service_of)]


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()  # under FTQ_MAX_BODY_BYTES (the app's BodySizeLimit)
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


Body = Annotated[dict[str, Any], Depends(_json)]


# Client setup and sessions ------------------------------------------------------------------------------


@router.post("/client/config", summary="The SDK's feature flags")
@bad_input
def client_config(owner: OwnerDep) -> dict[str, Any]:
    # Plain HTTP/1.1 through httpx; no JWT exchange, uncompressed forward_backward, no session-wide
    # polling of sample futures: the paths this server implements.
    return {
        "pjwt_auth_enabled": False,
        "proto_compress_fwdbwd": False,
        "sample_use_retrieve_futures": False,
        "custom_loss_server_side": False,
        "use_pyqwest_transport": False,
    }


@router.post("/create_session", summary="Start an SDK session")
@bad_input
def create_session(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.create_session(session, owner, body)


@router.post("/session_heartbeat", summary="Keep a session alive")
@bad_input
def session_heartbeat(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.heartbeat(session, owner, body)


@router.post("/sessions/{session_id}/finish", summary="End a session: its training clients stop")
@bad_input
def finish_session(session_id: str, owner: OwnerDep, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    svc.finish_session(session, owner, session_id)
    return {}


@router.post("/telemetry", summary="The SDK's telemetry: accepted and dropped")
@bad_input
def telemetry(owner: OwnerDep) -> dict[str, Any]:
    return {"status": "accepted"}


@router.get("/get_server_capabilities", summary="The trainable bases: the catalog's models")
@bad_input
def get_server_capabilities(owner: OwnerDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.capabilities()


@router.get("/healthz", summary="Liveness, as the SDK names it")
@bad_input
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


# Training ---------------------------------------------------------------------------------------------


@router.post("/create_model", summary="A LoRA training client on a catalog base (a run the scheduler places)")
@bad_input
def create_model(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.create_model(session, owner, body)


@router.post("/get_info", summary="A training client's base, tokenizer and LoRA rank")
@bad_input
def get_info(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.get_info(session, owner, body)


@router.post("/forward_backward", summary="forward_backward or forward (the SDK's protobuf body)")
@bad_input
async def forward_backward(request: Request, owner: OwnerDep, svc: ServiceDep) -> dict[str, Any]:
    from service.tinker import proto

    if "protobuf" not in request.headers.get("content-type", ""):
        raise BadRequest("forward_backward takes the SDK's protobuf body (application/x-protobuf)")
    if request.headers.get("content-encoding"):
        raise BadRequest("compressed forward_backward bodies are not supported by this server")
    parsed = proto.parse_forward_backward(await request.body())

    def run() -> dict[str, Any]:
        from ftq.store.db import new_session

        session = new_session()
        try:
            return svc.forward_backward(session, owner, parsed)
        finally:
            session.close()

    return await anyio.to_thread.run_sync(run)


@router.post("/optim_step", summary="An Adam step on the accumulated gradients")
@bad_input
def optim_step(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.optim_step(session, owner, body)


@router.post("/save_weights", summary="save_state: the adapter and the optimizer")
@bad_input
def save_weights(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.save_weights(session, owner, body)


@router.post("/load_weights", summary="A training client from a saved state, or load_state into one")
@bad_input
def load_weights(owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.load_weights(session, owner, body)


@router.post("/save_weights_for_sampler", summary="Sampler weights (a PEFT adapter folder)")
@bad_input
def save_weights_for_sampler(
    owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep
) -> dict[str, Any]:
    return svc.save_weights_for_sampler(session, owner, body)


# Sampling ---------------------------------------------------------------------------------------------


@router.post("/create_sampling_session", summary="A sampling session on saved sampler weights")
@bad_input
def create_sampling_session(
    owner: OwnerDep, body: Body, session: SessionDep, svc: ServiceDep
) -> dict[str, Any]:
    return svc.create_sampling_session(session, owner, body)


@router.get("/samplers/{sampler_id}", summary="A sampling session's base and weights")
@bad_input
def get_sampler(sampler_id: str, owner: OwnerDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.get_sampler(owner, sampler_id)


@router.post("/asample", summary="Sample (and prompt logprobs: compute_logprobs)")
@bad_input
def asample(owner: OwnerDep, body: Body, svc: ServiceDep) -> dict[str, Any]:
    return svc.asample(owner, body)


# Futures ----------------------------------------------------------------------------------------------


@router.post("/retrieve_future", summary="A call's result once ready (held open while it runs)")
@bad_input
async def retrieve_future(request: Request, owner: OwnerDep, body: Body) -> Response:
    runtime: Runtime = request.app.state.tinker
    future_id = body.get("request_id")
    future = runtime.future(owner, future_id) if isinstance(future_id, str) else None
    if future is None:
        raise NotFound("no such request (this server keeps results in memory: a restarted API forgets them)")
    deadline = time.monotonic() + POLL_SECONDS
    pause = 0.005
    while not future.done.is_set():
        if time.monotonic() > deadline or await request.is_disconnected():
            return JSONResponse({"type": "try_again", "request_id": future.id, "queue_state": "active"})
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)
    if future.error is not None:
        return JSONResponse({"error": str(future.error), "category": future.error.category})
    if future.proto:
        return Response(future.result, media_type="application/x-protobuf")
    return JSONResponse(future.result)


# REST -------------------------------------------------------------------------------------------------


@router.get("/training_runs", summary="The caller's training runs (training clients), newest first")
@bad_input
def training_runs(
    owner: OwnerDep,
    session: SessionDep,
    svc: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    return svc.training_runs(session, owner, limit, offset)


@router.get("/training_runs/{run_id}", summary="One training run")
@bad_input
def training_run(run_id: str, owner: OwnerDep, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.training_run(session, owner, run_id)


@router.get("/training_runs/{run_id}/checkpoints", summary="A training run's checkpoints")
@bad_input
def run_checkpoints(run_id: str, owner: OwnerDep, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.checkpoints(session, owner, run_id)


@router.get("/checkpoints", summary="All the caller's checkpoints, newest first")
@bad_input
def user_checkpoints(owner: OwnerDep, session: SessionDep, svc: ServiceDep) -> dict[str, Any]:
    return svc.checkpoints(session, owner, None)
