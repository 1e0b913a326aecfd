"""Serving over HTTP (the rules are in service.serving.service, the engines in service.serving.engines):
OpenAI's `POST /v1/chat/completions` and `POST /v1/completions` for the catalog's bases and the caller's
fine-tuned models and checkpoints, `GET /v1/models` (what the caller may use), and the native view of the
caller's engines, `GET /deployments`. Errors under /v1 are in OpenAI's envelope (the app's handlers)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from ftq.contract.openai import Model, OpenAIErrorBody, OpenAIList
from ftq.contract.serving import ChatCompletionCreate, CompletionCreate, Deployment, DeploymentList
from ftq.runtime.settings import get_settings
from service.deps import LoopOwnerDep, in_thread_session
from service.errors import NotFound
from service.jobs.reads import in_thread
from service.openai.errors import invalid
from service.openai.pagination import listing
from service.routes import UNAUTHORIZED, owner_errors
from service.serving import deployed, proxy, service
from service.serving.engines import EngineManager

_V1_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIErrorBody, "description": what}
    for code, what in (
        (
            400,
            "Invalid request (`error.param` names the parameter), or a model the engine cannot serve "
            "(`error.code` model_not_servable, the message says why)",
        ),
        (401, "Missing or invalid API key (an ftq token)"),
        (404, "No such model for this owner (another owner's is the same 404)"),
        (429, "FTQ_SERVE_ENGINES_PER_OWNER engines of yours are all answering calls; `Retry-After`"),
        (
            503,
            "The engine is starting past FTQ_SERVE_START_SECONDS, failed, or is not installed "
            "(`error.code` engine_not_installed names `make vllm`); `Retry-After`",
        ),
    )
}
_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "OpenAI's answer as the engine gives it: JSON, or with `stream: true` server-sent "
        "events ending in `data: [DONE]`",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **_V1_ERRORS,
}

v1_router = APIRouter(tags=["openai"])
router = APIRouter(prefix="/deployments", tags=["serving"])


def _manager(request: Request) -> EngineManager:
    return request.app.state.engines  # type: ignore[no-any-return]


def _transport(request: Request) -> proxy.Transport:
    return request.app.state.engine_transport  # type: ignore[no-any-return]


@v1_router.post(
    "/v1/chat/completions",
    response_class=Response,
    responses=_ANSWERS,
    summary="Chat with a base model or your fine-tuned model",
)
async def chat_completions(request: Request, body: ChatCompletionCreate, owner: LoopOwnerDep) -> Response:
    """The conversation rendered with the model's chat template (a fine-tuned model's: the one its job
    trained with) and completed by the owner's engine for its base; a cold engine is started and the call
    waits for it."""
    return await proxy.complete(
        _manager(request), _transport(request), owner, get_settings(), body, "/chat/completions"
    )


@v1_router.post(
    "/v1/completions",
    response_class=Response,
    responses=_ANSWERS,
    summary="Complete a prompt with a base model or your fine-tuned model",
)
async def completions(request: Request, body: CompletionCreate, owner: LoopOwnerDep) -> Response:
    """The prompt continued as it is (no chat template), by the owner's engine for the model's base."""
    return await proxy.complete(
        _manager(request), _transport(request), owner, get_settings(), body, "/completions"
    )


@v1_router.get(
    "/v1/models",
    response_model=OpenAIList[Model],
    responses=_V1_ERRORS,
    summary="Models to fine-tune and call: the catalog, your fine-tuned models and their checkpoints",
)
async def list_models(owner: LoopOwnerDep) -> OpenAIList[Model]:
    settings = get_settings()
    models = await in_thread(in_thread_session(lambda s: service.models(s, owner, settings)))
    return listing(models, False, lambda m: m.id)


@v1_router.get(
    "/v1/models/{model:path}", response_model=Model, responses=_V1_ERRORS, summary="Retrieve a model"
)
async def retrieve_model(model: str, owner: LoopOwnerDep) -> Model:
    if len(model) > 512:
        raise invalid("model is too long", "model")
    settings = get_settings()
    return await in_thread(in_thread_session(lambda s: service.find_model(s, owner, settings, model)))


@router.get(
    "",
    response_model=DeploymentList,
    responses={401: UNAUTHORIZED},
    summary="Your engines: base, status, adapters loaded, use",
)
async def list_deployments(owner: LoopOwnerDep) -> DeploymentList:
    """The caller's engines (one per base model; those running, and the last few that ended), each a run
    the scheduler places: its status (queued with the reason it waits, starting, ready, stopping,
    stopped, failed with why), where it runs and on how many devices, the adapters loaded into it, when it
    was asked for, first answered and last used, its device time and the tokens in and out it answered;
    `usage` sums them all. An engine's address is never shown: calls go through `/v1`."""
    return await in_thread(in_thread_session(lambda s: deployed.listing(s, owner)))


@router.delete(
    "/{deployment_id}",
    response_model=Deployment,
    status_code=202,
    responses=owner_errors("No such deployment of yours"),
    summary="Stop one of your engines now",
)
async def stop_deployment(request: Request, deployment_id: str, owner: LoopOwnerDep) -> Deployment:
    """Stop the engine (a queued one is withdrawn at once; a running one is ended by the worker, its
    devices freed and its time counted in /usage): 202 with the deployment as it is now (`stopping`, or
    `stopped`). Stopping one that is over changes nothing. The next call to one of its models asks for a
    new engine. Another owner's deployment is a 404, as one that does not exist."""
    if len(deployment_id) > 64:
        raise NotFound("no such deployment")
    found = await in_thread(in_thread_session(lambda s: deployed.stop(s, owner, deployment_id)))
    if found is None:
        raise NotFound("no such deployment")
    _manager(request).forget(owner, deployment_id)
    return found
