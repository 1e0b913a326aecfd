"""Host memory of this rank around the phases that can run a node out of RAM (loading, the final save).

A 70B job's ranks share one node's RAM: if each of 8 ranks reads the full weights, or rank 0 gathers the
frozen base for a LoRA save, the node swaps or the OOM killer ends the job. train.log says, per rank,
how much each phase raised the peak resident set, so an operator sees it before it bites at scale.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Its own logger: every rank logs its memory (the other ranks log only warnings otherwise).
log = logging.getLogger("trainer.memory")

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB; (0, 0) where /proc has no such fields (not Linux)."""
    fields: dict[str, int] = {}
    try:
        for line in _STATUS.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    except OSError:
        return 0, 0
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the next reading is this phase's own peak."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@contextmanager
def peak_rss(phase: str) -> Iterator[None]:
    """Log how far this phase raised the rank's peak RSS above what it held when the phase began.

    The line reads `rank R <phase>: peak RSS +N MiB (RSS A -> B MiB)`; tests and operators grep it.
    """
    rank = os.environ.get("RANK", "0")
    reset = _reset_peak()
    before, _ = rss_kib()
    yield
    after, peak = rss_kib()
    # Without a reset the peak may predate this phase: then the figure is only an upper bound.
    bound = "" if reset else "at most "
    log.info(
        "rank %s %s: peak RSS %s+%d MiB (RSS %d -> %d MiB)",
        rank,
        phase,
        bound,
        (peak - before) // 1024,
        before // 1024,
        after // 1024,
    )
