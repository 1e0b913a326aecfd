"""The webhook sender: works off the deliveries the store wrote with each event (the outbox).

A periodic task (`ftq.webhooks`, every FTQ_WEBHOOK_INTERVAL_SECONDS) finds the webhooks with deliveries
due and drains each in a thread of its own, under a lock per webhook (one sender per endpoint across
workers and passes), so a slow or dead receiver holds up only itself: not another endpoint (the next
pass drains the others while it is still being waited for), not the API (which never sends) and not
the controller (other tasks, other threads). Per webhook and job, deliveries go out in event order:
the store hands out a job's next event only once the one before it succeeded or gave up.

Each request is signed as Standard Webhooks says (`webhook-id` is the event's stable id, the same on
every retry; `webhook-timestamp`; `webhook-signature: v1,<base64 HMAC-SHA256>`). The address is checked
again before every send (ftq.contract.events.check_url: the name may resolve elsewhere by now), plain-http
requests go to the very address that was checked, and redirects are not followed. A failure is retried
with exponential backoff and jitter until FTQ_WEBHOOK_RETRY_TOTAL_SECONDS after the first try; then the
delivery fails, and FTQ_WEBHOOK_DISABLE_AFTER_FAILURES such failures in a row disable the endpoint.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from ftq.contract import events as ev
from ftq.runtime.settings import Settings, get_settings
from ftq.store import events as store
from ftq.store.db import session_scope
from worker import locks

log = logging.getLogger(__name__)

# One drain of a webhook lasts at most this long (plus one request's timeout); the next pass goes on.
PASS_SECONDS = 10.0
MAX_THREADS = 8
USER_AGENT = "ftq-webhooks/1"


def payload(due: store.Due) -> bytes:
    """The request body: `{"type", "timestamp", "data": {"event_id", "job_id", "job": {"id", "name",
    "status"}, ...the event's data}}` (the status the job had when the event was written)."""
    job = {"id": due.job_id, "name": due.job_name, "status": ev.status_at(due.event_type)}
    body = {
        "type": due.event_type,
        "timestamp": due.event_time.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "data": {**due.data, "event_id": due.event_id, "job_id": due.job_id, "job": job},
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def headers_for(due: store.Due, body: bytes, now: int) -> dict[str, str]:
    msg_id = ev.message_id(due.event_id)
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(now),
        "webhook-signature": ev.sign(due.secret, msg_id, now, body),
    }


def _post(client: httpx.Client, due: store.Due, settings: Settings) -> tuple[int | None, str | None]:
    """(status code, error): one attempt. The body of the answer is not read."""
    try:
        target = ev.check_url(
            due.url, development=settings.development, allowlist=settings.webhook_allowed_networks
        )
    except ev.UnsafeURL as exc:
        return None, f"refused: {exc}"
    body = payload(due)
    headers = headers_for(due, body, int(time.time()))
    url = httpx.URL(due.url)
    if target.scheme == "http":
        # To the address just checked, not to a second lookup of the name (DNS rebinding); https keeps
        # the name, whose certificate a rebound address cannot present.
        headers["host"] = url.netloc.decode()
        url = url.copy_with(host=target.addresses[0])
    try:
        with client.stream("POST", url, content=body, headers=headers) as response:
            code = response.status_code
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if 200 <= code < 300:
        return code, None
    return code, f"HTTP {code}"


def _settle(due: store.Due, code: int | None, error: str | None, settings: Settings) -> None:
    now = datetime.now(UTC)
    with session_scope() as session:
        if error is None and code is not None:
            store.delivery_succeeded(session, due, now, code)
            return
        attempts = due.attempts + 1
        delay = ev.retry_delay(
            attempts, base=settings.webhook_retry_base_seconds, cap=settings.webhook_retry_max_delay_seconds
        )
        first = due.first_attempt_at or now
        if (now - first).total_seconds() + delay > settings.webhook_retry_total_seconds:
            disabled = store.delivery_failed(
                session,
                due,
                now,
                code,
                error or "failed",
                disable_after=settings.webhook_disable_after_failures,
            )
            log.warning(
                "webhook %s: delivery of event %s failed after %d attempts (%s)%s",
                due.webhook_id,
                due.event_id,
                attempts,
                error,
                "; the webhook is now disabled" if disabled else "",
            )
        else:
            store.delivery_retry(session, due, now, code, error or "failed", delay)
            log.info(
                "webhook %s: event %s not delivered (%s); retry in %.1fs",
                due.webhook_id,
                due.event_id,
                error,
                delay,
            )


def drain(webhook_id: str, deadline: float, settings: Settings) -> int:
    """Send this webhook's due deliveries, each job's in order, until none is due or time is up."""
    with locks.singleton(f"webhook:{webhook_id}") as mine:
        if not mine:
            return 0  # a sender is draining it now (perhaps waiting on a slow receiver)
        return _drain(webhook_id, deadline, settings)


def _drain(webhook_id: str, deadline: float, settings: Settings) -> int:
    sent = 0
    timeout = httpx.Timeout(settings.webhook_timeout_seconds)
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        while time.monotonic() < deadline:
            with session_scope() as session:
                due = store.due_for(session, webhook_id, datetime.now(UTC))
            if not due:
                break
            for d in due:
                if time.monotonic() >= deadline:
                    break
                code, error = _post(client, d, settings)
                _settle(d, code, error, settings)
                sent += error is None
    return sent


def send_due(pass_seconds: float = PASS_SECONDS) -> int:
    """One pass: every webhook with due deliveries drained in parallel; returns how many succeeded."""
    settings = get_settings()
    with session_scope() as session:
        hooks = store.webhooks_with_due(session, datetime.now(UTC))
    if not hooks:
        return 0
    deadline = time.monotonic() + pass_seconds
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(hooks)), thread_name_prefix="webhook") as pool:
        results: list[Any] = [pool.submit(drain, h, deadline, settings) for h in hooks]
        total = 0
        for f in results:
            try:
                total += f.result()
            except Exception:
                log.exception("webhook sender pass failed; the next pass tries again")
    return total
