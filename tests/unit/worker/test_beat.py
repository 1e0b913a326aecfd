"""The beat's scheduler (worker/beat.py) sleeps until an entry is due instead of spinning on it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from celery.beat import Scheduler as CeleryScheduler
from celery.schedules import schedule

from worker.beat import Scheduler


def _scheduler(cls: type[CeleryScheduler], clock: Callable[[], datetime]) -> CeleryScheduler:
    app = Celery("beat-test", set_as_current=False)
    app.conf.result_expires = None  # no backend-cleanup entry beside the sweep
    every_second = schedule(timedelta(seconds=1), nowfun=clock)
    app.conf.beat_schedule = {"sweep": {"task": "sweep", "schedule": every_second}}
    return cls(app)


@pytest.mark.parametrize("cls", [Scheduler, CeleryScheduler], ids=["ftq", "celery"])
def test_an_entry_due_in_5_ms_is_slept_on_for_5_ms(cls: type[CeleryScheduler]) -> None:
    # A fixed clock: the entry last ran at t0 and runs every second; the beat ticks at t0 + 0.995 s.
    t0 = datetime(2026, 12, 7, 3, 0, 0, 500_000, tzinfo=UTC)
    now = [t0]
    scheduler = _scheduler(cls, lambda: now[0])
    now[0] = t0 + timedelta(seconds=0.995)
    delay = scheduler.tick()
    if cls is Scheduler:
        assert delay == pytest.approx(0.005, abs=1e-6)
    else:
        # Celery's own takes 10 ms off: a negative delay, which its beat loop does not sleep on, so it
        # ticks again at once until the entry is due (why worker/beat.py exists; if this changes, the
        # subclass can go).
        assert delay is not None and delay <= 0
