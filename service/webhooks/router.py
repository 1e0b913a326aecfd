"""HTTP routes for webhooks: register, list, get, delete, rotate the secret, enable, the delivery log."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Response

from ftq.contract.schemas import (
    DeliveryPage,
    WebhookCreate,
    WebhookList,
    WebhookPayload,
    WebhookPublic,
)
from ftq.store.events import WebhookRepository
from service.deps import OwnerDep, SessionDep, SettingsDep
from service.routes import UNAUTHORIZED, error, id_in_path, owner_errors
from service.webhooks import service

router = APIRouter(prefix="/webhooks", tags=["webhooks"])


def _repo(session: SessionDep, owner: OwnerDep) -> WebhookRepository:
    return WebhookRepository(session, owner)


RepoDep = Annotated[WebhookRepository, Depends(_repo)]
WebhookId = Annotated[str, id_in_path("Webhook id, e.g. wh_0123456789abcdef")]

_ERRORS = owner_errors("No such webhook for this owner")
_Route = TypeVar("_Route", bound=Callable[..., Any])


@router.post(
    "",
    status_code=201,
    response_model=WebhookPublic,
    responses={
        400: {"description": "The body does not parse as JSON"},
        401: UNAUTHORIZED,
        409: error("FTQ_MAX_WEBHOOKS_PER_OWNER reached"),
        422: {"description": "An unknown event type, or a URL that is not allowed (names the field)"},
    },
    summary="Register a webhook (its secret is in this answer only)",
)
def create_webhook(
    body: WebhookCreate, repo: RepoDep, settings: SettingsDep, response: Response
) -> WebhookPublic:
    hook = service.create(repo, body, settings)
    response.headers["Location"] = f"/webhooks/{hook.id}"
    return hook


@router.get("", response_model=WebhookList, responses={401: UNAUTHORIZED}, summary="The owner's webhooks")
def list_webhooks(repo: RepoDep) -> WebhookList:
    return WebhookList(data=[service.to_public(h) for h in repo.list()])


@router.get("/{webhook_id}", response_model=WebhookPublic, responses=_ERRORS, summary="Get a webhook")
def get_webhook(webhook_id: WebhookId, repo: RepoDep) -> WebhookPublic:
    return service.to_public(service.get_or_404(repo, webhook_id))


@router.delete(
    "/{webhook_id}", status_code=204, responses=_ERRORS, summary="Delete a webhook and its deliveries"
)
def delete_webhook(webhook_id: WebhookId, repo: RepoDep) -> Response:
    service.delete(repo, webhook_id)
    return Response(status_code=204)


def _action(name: str, summary: str) -> Callable[[_Route], _Route]:
    """POST /webhooks/{id}/<name>: an action on one webhook of the owner's, answered with the webhook."""
    return router.post(
        f"/{{webhook_id}}/{name}", response_model=WebhookPublic, responses=_ERRORS, summary=summary
    )


@_action(
    "rotate-secret",
    "Replace the signing secret (the new one is in this answer only; the old one stops at once)",
)
def rotate_secret(webhook_id: WebhookId, repo: RepoDep) -> WebhookPublic:
    return service.rotate_secret(repo, webhook_id)


@_action(
    "enable", "Enable a webhook the server disabled after failures; its waiting deliveries are sent again"
)
def enable_webhook(webhook_id: WebhookId, repo: RepoDep) -> WebhookPublic:
    return service.enable(repo, webhook_id)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=DeliveryPage,
    responses=_ERRORS,
    summary="The delivery log: each event's status code, attempts and next attempt",
)
def list_deliveries(
    webhook_id: WebhookId,
    repo: RepoDep,
    after: int = Query(0, ge=0, le=2**63 - 1, description="Only deliveries with an id above this."),
    limit: int = Query(100, ge=1, le=1000),
) -> DeliveryPage:
    return service.deliveries(repo, webhook_id, after=after, limit=limit)


def add_webhook_docs(app: FastAPI) -> None:
    """What ftq sends to a webhook's URL, in the OpenAPI document's `webhooks` section."""

    @app.webhooks.post(
        "job-event", summary="A job event, delivered to each webhook that subscribes to its type"
    )
    def job_event(
        body: WebhookPayload,
        webhook_id: Annotated[
            str, Header(description="`evt_<event id>`: the same on every retry; deduplicate on it")
        ],
        webhook_timestamp: Annotated[str, Header(description="Unix seconds of this attempt")],
        webhook_signature: Annotated[
            str,
            Header(
                description='`v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">`, keyed '
                "with the base64-decoded part of the secret after `whsec_` (Standard Webhooks)"
            ),
        ],
    ) -> None:
        """Answer 2xx to acknowledge. Anything else, or no answer within FTQ_WEBHOOK_TIMEOUT_SECONDS, is
        retried with exponential backoff and jitter for FTQ_WEBHOOK_RETRY_TOTAL_SECONDS; a job's events
        come in order (the next waits until this one succeeded or gave up)."""
