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
import warnings
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning
from celery.signals import beat_embedded_init, setup_logging

from ftq.runtime import logs
from ftq.runtime.queue import TASK_INGEST, TASK_RECONCILE, TASK_RELAY, TASK_WEBHOOKS, make_celery
from ftq.runtime.settings import get_settings

log = logging.getLogger(__name__)


def _beat_dies_with_its_worker(**_: Any) -> None:
    """Runs in the beat process that `celery worker --beat` forks (beat_embedded_init).

    A worker killed with SIGKILL cannot stop its beat, which then ticks on forever with no parent:
    every restart would add one more, each sending every sweep again, until the queue holds more than
    the workers consume and jobs stay `running` long after their runs end. So the kernel ends the beat
    with its worker (PR_SET_PDEATHSIG).
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


def _configure_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Celery's `setup_logging`: with a receiver connected, Celery leaves the root logger to it, so the
    worker and its embedded beat log in ftq's format, with the job id (`--loglevel`, else FTQ_LOG_LEVEL)."""
    logs.configure(loglevel or get_settings().log_level)


setup_logging.connect(_configure_logging, weak=False)


def make_worker_app() -> Celery:
    """The broker app of `ftq.runtime.queue` with the worker's tasks and the periodic sweeps."""
    settings = get_settings()
    app = make_celery(settings, include=["worker.tasks"])
    app.conf.update(
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
            "webhooks": {
                "task": TASK_WEBHOOKS,
                "schedule": settings.webhook_interval_seconds,
                "options": {"expires": max(5.0, 5 * settings.webhook_interval_seconds)},
            },
        }
    )
    return app


# Celery's multi-line warning is about pickle, which ftq does not accept (json only); a worker as root
# is how FTQ_RUN_AS_USER runs jobs as other users, and docs/operating/security.md says how to run one
# without it.
warnings.filterwarnings(
    "ignore", message="You're running the worker with superuser", category=SecurityWarning
)

celery_app = make_worker_app()
