"""trainer.memory.return_freed_blocks_to_os: freed large blocks leave the process (glibc's mmap threshold)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import REPO

# 64 blocks of 8 MiB written and freed between small blocks that live on, as FSDP's loading frees each
# full tensor it received and keeps the shard; the process's RSS after, in MiB.
PROBE = """
import ctypes, sys
if sys.argv[1] == "fixed":
    from trainer.memory import return_freed_blocks_to_os
    assert return_freed_blocks_to_os()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
MIB = 1 << 20
libc.free(libc.malloc(8 * MIB))  # glibc's default: freeing an mmapped block raises its threshold to it
blocks, kept = [], []
for _ in range(64):
    blocks.append(libc.malloc(8 * MIB)); ctypes.memset(blocks[-1], 1, 8 * MIB)
    kept.append(libc.malloc(64 * 1024)); ctypes.memset(kept[-1], 1, 64 * 1024)
for block in blocks:
    libc.free(block)
print(next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmRSS")))
"""


def rss_after(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc are Linux's")
def test_freed_blocks_leave_the_process_once_the_threshold_is_fixed() -> None:
    dynamic, fixed = rss_after("dynamic"), rss_after("fixed")
    assert dynamic > 400, dynamic  # glibc alone keeps the 512 MiB freed between the small blocks
    assert fixed < 100, fixed


def test_a_phase_whose_rss_fell_below_the_kept_peak_raised_it_by_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The RSS read after the reset 300 KiB above the peak the kernel reports at the end (freed blocks went
    # back): the line says +0 MiB, which the readers' `\+(\d+) MiB` finds (it said "+-1 MiB").
    import logging

    from trainer import memory

    reads = iter([(2_000_000, 2_000_000), (1_500_000, 1_999_700)])
    monkeypatch.setattr(memory, "rss_kib", lambda: next(reads))
    monkeypatch.setattr(memory, "_reset_peak", lambda: True)
    with caplog.at_level(logging.INFO, logger="trainer.memory"), memory.peak_rss("final save"):
        pass
    assert "rank 0 final save: peak RSS +0 MiB (RSS 1953 -> 1464 MiB)" in caplog.text
