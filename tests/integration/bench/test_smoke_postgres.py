"""The smoke runs of the benches on PostgreSQL (tests/integration/bench/smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run_all import Bench
from tests.integration.bench.smoke import POSTGRES, benches, smoke

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize("bench", benches(POSTGRES))
def test_bench_runs(bench: Bench, tmp_path: Path) -> None:
    smoke(bench, tmp_path)
