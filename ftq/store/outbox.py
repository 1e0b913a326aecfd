"""Sending dispatch records to the broker. Called after the API commits, and by the worker's relay for
whatever was not sent (broker down, API died between commit and send).

Uploaded files are their own outbox entries: a file row committed `validating` with no
`validation_sent_at` is a validation not sent yet (`send_file_validation`, and the relay)."""

from __future__ import annotations

import logging
from datetime import timedelta

from ftq.runtime import logs, queue
from ftq.store import files_repository, repository
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


def send_file_validation(file_id: str) -> bool:
    """Send the validation of an uploaded file now; False when the broker did not take it (the relay
    sends it later)."""
    try:
        queue.send(queue.TASK_VALIDATE_FILE, file_id)
    except Exception as exc:
        log.warning("validation of file %s not sent yet: %s", file_id, exc)
        return False
    with session_scope() as session:
        files_repository.mark_validation_sent(session, file_id)
    return True


# A validation sent this long ago whose file is still `validating` went down with its worker.
VALIDATION_RESEND_AFTER = timedelta(minutes=10)


def relay_file_validations(older_than: timedelta = timedelta(seconds=2)) -> int:
    with session_scope() as session:
        pending = files_repository.validations_to_send(
            session, older_than=older_than, resend_after=VALIDATION_RESEND_AFTER
        )
    sent = 0
    for file_id in pending:
        if not send_file_validation(file_id):
            break
        sent += 1
    return sent


def relay(older_than: timedelta = timedelta(seconds=2)) -> int:
    """Send every dispatch still unsent after `older_than` (the API normally sends at once), and the
    validations of uploaded files likewise."""
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
    return sent + relay_file_validations(older_than)
