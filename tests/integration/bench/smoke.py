"""The suite's smoke runs of the benches (bench/run_all.py's `smoke_argv`; `python -m bench.run_all --smoke`
runs the same, and those the suite leaves out): each bench's smallest run, once, exits 0 and prints its
RESULT lines. Not timings: no figure is compared with anything. Two modules, so that two xdist workers can
share them (a module is a group, tests/harness/groups.py): the benches on PostgreSQL, and those on `ftq
up` or no server. The benches that train (trainer, grpo, dispatch, startup, evaluate, fault_campaign) or
start vLLM engines (serving) are left out; run_all.BENCHES says why each (`suite_skip`)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from bench.run_all import BENCHES, Bench, run_bench

POSTGRES = frozenset({"poll", "ingest", "load", "scheduler"})
EMBEDDED = frozenset(
    {"up", "openai", "artifacts", "graders", "submit", "beat", "samples_accelerate", "tinker"}
)


def benches(keys: frozenset[str]) -> list[object]:
    """The benches named, as pytest parameters with their key as id."""
    return [pytest.param(b, id=b.key) for b in BENCHES if b.key in keys and not b.suite_skip]


def smoke(b: Bench, out: Path) -> None:
    """Run `b`'s smoke argv, its scratch folders under `out` (a test's tmp_path, not bench/out)."""
    missing = [tool for tool in b.needs if shutil.which(tool) is None]
    if missing:
        # A skip would leave the bench unproven where CI runs: .ci/run installs what the benches need.
        pytest.fail(f"{b.key} needs {', '.join(missing)} on PATH (apt-get install {' '.join(missing)})")
    ran = run_bench(b, "smoke", smoke_out=out)
    assert ran.failure is None, f"{b.key}: {ran.failure}"
    assert ran.rows, f"{b.key}: no RESULT line"
    assert all(math.isfinite(r.value) for r in ran.rows), [(r.name, r.value) for r in ran.rows]
