"""The Celery tasks. Each is short and safe to run twice; the work is in `worker.reconcile`."""

from __future__ import annotations

import logging

from worker import reconcile as runtime
from worker.celery_app import TASK_CANCEL, TASK_INGEST, TASK_RECONCILE, TASK_RELAY, TASK_SUBMIT, celery_app

log = logging.getLogger(__name__)


@celery_app.task(name=TASK_SUBMIT)
def submit(job_id: str) -> None:
    runtime.submit(job_id)


@celery_app.task(name=TASK_CANCEL)
def cancel(job_id: str) -> None:
    runtime.cancel(job_id)


@celery_app.task(name=TASK_RECONCILE)
def reconcile() -> None:
    runtime.reconcile()


@celery_app.task(name=TASK_INGEST)
def ingest() -> None:
    from worker import store
    from worker.ingest import ingest_all

    with store.singleton("ingest") as mine:
        if mine:
            ingest_all()


@celery_app.task(name=TASK_RELAY)
def relay() -> None:
    from service.db import session_scope
    from service.jobs import dispatch, repository
    from worker import store

    with store.singleton("relay") as mine:
        if not mine:
            return
        dispatch.relay()
        with session_scope() as session:
            repository.purge_expired_idempotency(session)
