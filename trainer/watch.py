"""Training that watches itself: a NaN or infinite loss, a loss spike, a run slowing down.

At each logging step `Watch.observe` looks at the loss the trainer logged (the mean over all ranks, so
every rank decides the same) and the throughput the metrics writer measured:

- a NaN or infinite loss: a `nan_loss` warning; with `training.stop_on_nan` (the default) the run stops
  at once, saves nothing more (the last checkpoint is the last good one) and ends with error code
  `diverged`;
- a loss above `training.loss_spike_factor` times the median of the last `SPIKE_WINDOW` logged losses
  (after `SPIKE_MIN_POINTS` of them): a `loss_spike` warning;
- a loss above `training.loss_spike_factor` times the run's first logged loss for `EXPLODE_STEPS`
  logging steps in a row: the loss is exploding (a learning rate far too high), a `loss_exploding`
  warning, and with `training.stop_on_nan` the run stops as for a NaN, with error code `diverged`;
- tokens per second below `STRAGGLER_FRACTION` of the run's own median for `STRAGGLER_STEPS` logging
  steps in a row: a `straggler` warning (a slow node, a throttled GPU, a noisy neighbour).

A warning is said once per episode: the next of its kind comes after the run was back to normal. Each is
a line in `warnings.jsonl` in the run directory (ftq.contract.runs.WARNINGS; the service makes it a
job.warning
event) and a warning line in train.log.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.errors import ErrorCode

from .errors import FtqError

log = logging.getLogger("trainer")

SPIKE_WINDOW = 50
SPIKE_MIN_POINTS = 5
EXPLODE_STEPS = 3
STRAGGLER_FRACTION = 0.5
STRAGGLER_STEPS = 3
STRAGGLER_MIN_POINTS = 5


class DivergedError(FtqError):
    code: ErrorCode = ErrorCode.diverged


@dataclass
class Watch:
    """The decisions, without I/O: `observe` returns the warnings of one logging step."""

    spike_factor: float | None = 4.0  # training.loss_spike_factor
    stop_on_nan: bool = True
    diverged_at: int | None = None
    _losses: deque[float] = field(default_factory=lambda: deque(maxlen=SPIKE_WINDOW))
    _rates: list[float] = field(default_factory=list)
    _slow_steps: int = 0
    _in_spike: bool = False
    _first_loss: float | None = None
    _high_steps: int = 0
    _in_nan: bool = False
    _straggling: bool = False

    def observe(self, step: int, loss: float | None, tokens_per_second: float | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if loss is not None:
            out.extend(self._loss(step, loss))
        if tokens_per_second is not None and math.isfinite(tokens_per_second):
            out.extend(self._rate(step, tokens_per_second))
        return out

    def _loss(self, step: int, loss: float) -> list[dict[str, Any]]:
        if not math.isfinite(loss):
            if self.stop_on_nan and self.diverged_at is None:
                self.diverged_at = step
            if self._in_nan:
                return []
            self._in_nan = True
            then = "stopping the run (training.stop_on_nan)" if self.stop_on_nan else "training on"
            return [
                {
                    "kind": "nan_loss",
                    "step": step,
                    "value": str(loss),
                    "message": f"the loss is {loss} at step {step}; {then}",
                }
            ]
        self._in_nan = False
        out: list[dict[str, Any]] = self._exploding(step, loss)
        if self.spike_factor and len(self._losses) >= SPIKE_MIN_POINTS:
            median = statistics.median(self._losses)
            spiking = median > 0 and loss > self.spike_factor * median
            if spiking and not self._in_spike:
                out.append(
                    {
                        "kind": "loss_spike",
                        "step": step,
                        "value": loss,
                        "median": median,
                        "message": f"the loss jumped to {loss:.4g} at step {step}, over "
                        f"{self.spike_factor:g}x the median {median:.4g} of the last {len(self._losses)} "
                        "logged (training.loss_spike_factor); a lower learning_rate or more warmup may help",
                    }
                )
            self._in_spike = spiking
            if spiking:
                return out  # a spike does not move the baseline it is measured against
        self._losses.append(loss)
        return out

    def _exploding(self, step: int, loss: float) -> list[dict[str, Any]]:
        if self._first_loss is None:
            self._first_loss = loss
            return []
        if not self.spike_factor or self._first_loss <= 0:
            return []
        high = loss > self.spike_factor * self._first_loss
        self._high_steps = self._high_steps + 1 if high else 0
        if self._high_steps != EXPLODE_STEPS:
            return []
        then = "stopping the run (training.stop_on_nan)" if self.stop_on_nan else "training on"
        if self.stop_on_nan and self.diverged_at is None:
            self.diverged_at = step
        return [
            {
                "kind": "loss_exploding",
                "step": step,
                "value": loss,
                "message": f"the loss has been over {self.spike_factor:g}x its first value "
                f"{self._first_loss:.4g} for {EXPLODE_STEPS} logging steps (now {loss:.4g} at step {step}): "
                f"it is diverging; {then}",
            }
        ]

    def _rate(self, step: int, rate: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if len(self._rates) >= STRAGGLER_MIN_POINTS:
            median = statistics.median(self._rates)
            slow = rate < STRAGGLER_FRACTION * median
            self._slow_steps = self._slow_steps + 1 if slow else 0
            if self._slow_steps >= STRAGGLER_STEPS and not self._straggling:
                self._straggling = True
                out.append(
                    {
                        "kind": "straggler",
                        "step": step,
                        "value": rate,
                        "median": median,
                        "message": f"throughput {rate:,.0f} tokens/s at step {step} has been under "
                        f"{STRAGGLER_FRACTION:.0%} of this run's median {median:,.0f} for {self._slow_steps} "
                        "logging steps: a slow node or a throttled GPU?",
                    }
                )
            elif not slow:
                self._straggling = False
        self._rates.append(rate)
        return out


def write_warnings(path: Path, warnings: list[dict[str, Any]]) -> None:
    if not warnings:
        return
    with path.open("a", encoding="utf-8") as f:
        for w in warnings:
            f.write(json.dumps({**w, "time": time.time()}) + "\n")
            log.warning("ftq-warning: %s: %s", w["kind"], w["message"])
        f.flush()


def watch_callback(watch: Watch, out: Path, metrics_writer: Any) -> Any:
    """A TrainerCallback feeding `watch` from each logging step; built here so importing stays light.

    Runs after the metrics writer, whose last point holds the step's throughput. On every rank the
    logged loss is the same (the trainer gathers it), so every rank stops at the same step.
    """
    from transformers import TrainerCallback

    class WatchCallback(TrainerCallback):
        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
        ) -> Any:
            logs = logs or {}
            if "loss" not in logs:
                return control
            try:
                loss: float | None = float(logs["loss"])
            except (TypeError, ValueError):
                loss = None
            point = getattr(metrics_writer, "last_point", None) or {}
            rate = point.get("tokens_per_second") if point.get("step") == state.global_step else None
            warnings = watch.observe(int(state.global_step), loss, rate)
            if state.is_world_process_zero:
                write_warnings(out / runs.WARNINGS, warnings)
            if watch.diverged_at is not None:
                # Stop now, and do not save this step's weights: they are what produced the NaN.
                control.should_save = False
                control.should_evaluate = False
                control.should_training_stop = True
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            # A save between two logging steps: the weights themselves are looked at first.
            if (
                control.should_save
                and watch.stop_on_nan
                and watch.diverged_at is None
                and not weights_finite(kwargs.get("model"), args.device)
            ):
                watch.diverged_at = int(state.global_step)
                if state.is_world_process_zero:
                    write_warnings(
                        out / runs.WARNINGS,
                        [
                            {
                                "kind": "nan_loss",
                                "step": int(state.global_step),
                                "value": "nan",
                                "message": f"the weights hold NaN or infinite values at step "
                                f"{state.global_step}; stopping the run (training.stop_on_nan) without "
                                "saving them",
                            }
                        ],
                    )
            if watch.diverged_at is not None:
                control.should_save = False
                control.should_training_stop = True
            return control

    return WatchCallback()


def weights_finite(model: Any, device: Any) -> bool:
    """Whether every trainable parameter is finite on every rank (one all-reduce: all ranks agree)."""
    if model is None:
        return True
    import torch
    import torch.distributed as dist

    ok = all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.requires_grad and p.numel())
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = bool(flag.item())
    return ok


def raise_if_diverged(watch: Watch, out: Path) -> None:
    """After `trainer.train()`: a run stopped for a NaN or exploding loss ends as `diverged`, naming its
    last good checkpoint."""
    if watch.diverged_at is None:
        return
    ckpt = runs.latest_checkpoint(out)
    where = (
        f"the last checkpoint before it is {ckpt.path.relative_to(out)} (step {ckpt.step})"
        if ckpt is not None
        else "no checkpoint was saved before it"
    )
    raise DivergedError(
        f"the loss diverged (NaN, infinite or exploding) by step {watch.diverged_at} and the run was "
        f"stopped (training.stop_on_nan); {where}. Lower training.learning_rate, raise warmup_ratio, keep "
        "max_grad_norm on, or use mixed_precision bf16 instead of fp16"
    )
