"""The Celery app. Tasks are short (submit, cancel, reconcile, ingest, relay); a run never lives in one.

Broker: `FTQ_BROKER_URL` (Redis in production); by default kombu's filesystem transport in the data
dir, which needs no server. Every task is safe to run twice (state changes are compare-and-set in
the store) and none needs to survive its worker: a lost submit or cancel is redone by the periodic
reconcile, a lost sweep by the next one. So tasks are acknowledged early, and a message left
unacknowledged when Redis drops is not worth a worker that stops consuming (see
`_survive_broker_loss`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.signals import beat_embedded_init

from ftq.settings import get_settings

log = logging.getLogger(__name__)

TASK_SUBMIT = "ftq.submit"
TASK_CANCEL = "ftq.cancel"
TASK_RECONCILE = "ftq.reconcile"
TASK_INGEST = "ftq.ingest"
TASK_RELAY = "ftq.relay"


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
            log.warning("broker connection lost with %d unacknowledged message(s) (%s); "
                        "they come back after the visibility timeout", len(self._delivered), exc)
            self._delivered.clear()
            return None

    restore_unacked._ftq_patched = True  # type: ignore[attr-defined]
    kombu_redis.QoS.restore_unacked = restore_unacked  # type: ignore[method-assign]


def _beat_dies_with_its_worker(**_: Any) -> None:
    """Runs in the beat process that `celery worker --beat` forks (beat_embedded_init).

    A worker killed with SIGKILL cannot stop its beat, which then ticks on forever with no parent:
    every restart adds one more, each sending every sweep again. On the embedded broker they flooded
    the queue (40,000 messages after 25 worker kills) until nothing was consumed in time and jobs
    stayed `running` long after their runs ended. The kernel now ends the beat with its worker.
    """
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != _LOADED_BY_PID:
        os._exit(0)  # the worker died before the line above took effect


# The process that imported this module: in the beat (forked by billiard), the worker it belongs to.
_LOADED_BY_PID = os.getpid()


beat_embedded_init.connect(_beat_dies_with_its_worker, weak=False)


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("ftq", broker=settings.celery_broker_url, include=["worker.tasks"])
    transport_options: dict[str, object] = {}
    if settings.uses_embedded_broker:
        from worker.fsbroker import Transport

        # kombu's filesystem transport, but a consumer never reads a message file half written.
        app.conf.broker_transport = Transport
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
