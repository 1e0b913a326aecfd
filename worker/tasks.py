"""The Celery tasks, registered under the names in `ftq.runtime.queue`. Each is short and safe to run twice;
the
work is in `worker.controller` (submit, cancel, reconcile), `worker.ingest`, `worker.files` (validating
an upload) and the store's outbox."""

from __future__ import annotations

from ftq.runtime.queue import (
    TASK_CANCEL,
    TASK_DEPLOYMENTS,
    TASK_EVALUATIONS,
    TASK_EXPORTS,
    TASK_INGEST,
    TASK_RECONCILE,
    TASK_RELAY,
    TASK_SUBMIT,
    TASK_TRAINING_CLIENTS,
    TASK_VALIDATE_FILE,
    TASK_WEBHOOKS,
)
from ftq.store import outbox, repository
from ftq.store.db import session_scope
from worker import controller, files, locks, webhooks
from worker.celery_app import celery_app
from worker.ingest import ingest_all


@celery_app.task(name=TASK_SUBMIT)
def submit(job_id: str) -> None:
    controller.submit(job_id)


@celery_app.task(name=TASK_CANCEL)
def cancel(job_id: str) -> None:
    controller.cancel(job_id)


@celery_app.task(name=TASK_EXPORTS)
def export(job_id: str) -> None:
    controller.exports_changed(job_id)


@celery_app.task(name=TASK_EVALUATIONS)
def evaluation(job_id: str) -> None:
    controller.evaluations_changed(job_id)


@celery_app.task(name=TASK_DEPLOYMENTS)
def deployment(deployment_id: str) -> None:
    controller.deployments_changed(deployment_id)


@celery_app.task(name=TASK_TRAINING_CLIENTS)
def training_client(model_id: str) -> None:
    controller.training_clients_changed(model_id)


@celery_app.task(name=TASK_RECONCILE)
def reconcile() -> None:
    controller.reconcile()


@celery_app.task(name=TASK_INGEST)
def ingest() -> None:
    with locks.singleton("ingest") as mine:
        if mine:
            ingest_all()


@celery_app.task(name=TASK_RELAY)
def relay() -> None:
    with locks.singleton("relay") as mine:
        if not mine:
            return
        outbox.relay()
        files.sweep_partials()
        with session_scope() as session:
            repository.purge_expired_idempotency(session)


@celery_app.task(name=TASK_WEBHOOKS)
def send_webhooks() -> None:
    webhooks.send_due()


@celery_app.task(name=TASK_VALIDATE_FILE)
def validate_file(file_id: str) -> None:
    files.validate(file_id)
