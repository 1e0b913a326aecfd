"""The queue between the API and the worker: the task names, and the Celery app's broker settings.

The API sends tasks by name (`send`), so it never imports the worker; the worker registers its tasks
under the same names and adds the periodic schedule (`worker.celery_app`).

Broker: `FTQ_BROKER_URL` (Redis in production); by default kombu's filesystem transport in the data
dir (`ftq.runtime.fsbroker`), which needs no server.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from celery import Celery

from ftq.runtime.settings import Settings, get_settings

log = logging.getLogger(__name__)

TASK_SUBMIT = "ftq.submit"
TASK_CANCEL = "ftq.cancel"
TASK_RECONCILE = "ftq.reconcile"
TASK_INGEST = "ftq.ingest"
TASK_RELAY = "ftq.relay"
# Start or cancel a job's exports now rather than at the next sweep (its argument is the job id).
TASK_EXPORTS = "ftq.exports"
# Start or cancel a job's evaluations now (its argument is the job id).
TASK_EVALUATIONS = "ftq.evaluations"
# Start or stop deployments (serving engines) now: its argument is the deployment's id (the outbox's
# dispatches are about jobs; a lost one is done by the next reconcile sweep).
TASK_DEPLOYMENTS = "ftq.deployments"
# Start or stop Tinker training clients now: its argument is the model id.
TASK_TRAINING_CLIENTS = "ftq.training_clients"
TASK_WEBHOOKS = "ftq.webhooks"
# The queues: every task on Celery's default one but the webhook sender's, which has its own so that
# its own worker process (`ftq up` starts one; `ftq worker --queues`) sends webhooks: a slow receiver
# can then never take a thread that submit, cancel, reconcile or ingest needs.
DEFAULT_QUEUE = "celery"
WEBHOOK_QUEUE = "ftq.webhooks"
ALL_QUEUES = (DEFAULT_QUEUE, WEBHOOK_QUEUE)
# Validate an uploaded file (POST /files): validating -> ready | invalid.
TASK_VALIDATE_FILE = "ftq.validate_file"

# The outbox's dispatch kinds and the task each is sent as.
TASK_FOR_DISPATCH = {
    "submit": TASK_SUBMIT,
    "cancel": TASK_CANCEL,
    "export": TASK_EXPORTS,
    "evaluation": TASK_EVALUATIONS,
}


def _survive_broker_loss() -> None:
    """Keep consuming after Redis drops (kombu 5.x bug).

    When the connection is lost, kombu closes the channel and restores the unacknowledged messages
    through a client of the connection it has just released (`'NoneType' object has no attribute
    'hostname'` in `_connparams`). Celery takes that for an unrecoverable error and the worker stops
    consuming while its process stays up. Not restoring them is harmless here: Redis hands them out
    again after the visibility timeout, and reconcile redoes whatever a lost task was for.
    """
    from kombu.transport import redis as kombu_redis

    original = kombu_redis.QoS.restore_unacked
    if getattr(original, "_ftq_patched", False):
        return

    def restore_unacked(self: Any, client: Any = None) -> Any:
        try:
            return original(self, client)
        except (AttributeError, *kombu_redis.Transport.connection_errors) as exc:
            log.warning(
                "broker connection lost with %d unacknowledged message(s) (%s); "
                "they come back after the visibility timeout",
                len(self._delivered),
                exc,
            )
            self._delivered.clear()
            return None

    restore_unacked._ftq_patched = True  # type: ignore[attr-defined]
    kombu_redis.QoS.restore_unacked = restore_unacked  # type: ignore[method-assign]


def make_celery(settings: Settings | None = None, *, include: list[str] | None = None) -> Celery:
    """A Celery app connected to the configured broker; the worker passes the modules of its tasks."""
    settings = settings or get_settings()
    app = Celery("ftq", broker=settings.celery_broker_url, include=include or [])
    transport_options: dict[str, object] = {}
    if settings.uses_embedded_broker:
        from ftq.runtime.fsbroker import Transport

        # kombu's filesystem transport, but a consumer never reads a message file half written.
        app.conf.broker_transport = Transport
        folder = settings.state_path("broker")
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
        if settings.celery_broker_url.startswith(("redis://", "rediss://", "unix://")):
            _survive_broker_loss()
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
        task_default_queue=DEFAULT_QUEUE,
        task_routes={TASK_WEBHOOKS: {"queue": WEBHOOK_QUEUE}},
    )
    return app


@lru_cache
def producer() -> Celery:
    """The app the API and the outbox relay send with (no tasks of its own)."""
    return make_celery()


def send(task: str, object_id: str) -> None:
    """Send one task by name with its one argument (a job or file id). retry=False: with the broker down
    this fails fast, and the outbox's relay sends it later."""
    producer().send_task(task, args=[object_id], retry=False)
