"""metrics.jsonl: one Point per logging step and per evaluation, written as the trainer logs.

Each line is a JSON object with the contract's Point fields (step, epoch, loss, learning_rate,
grad_norm, eval_loss, tokens_per_second, time), null where that step did not log a field, plus
`max_steps` so the service can show progress and an ETA, `extra` (the method's metrics under TRL's
names, such as `rewards/margins` for DPO or `accuracy` for a reward model; absent when there are
none), and `tokens_seen` (the input tokens trained on so far, all ranks; the service does not read
it). Only the main process writes, and each line is flushed at once, so the worker's ingest can tail
the file while training runs. The main process also logs the point to train.log as one line a person
reads (step, loss, lr, grad norm, tokens/s, eta, and a preference method's margin and accuracy).

tokens_per_second is the tokens of the steps since the last logged point over the training time they
took: evaluation and checkpoint writing pause the clock and the token count together, so a save or an
eval between two logging steps neither inflates nor dilutes the next rate.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

POINT_FIELDS = (
    "step",
    "epoch",
    "loss",
    "learning_rate",
    "grad_norm",
    "eval_loss",
    "tokens_per_second",
    "time",
)


def metrics_callback(path: Path) -> Any:
    """A TrainerCallback writing `path`; built here so that importing this module stays light."""
    from transformers import TrainerCallback

    class MetricsJsonlCallback(MetricsWriter, TrainerCallback):
        pass

    return MetricsJsonlCallback(path)


class MetricsWriter:
    """The callback's logic: appends Points to `path`; on resume the file keeps its earlier lines."""

    def __init__(self, path: Path):
        self.path = path
        self._last_time: float | None = None
        self._last_tokens = 0
        self._started: tuple[float, int] | None = None  # (time, step) of the first step, for the ETA
        self.last_point: dict[str, Any] | None = None  # what trainer.watch reads the throughput from

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            note = checkpointing_in_use(kwargs.get("model"))
            if note is not None:
                # What the model's layers really run, not what a flag asked for (train.log, for people).
                logging.getLogger("trainer").info("activation checkpointing: %s", note)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._last_time is None:
            # Start the throughput clock at the first step, after loading and (on resume) skipping.
            self._restart_clock(state)
        if self._started is None:
            self._started = (time.time(), int(state.global_step))

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart_clock(state)  # evaluation time is not training throughput

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._restart_clock(state)  # nor is checkpoint writing

    def _restart_clock(self, state: Any) -> None:
        # The tokens of steps before a pause were trained before the clock restarted: they leave the
        # count with it, or the next rate would divide them by the time of the steps after the pause.
        self._last_time = time.time()
        self._last_tokens = int(state.num_input_tokens_seen)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        logs = logs or {}
        is_train, is_eval = "loss" in logs, "eval_loss" in logs
        if not (is_train or is_eval):
            return  # the end-of-training summary (train_runtime, ...) is not a Point
        now = time.time()
        point: dict[str, Any] = dict.fromkeys(POINT_FIELDS)
        point.update(step=state.global_step, epoch=_num(logs.get("epoch", state.epoch)), time=now)
        if is_train:
            point.update(
                loss=_num(logs.get("loss")),
                learning_rate=_num(logs.get("learning_rate")),
                grad_norm=_num(logs.get("grad_norm")),
                tokens_per_second=self._tokens_per_second(state, now),
            )
        if is_eval:
            point["eval_loss"] = _num(logs.get("eval_loss"))
        extra = method_metrics(logs)
        if extra:
            point["extra"] = extra
        point["max_steps"] = state.max_steps
        point["tokens_seen"] = int(state.num_input_tokens_seen)
        self.last_point = point
        if state.is_world_process_zero:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(point) + "\n")
                f.flush()
            logging.getLogger("trainer").info("%s", self.line(point, now))

    def line(self, point: dict[str, Any], now: float) -> str:
        """The point for train.log, as
        `step 11/40  loss 2.3450  lr 1.00e-03  grad norm 0.520  1,234 tokens/s  eta 0:00:12`."""
        max_steps = point.get("max_steps")
        parts = [f"step {point['step']}" + (f"/{max_steps}" if max_steps and max_steps > 0 else "")]
        for key, label, fmt in (
            ("loss", "loss", "{:.4f}"),
            ("learning_rate", "lr", "{:.2e}"),
            ("grad_norm", "grad norm", "{:.3f}"),
            ("eval_loss", "eval loss", "{:.4f}"),
        ):
            if point.get(key) is not None:
                parts.append(f"{label} {fmt.format(point[key])}")
        extra = point.get("extra") or {}
        for key, label in (
            ("rewards/margins", "margin"),
            ("rewards/accuracies", "reward acc"),
            ("accuracy", "acc"),
        ):
            if key in extra:
                parts.append(f"{label} {extra[key]:.4f}")
        if point.get("tokens_per_second") is not None:
            parts.append(f"{point['tokens_per_second']:,.0f} tokens/s")
        eta = self._eta(int(point["step"]), max_steps, now)
        if eta is not None:
            parts.append(f"eta {eta}")
        return "  ".join(parts)

    def _eta(self, step: int, max_steps: int | None, now: float) -> str | None:
        if self._started is None or not max_steps or max_steps <= step:
            return None
        t0, step0 = self._started
        if step <= step0 or now <= t0:
            return None
        seconds = round((max_steps - step) * (now - t0) / (step - step0))
        return str(datetime.timedelta(seconds=seconds))

    def _tokens_per_second(self, state: Any, now: float) -> float | None:
        tokens = int(state.num_input_tokens_seen)
        if self._last_time is None or now <= self._last_time or tokens <= self._last_tokens:
            return None
        rate = (tokens - self._last_tokens) / (now - self._last_time)
        self._last_time, self._last_tokens = now, tokens
        return round(rate, 2)


# What a log holds besides a Point's own fields that is no training metric: Trainer's bookkeeping.
NOT_METRICS = frozenset(
    {
        "epoch",
        "step",
        "total_flos",
        "num_input_tokens_seen",
        "train_runtime",
        "train_samples_per_second",
        "train_tokens_per_second",
        "eval_tokens_per_second",
        "train_steps_per_second",
        "train_loss",
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
    }
)
MAX_EXTRA = 64  # the most method metrics one point keeps (TRL logs about 15)


def method_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """The method's own metrics in a log, under TRL's names (`rewards/margins`, `rewards/accuracies`,
    `accuracy`, `kl`, `mean_token_accuracy`; evaluation's with `eval_` in front): every finite number
    that is not one of the Point's fields or Trainer's bookkeeping."""
    fixed = set(POINT_FIELDS) | {"eval_loss"}
    extra: dict[str, float] = {}
    for key, value in logs.items():
        if key in fixed or key in NOT_METRICS or isinstance(value, bool) or len(extra) >= MAX_EXTRA:
            continue
        number = _num(value) if isinstance(value, int | float) else None
        if number is not None:
            extra[key] = number
    return extra


def checkpointing_in_use(model: Any) -> str | None:
    """`reentrant` or `non-reentrant`, read from the checkpoint function transformers gave the layers;
    None when no layer checkpoints."""
    if model is None:
        return None
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and func is not None:
            reentrant = getattr(func, "keywords", {}).get("use_reentrant", True)  # torch's default
            return "reentrant" if reentrant else "non-reentrant"
    return None


def _num(value: Any) -> float | None:
    """JSON has no NaN or Infinity: such a value is logged as null."""
    if value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def read_points(path: Path) -> list[dict[str, Any]]:
    """The Points in a metrics.jsonl, skipping a torn last line (a run killed mid-write)."""
    points: list[dict[str, Any]] = []
    if not path.exists():
        return points
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return points
