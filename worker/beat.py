"""The periodic scheduler that `ftq worker --beat` and `ftq up` run: Celery's in-memory scheduler without
its busy wait.

Celery's `Scheduler.adjust` takes 10 ms off every delay, so the beat wakes each entry 10 ms early and
finds it not yet due. For the last 10 ms before every run the entry is then rescheduled at a negative
delay, which the beat loop does not sleep on: it ticks again at once, about 150 times a second with ftq's
four sweeps every second: 1.02 CPU-s a minute of an idle beat process against 0.24 here, for the same
sweeps sent (`python -m bench.beat_bench`; 3,020 ticks in 20 s against 99). Here a delay is the one the
schedule asks for: the beat sleeps until the entry is due and runs it a few milliseconds late at
most (a sleep's overshoot), which nothing periodic in ftq minds.
"""

from __future__ import annotations

from celery.beat import Scheduler as CeleryScheduler


class Scheduler(CeleryScheduler):
    """`--scheduler worker.beat:Scheduler` (the schedule lives in memory, as with Celery's own)."""

    def adjust(self, n: float | None, drift: float = 0.0) -> float | None:
        # Celery's: `n + drift` with drift -0.010 for any positive n, so a delay under 10 ms is negative.
        return n
