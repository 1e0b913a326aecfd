"""The Celery app. Tasks are short (submit, cancel, reconcile, ingest, relay); a run never lives in one.

Broker: `FTQ_BROKER_URL` (Redis in production); by default kombu's filesystem transport in the data
dir, which needs no server. Every task is safe to run twice (state changes are compare-and-set in
the store) and none needs to survive its worker: a lost submit or cancel is redone by the periodic
reconcile, a lost sweep by the next one. So tasks are acknowledged early: with late acks, a worker
holding unacknowledged messages when Redis drops hits a kombu bug while restoring them
(AttributeError in `_connparams`) and stops consuming for good.
"""

from __future__ import annotations

from celery import Celery

from ftq.settings import get_settings

TASK_SUBMIT = "ftq.submit"
TASK_CANCEL = "ftq.cancel"
TASK_RECONCILE = "ftq.reconcile"
TASK_INGEST = "ftq.ingest"
TASK_RELAY = "ftq.relay"


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("ftq", broker=settings.celery_broker_url, include=["worker.tasks"])
    transport_options: dict[str, object] = {}
    if settings.uses_embedded_broker:
        folder = settings.data_path / "broker"
        (folder / "queue").mkdir(parents=True, exist_ok=True)
        (folder / "processed").mkdir(parents=True, exist_ok=True)
        (folder / "control").mkdir(parents=True, exist_ok=True)
        transport_options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # Otherwise kombu puts its broadcast exchange files in ./control of whatever cwd it has.
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": 0.1,
        }
    else:
        transport_options = {"visibility_timeout": 3600}
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        enable_utc=True,
        worker_hijack_root_logger=False,
        # A sweep that waited in the queue past a few of its intervals is stale: the next one is coming.
        beat_schedule={
            "relay": {
                "task": TASK_RELAY,
                "schedule": max(1.0, settings.reconcile_interval_seconds),
                "options": {"expires": max(5.0, 5 * settings.reconcile_interval_seconds)},
            },
            "reconcile": {
                "task": TASK_RECONCILE,
                "schedule": settings.reconcile_interval_seconds,
                "options": {"expires": max(5.0, 5 * settings.reconcile_interval_seconds)},
            },
            "ingest": {
                "task": TASK_INGEST,
                "schedule": settings.ingest_interval_seconds,
                "options": {"expires": max(5.0, 5 * settings.ingest_interval_seconds)},
            },
        },
    )
    return app


celery_app = make_celery()
