"""ftq.runtime.limits: SLURM's time forms in seconds, and the operator's cap."""

from __future__ import annotations

import pytest

from ftq.runtime.limits import max_seconds, slurm_time_seconds
from ftq.runtime.settings import Settings


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 30 * 60),  # minutes alone
        ("30:15", 30 * 60 + 15),  # M:S
        ("36:00:00", 36 * 3600),  # H:M:S
        ("2-12", (2 * 24 + 12) * 3600),  # D-H
        ("2-12:30", (2 * 24 + 12) * 3600 + 30 * 60),  # D-H:M
        ("160-00:00:00", 160 * 24 * 3600),  # D-H:M:S
    ],
)
def test_slurm_time_forms(value: str, seconds: int) -> None:
    assert slurm_time_seconds(value) == seconds


def test_the_cap_in_seconds() -> None:
    assert max_seconds(Settings(max_time_limit_hours=168)) == 7 * 24 * 3600
    assert max_seconds(Settings(max_time_limit_hours=0.5)) == 1800
