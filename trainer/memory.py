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
    # Without a reset the peak may predate this phase: then the figure is only an upper bound. With
    # freed blocks going back to the kernel (return_freed_blocks_to_os), the RSS read after the reset
    # can sit a few KiB above the peak the kernel kept: the phase then raised the peak by nothing, not
    # by "-1 MiB" (which the lines' readers, `+N MiB`, would not find).
    bound = "" if reset else "at most "
    log.info(
        "rank %s %s: peak RSS %s+%d MiB (RSS %d -> %d MiB)",
        rank,
        phase,
        bound,
        max(0, peak - before) // 1024,
        before // 1024,
        after // 1024,
    )


# glibc's mallopt parameter number for the mmap threshold (malloc.h).
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20


def return_freed_blocks_to_os(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of `threshold` bytes or more with its own mmap, so that freeing it gives the
    memory back to the kernel at once; True when set.

    glibc's default threshold moves: each freed mmapped block up to 32 MiB raises it to that block's size,
    so from then on such blocks come from the heap, and a heap only shrinks from its top. FSDP's loading
    (a full tensor received per parameter, then only its shard kept) and each step's all-gathers free
    blocks of 1-32 MiB between ones that live on: measured on a 532M model, two CPU ranks, that kept
    0.6 GiB of freed memory resident on rank 1, above rank 0. A fixed threshold also ends the moving.
    An operator's own MALLOC_MMAP_THRESHOLD_ wins; no-op off glibc.
    """
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
