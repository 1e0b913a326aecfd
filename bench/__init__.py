"""Benchmarks: `make bench` (python -m bench.run_all) runs them and writes bench/RESULTS.md.

Run each from the repository root as `python -m bench.<name>`. Deployments, databases and processes come
from the test harness (tests/harness: Deployment, postgres.database, free_port); what is the benches'
own is here (the RESULT/NOTE line protocol, see bench/run_all.py), in seed.py (bulk loading of jobs
and points into PostgreSQL with COPY) and in wrk.py (load runs that report throughput, latency
percentiles and the server's CPU per request).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"


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
