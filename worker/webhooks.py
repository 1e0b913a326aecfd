"""The webhook sender: works off the deliveries the store wrote with each event (the outbox).

A periodic task (`ftq.webhooks`, every FTQ_WEBHOOK_INTERVAL_SECONDS) runs on a queue of its own
(`WEBHOOK_QUEUE`), which `ftq up` consumes in a worker process of its own, so no receiver can take a
thread from submit, cancel, reconcile or ingest. A pass finds the webhooks with deliveries due and drains
each in a thread of its own, under a lock per webhook (one request in flight per endpoint across
workers and passes), at most FTQ_WEBHOOK_SLOTS endpoints at once and FTQ_WEBHOOK_SLOTS_PER_OWNER of one
owner's (the rest wait for the next pass), so one tenant's slow receivers hold up only that tenant's
deliveries. Every request has ONE total deadline, FTQ_WEBHOOK_TIMEOUT_SECONDS, from connect to the
answer's headers (`ftq.runtime.outbound`): a receiver that trickles its answer a byte at a time is cut
off like one that never answers, and a pass lasts at most PASS_SECONDS plus one request. Per webhook and
job, deliveries go out in event order: the store hands out a job's next event only once the one before
it succeeded or gave up.

Each request is signed as Standard Webhooks says (`webhook-id` is the event's stable id, the same on
every retry; `webhook-timestamp`; `webhook-signature: v1,<base64 HMAC-SHA256>`). The address is checked
again before every send (ftq.contract.events.check_url: the name may resolve elsewhere by now), plain-http
requests go to the very address that was checked, and redirects are not followed. What the delivery log
says of a failure is opaque where it could teach a tenant about addresses that are not its receiver's
to tell: a refused address is "not allowed" (no address, no reason), and a receiver at an address that
is not global (allowed by development or the operator's allowlist) is "did not accept" whether its port
was closed, open, silent or answered an error. A failure is retried with exponential backoff and jitter
until FTQ_WEBHOOK_RETRY_TOTAL_SECONDS after the first try; then the delivery fails, and
FTQ_WEBHOOK_DISABLE_AFTER_FAILURES such failures in a row disable the endpoint.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from ftq.contract import events as ev
from ftq.runtime import outbound
from ftq.runtime.settings import Settings, get_settings
from ftq.store import events as store
from ftq.store.db import session_scope
from worker import locks

log = logging.getLogger(__name__)

# One drain of a webhook lasts at most this long (plus one request's deadline); the next pass goes on.
PASS_SECONDS = 10.0
USER_AGENT = "ftq-webhooks/1"
REFUSED = "refused: the receiver's address is not allowed (checked again before each send)"
NOT_ACCEPTED = "the receiver did not accept the delivery (no answer, or not a 2xx answer)"


def payload(due: store.Due) -> bytes:
    """The request body: `{"type", "timestamp", "data": {"event_id", "job_id", "job": {"id", "name",
    "status"}, ...the event's data}}` (the status the job had when the event was written)."""
    # An event that may come after the job ended (job.evaluation) records the job's status in its data.
    status = due.data.get("job_status") or ev.status_at(due.event_type)
    job = {"id": due.job_id, "name": due.job_name, "status": status}
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


def _post(due: store.Due, settings: Settings) -> tuple[int | None, str | None]:
    """(status code, error): one attempt, over by FTQ_WEBHOOK_TIMEOUT_SECONDS. The answer's body is not
    read."""
    try:
        target = ev.check_url(
            due.url, development=settings.development, allowlist=settings.webhook_allowed_networks
        )
    except ev.UnsafeURL as exc:
        log.info("webhook %s: not sent to %s: %s", due.webhook_id, due.url, exc)
        return None, REFUSED
    body = payload(due)
    headers = headers_for(due, body, int(time.time()))
    url = httpx.URL(due.url)
    if target.scheme == "http":
        # To the address just checked, not to a second lookup of the name (DNS rebinding); https keeps
        # the name, whose certificate a rebound address cannot present.
        headers["host"] = url.netloc.decode()
        url = url.copy_with(host=target.addresses[0])
    opaque = not all(_is_global(a) for a in target.addresses)
    try:
        answer = outbound.request(
            "POST", url, content=body, headers=headers, deadline_seconds=settings.webhook_timeout_seconds
        )
    except outbound.OutboundError as exc:
        return None, NOT_ACCEPTED if opaque else f"no answer: {exc}"
    code = answer.status_code
    if 200 <= code < 300:
        return code, None
    if opaque:
        return None, NOT_ACCEPTED
    return code, f"HTTP {code}"


def _is_global(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    inner = ev.embedded_ipv4(ip)
    return (inner or ip).is_global


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
    # The deadline is checked after each request, not before: a webhook chosen for the pass sends at least
    # its first due delivery even when its thread starts after the deadline (a loaded host), so a busy pass
    # cannot leave a chosen endpoint with nothing tried, pass after pass. The pass still ends within one
    # request's deadline of `deadline`.
    sent = 0
    while True:
        with session_scope() as session:
            due = store.due_for(session, webhook_id, datetime.now(UTC))
        if not due:
            return sent
        for d in due:
            code, error = _post(d, settings)
            _settle(d, code, error, settings)
            sent += error is None
            if time.monotonic() >= deadline:
                return sent


def this_pass(hooks: list[tuple[str, str]], slots: int, per_owner: int) -> list[str]:
    """Which of the webhooks with deliveries due this pass drains: at most `per_owner` of one owner's
    (chosen at random, so an owner's slow endpoints do not always go first) and `slots` in all, the
    owners taking turns."""
    by_owner: dict[str, list[str]] = defaultdict(list)
    for hook, owner in hooks:
        by_owner[owner].append(hook)
    queues = []
    for owner_hooks in by_owner.values():
        random.shuffle(owner_hooks)
        queues.append(owner_hooks[:per_owner])
    random.shuffle(queues)
    chosen: list[str] = []
    for turn in range(per_owner):
        for q in queues:
            if turn < len(q) and len(chosen) < slots:
                chosen.append(q[turn])
    return chosen


def send_due(pass_seconds: float = PASS_SECONDS) -> int:
    """One pass (one at a time per store): the chosen webhooks drained in parallel; returns how many
    deliveries succeeded. Lasts at most `pass_seconds` plus one request's deadline."""
    with locks.singleton("webhook-pass") as mine:
        if not mine:
            return 0
        return _send_due(pass_seconds)


def _send_due(pass_seconds: float) -> int:
    settings = get_settings()
    with session_scope() as session:
        due = store.webhooks_with_due(session, datetime.now(UTC))
    hooks = this_pass(due, settings.webhook_slots, settings.webhook_slots_per_owner)
    if not hooks:
        return 0
    deadline = time.monotonic() + pass_seconds
    with ThreadPoolExecutor(max_workers=len(hooks), thread_name_prefix="webhook") as pool:
        results: list[Any] = [pool.submit(drain, h, deadline, settings) for h in hooks]
        total = 0
        for f in results:
            try:
                total += f.result()
            except Exception:
                log.exception("webhook sender pass failed; the next pass tries again")
    return total
