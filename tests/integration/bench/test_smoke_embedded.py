"""The smoke runs of the benches on `ftq up` (SQLite, the embedded broker) or on no server
(tests/integration/bench/smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run_all import Bench
from tests.integration.bench.smoke import EMBEDDED, benches, smoke


@pytest.mark.parametrize("bench", benches(EMBEDDED))
def test_bench_runs(bench: Bench, tmp_path: Path) -> None:
    smoke(bench, tmp_path)
