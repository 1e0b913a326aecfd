"""Sending dispatch records to the broker. Called after the API commits, and by the worker's relay for
whatever was not sent (broker down, API died between commit and send)."""

from __future__ import annotations

import logging
from datetime import timedelta

from ftq import logs, queue
from ftq.store import repository
from ftq.store.db import session_scope

log = logging.getLogger(__name__)


def _send(job_id: str, kind: str) -> None:
    queue.send(queue.TASK_FOR_DISPATCH[kind], job_id)


@logs.about_job
def send_for_job(job_id: str) -> int:
    """Send this job's unsent dispatches now; returns how many went out."""
    sent = 0
    with session_scope() as session:
        pending = [(d.id, d.kind) for d in repository.pending_dispatches_for(session, job_id)]
    for dispatch_id, kind in pending:
        try:
            _send(job_id, kind)
        except Exception as exc:  # broker unreachable: the relay will try again
            log.warning("dispatch %s of %s not sent yet: %s", kind, job_id, exc)
            with session_scope() as session:
                repository.mark_dispatch_failed(session, dispatch_id)
            continue
        with session_scope() as session:
            repository.mark_dispatch_sent(session, dispatch_id)
        sent += 1
    return sent


def relay(older_than: timedelta = timedelta(seconds=2)) -> int:
    """Send every dispatch still unsent after `older_than` (the API normally sends at once)."""
    with session_scope() as session:
        pending = [
            (d.id, d.job_id, d.kind) for d in repository.unsent_dispatches(session, older_than=older_than)
        ]
    sent = 0
    for dispatch_id, job_id, kind in pending:
        try:
            _send(job_id, kind)
        except Exception as exc:
            log.warning("relay: broker still unreachable (%s)", exc)
            break
        with session_scope() as session:
            repository.mark_dispatch_sent(session, dispatch_id)
        sent += 1
    return sent
