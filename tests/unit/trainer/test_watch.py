"""trainer.watch: NaN and spike warnings, stopping on NaN, the straggler warning, warnings.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from trainer.watch import STRAGGLER_STEPS, DivergedError, Watch, raise_if_diverged, write_warnings


def kinds(warnings: list[dict[str, object]]) -> list[object]:
    return [w["kind"] for w in warnings]


def test_nan_loss_warns_once_and_marks_the_run_diverged() -> None:
    watch = Watch()
    assert watch.observe(1, 2.0, None) == []
    first = watch.observe(2, math.nan, None)
    assert kinds(first) == ["nan_loss"] and "step 2" in str(first[0]["message"])
    assert watch.diverged_at == 2
    assert watch.observe(3, math.inf, None) == []  # the same episode
    assert watch.diverged_at == 2


def test_nan_without_stop_on_nan_warns_and_trains_on() -> None:
    watch = Watch(stop_on_nan=False)
    assert kinds(watch.observe(1, math.inf, None)) == ["nan_loss"]
    assert watch.diverged_at is None
    watch.observe(2, 1.0, None)
    assert kinds(watch.observe(3, math.nan, None)) == ["nan_loss"]  # a new episode after a finite loss


def test_loss_spike_over_the_factor_of_the_median() -> None:
    watch = Watch(spike_factor=4.0)
    for step, loss in enumerate([2.0, 1.9, 1.8, 1.7, 1.6, 1.5], start=1):
        assert watch.observe(step, loss, None) == []
    assert watch.observe(7, 6.0, None) == []  # 6.0 < 4 x median 1.75
    spike = watch.observe(8, 50.0, None)
    assert kinds(spike) == ["loss_spike"] and spike[0]["step"] == 8
    assert watch.observe(9, 60.0, None) == []  # still the same spike
    assert watch.observe(10, 1.5, None) == []
    assert kinds(watch.observe(11, 80.0, None)) == ["loss_spike"]
    assert watch.diverged_at is None


def test_no_spike_warnings_when_the_factor_is_off() -> None:
    watch = Watch(spike_factor=None)
    for step in range(1, 10):
        watch.observe(step, 1.0, None)
    assert watch.observe(10, 1e6, None) == []


def test_straggler_after_several_slow_logging_steps() -> None:
    watch = Watch()
    for step in range(1, 8):
        assert watch.observe(step, 1.0, 1000.0) == []
    out = []
    for i in range(STRAGGLER_STEPS):
        out = watch.observe(8 + i, 1.0, 300.0)
        if i < STRAGGLER_STEPS - 1:
            assert out == []
    assert kinds(out) == ["straggler"]
    assert watch.observe(20, 1.0, 300.0) == []  # said once per episode
    watch.observe(21, 1.0, 1000.0)
    # One slow step alone is no straggler.
    assert watch.observe(22, 1.0, 100.0) == []


def test_warnings_file_and_the_diverged_error(tmp_path: Path) -> None:
    write_warnings(tmp_path / runs.WARNINGS, [{"kind": "nan_loss", "step": 3, "message": "the loss is nan"}])
    lines = (tmp_path / runs.WARNINGS).read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "nan_loss" and "time" in json.loads(lines[0])
    watch = Watch()
    raise_if_diverged(watch, tmp_path)  # nothing diverged: returns
    watch.observe(3, math.nan, None)
    try:
        raise_if_diverged(watch, tmp_path)
    except DivergedError as err:
        assert err.code == ErrorCode.diverged
        assert err.line().startswith("ftq-error: diverged: ") and "step 3" in err.line()
    else:
        raise AssertionError("a diverged run must raise")


def test_an_exploding_loss_stops_the_run_after_several_steps() -> None:
    watch = Watch(spike_factor=4.0)
    # The run's first loss is the baseline: 4x of it for EXPLODE_STEPS logging steps in a row diverges.
    losses = [6.4, 14.9, 22.7, 94.6, 20.0, 58.2, 30.4, 38.3]
    out = [watch.observe(step, loss, None) for step, loss in enumerate(losses, start=1)]
    assert watch.diverged_at == 8
    flat = [w for ws in out for w in ws]
    assert [w["kind"] for w in flat] == ["loss_exploding"] and flat[0]["step"] == 8
    calm = Watch(spike_factor=4.0, stop_on_nan=False)
    for step, loss in enumerate([6.4, 30.0, 30.0, 30.0], start=1):
        calm.observe(step, loss, None)
    assert calm.diverged_at is None  # warned, trains on
