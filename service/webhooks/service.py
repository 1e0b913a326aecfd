"""The rules of the webhooks API: a receiver's URL is checked (SSRF) and its event types known; the
secret is shown when made and when rotated, never again."""

from __future__ import annotations

from ftq.contract import events as ev
from ftq.contract.schemas import Delivery, DeliveryPage, WebhookCreate, WebhookPublic
from ftq.runtime.settings import Settings
from ftq.store.events import WebhookRepository
from ftq.store.models import Webhook
from service.errors import Conflict, NotFound, spec_field_error


def to_public(hook: Webhook, *, secret: bool = False) -> WebhookPublic:
    return WebhookPublic(
        id=hook.id,
        url=hook.url,
        events=list(hook.events or []),
        secret=hook.secret if secret else None,
        enabled=hook.enabled,
        disabled_reason=hook.disabled_reason,
        created_at=hook.created_at,
    )


def get_or_404(repo: WebhookRepository, webhook_id: str) -> Webhook:
    hook = repo.get(webhook_id)
    if hook is None:
        raise NotFound(f"webhook {webhook_id} not found")
    return hook


def check_events(types: list[str]) -> list[str]:
    for i, t in enumerate(types):
        if t not in ev.EVENT_TYPES:
            raise spec_field_error(
                ["events", i], f"unknown event type {t!r}; one of {', '.join(ev.EVENT_TYPES)}"
            )
    return list(dict.fromkeys(types))


def check_url(url: str, settings: Settings) -> str:
    try:
        ev.check_url(url, development=settings.development, allowlist=settings.webhook_allowed_networks)
    except ev.UnsafeURL as exc:
        raise spec_field_error(["url"], str(exc), "unsafe_url") from None
    return url


def create(repo: WebhookRepository, body: WebhookCreate, settings: Settings) -> WebhookPublic:
    types = check_events(body.events)
    url = check_url(body.url.strip(), settings)
    if repo.count() >= settings.max_webhooks_per_owner:
        raise Conflict(
            f"{repo.owner} already has {settings.max_webhooks_per_owner} webhooks "
            "(FTQ_MAX_WEBHOOKS_PER_OWNER); delete one first"
        )
    hook = repo.add(url=url, events=types, secret=ev.new_secret())
    repo.session.commit()
    return to_public(hook, secret=True)


def rotate_secret(repo: WebhookRepository, webhook_id: str) -> WebhookPublic:
    hook = get_or_404(repo, webhook_id)
    hook.secret = ev.new_secret()
    repo.session.commit()
    return to_public(hook, secret=True)


def enable(repo: WebhookRepository, webhook_id: str) -> WebhookPublic:
    hook = get_or_404(repo, webhook_id)
    repo.enable(hook)
    repo.session.commit()
    return to_public(hook)


def delete(repo: WebhookRepository, webhook_id: str) -> None:
    repo.delete(get_or_404(repo, webhook_id))
    repo.session.commit()


def deliveries(repo: WebhookRepository, webhook_id: str, *, after: int, limit: int) -> DeliveryPage:
    hook = get_or_404(repo, webhook_id)
    data = [
        Delivery(
            id=d.id,
            event_id=d.event_id,
            event_type=event_type,
            job_id=d.job_id,
            webhook_id_header=ev.message_id(d.event_id),
            status=d.status,
            attempts=d.attempts,
            last_status_code=d.last_status_code,
            last_error=d.last_error,
            created_at=d.created_at,
            last_attempt_at=d.last_attempt_at,
            next_attempt_at=d.next_attempt_at,
        )
        for d, event_type in repo.deliveries(hook, after=after, limit=limit)
    ]
    return DeliveryPage(data=data, next_after=data[-1].id if data else after)
