"""The webhooks API's models: defined in the core (`ftq.contract.schemas`), shared with the client SDK."""

from __future__ import annotations

from ftq.contract.schemas import (
    Delivery,
    DeliveryPage,
    ErrorBody,
    WebhookCreate,
    WebhookList,
    WebhookPayload,
    WebhookPublic,
)

__all__ = [
    "Delivery",
    "DeliveryPage",
    "ErrorBody",
    "WebhookCreate",
    "WebhookList",
    "WebhookPayload",
    "WebhookPublic",
]
