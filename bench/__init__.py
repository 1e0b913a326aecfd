"""Benchmarks: `make bench` (python -m bench.run_all) runs them and writes bench/RESULTS.md.

Run each from the repository root as `python -m bench.<name>`. Deployments, databases and processes come
from the test harness (tests/harness: Deployment, postgres.database, free_port); what is the benches'
own is here (the RESULT/NOTE line protocol, see bench/run_all.py), in seed.py (bulk loading of jobs
and points into PostgreSQL with COPY) and in wrk.py (load runs that report throughput, latency
percentiles and the server's CPU per request).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Where the benches leave their scratch folders and output: bench/out, or FTQ_BENCH_OUT (the suite's smoke
# runs point it at a test's own temporary folder, bench/run_all.py's run_bench).
OUT = Path(os.environ.get("FTQ_BENCH_OUT") or REPO / "bench" / "out")


def scratch(prefix: str) -> Path:
    """A new folder under bench/out for one bench's deployment or data (left there to look at afterwards)."""
    OUT.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=OUT))


def result(name: str, value: float, unit: str, **extra: Any) -> None:
    """Print one figure for run_all: `RESULT <name> <value> <unit> [key=value ...]`."""
    fields = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
    print(f"RESULT {name} {value:.6g} {unit} {fields}".rstrip(), flush=True)


def note(text: str) -> None:
    """A sentence run_all copies under the table (how a figure was measured, what was skipped)."""
    print(f"NOTE {' '.join(text.split())}", flush=True)


def log(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def alternated(rounds: int, names: list[str], measure: Callable[[str, int], float]) -> dict[str, float]:
    """measure(name, round) for each name once a round, in the given order in even rounds and the reverse
    in odd ones so that none always runs first; the median of each name's figures over the rounds."""
    values: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            values[name].append(measure(name, round_))
            log(f"round {round_ + 1}: {name} {values[name][-1]:.2f}")
    return {name: statistics.median(v) for name, v in values.items()}


def rounds_argument(doc: str, default: int = 3) -> int:
    """`--rounds N` of a bench that alternates its runs (see `alternated`), the first paragraph of `doc`
    as its description."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=default)
    return int(parser.parse_args().rounds)


def offline_run_env() -> dict[str, str]:
    """The environment a bench's trainer process runs in: this checkout importable, no hub, one thread."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(REPO)
    return env


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User+system CPU of `argv` to its end (one child at a time: RUSAGE_CHILDREN's difference)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=REPO, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
