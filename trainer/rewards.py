"""GRPO's reward: the spec's grader (`training.grader`) as one TRL reward function.

TRL calls the function on every rank with that rank's completions (num_generations per prompt) and the
dataset columns of their rows. It scores them with ftq.grading, the code `POST /graders/run` uses: a
python grader runs once per batch in a sandboxed child process (ftq.grading.sandbox under bubblewrap: no
network, no environment, none of the run's files, CPU-time, memory, process, output and wall-clock limits
from the operator's FTQ_GRADER_* settings, which the worker passes to the run), started as the user the
run runs as. Where the sandbox cannot start on the node, the run ends with `grader_error` naming the fix.
A grader that raises, hangs or exceeds a limit ends the run with `grader_error` naming the grader and the
limit.

TRL logs the returned rewards as `rewards/<grader name>/mean` and `/std` (and `reward`, `reward_std`);
a multi grader's own graders are logged beside them as `rewards/<name>/<sub>/mean` and `/std`. On the
main process a few rollouts (prompt, completion, reward) of each logging step go to samples.jsonl, which
GET /jobs/{id}/samples serves (indices from ROLLOUT_INDEX on, after the spec's sample prompts).

ftq.grading imports only the contract and the standard library (an import-linter contract), which is why
the trainer, allowed nothing else of the core, may use it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from ftq.contract.errors import ErrorCode
from ftq.contract.graders import MultiGrader
from ftq.contract.spec import MAX_SAMPLE_PROMPTS
from ftq.grading import model as score_model
from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits
from ftq.grading.score import score_batch
from ftq.sandbox import SandboxUnavailable

from .data import ITEM_COLUMN
from .errors import FtqError

log = logging.getLogger("trainer")

# Samples' indices 0..MAX_SAMPLE_PROMPTS-1 are the spec's sample prompts; rollouts come after them.
ROLLOUT_INDEX = MAX_SAMPLE_PROMPTS
# The operator's sandbox limits, set by the worker from its FTQ_GRADER_* settings.
LIMIT_ENV = {
    "cpu_seconds": ("FTQ_GRADER_CPU_SECONDS", int),
    "memory_mb": ("FTQ_GRADER_MEMORY_MB", int),
    "timeout_seconds": ("FTQ_GRADER_TIMEOUT_SECONDS", float),
    "processes": ("FTQ_GRADER_PROCESSES", int),
    "python": ("FTQ_GRADER_PYTHON", str),
    "bwrap": ("FTQ_SANDBOX_BWRAP", str),
}


class GraderFailed(FtqError):
    """A grader raised, hung or exceeded a sandbox limit while scoring the run's completions."""

    code: ErrorCode = ErrorCode.grader_error


def limits_from_env(env: dict[str, str] | None = None) -> Limits:
    """The sandbox's limits from the run's environment (ftq.grading.sandbox's defaults where unset). The
    child runs as this process's user: the run user, where the operator set FTQ_RUN_AS_USER."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    for field, (name, kind) in LIMIT_ENV.items():
        if env.get(name):
            values[field] = kind(env[name])
    return Limits(**values)


def text_of(value: Any) -> str:
    """A prompt or completion as text: a string as is, a conversation's last turn's content."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        content = value[-1].get("content")
        return content if isinstance(content, str) else json.dumps(content)
    return json.dumps(value)


class GraderReward:
    """The callable TRL calls; its `__name__` (the grader's name) is what TRL logs the rewards under."""

    def __init__(
        self,
        grader: Any,
        limits: Limits,
        *,
        rollouts_path: Path | None = None,
        rollouts_per_log: int = 0,
        logging_steps: int = 1,
    ) -> None:
        self.grader = grader
        self.limits = limits
        self.__name__ = grader.name
        self.rollouts_path = rollouts_path
        self.rollouts_per_log = rollouts_per_log
        self.logging_steps = max(1, logging_steps)
        self._recorded: set[int] = set()

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: Any = None,
        trainer_state: Any = None,
        log_metric: Any = None,
        **columns: Any,
    ) -> list[float]:
        items = [json.loads(raw) if isinstance(raw, str) else {} for raw in columns.get(ITEM_COLUMN) or []]
        if len(items) != len(completions):
            items = [{} for _ in completions]
        samples = [{"output_text": text_of(c), "output_json": None} for c in completions]
        try:
            results = score_batch(self.grader, samples, items, self.limits, score_model.generate)
        except GraderError as e:
            limit = f" (limit: {e.limit})" if e.limit else ""
            raise GraderFailed(f"{e.message}{limit}; try it with POST /graders/run before training") from None
        except SandboxUnavailable as e:
            # Refused, never scored outside the sandbox: the message names the fix for this host.
            raise GraderFailed(str(e)) from None
        rewards = [r.reward for r in results]
        if isinstance(self.grader, MultiGrader) and log_metric is not None:
            for name in self.grader.graders:
                values = [r.sub_rewards[name] for r in results]
                mean, std = _mean_std(values)
                log_metric(f"rewards/{self.__name__}/{name}/mean", mean)
                log_metric(f"rewards/{self.__name__}/{name}/std", std)
        step = int(getattr(trainer_state, "global_step", 0)) + 1  # the step these completions train
        self._record(step, prompts, completions, rewards)
        return rewards

    def _record(self, step: int, prompts: list[Any], completions: list[Any], rewards: list[float]) -> None:
        """A few rollouts of a logging step into samples.jsonl (main process only, flushed)."""
        if (
            self.rollouts_path is None
            or self.rollouts_per_log == 0
            or step in self._recorded
            or (step != 1 and step % self.logging_steps != 0)
        ):
            return
        self._recorded.add(step)
        now = time.time()
        with self.rollouts_path.open("a", encoding="utf-8") as f:
            for i in range(min(self.rollouts_per_log, len(completions))):
                record = {
                    "step": step,
                    "index": ROLLOUT_INDEX + i,
                    "prompt": text_of(prompts[i]),
                    "completion": text_of(completions[i]),
                    "reward": rewards[i],
                    "time": now,
                }
                f.write(json.dumps(record) + "\n")
            f.flush()


def _mean_std(values: list[float]) -> tuple[float, float]:
    # TRL's nanstd: the sample standard deviation (n - 1).
    if len(values) < 2:
        return (values[0] if values else 0.0), 0.0
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
