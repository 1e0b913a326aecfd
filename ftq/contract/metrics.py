"""One metric point: what the trainer writes to metrics.jsonl, ingest stores and the API serves."""

from __future__ import annotations

from pydantic import BaseModel, Field

# The columns of a point besides its step, in the order the store and the poll use them.
POINT_FIELDS = ("epoch", "loss", "learning_rate", "grad_norm", "eval_loss", "tokens_per_second", "time")


class Point(BaseModel):
    step: int
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    eval_loss: float | None = None
    tokens_per_second: float | None = None
    time: float | None = None
    extra: dict[str, float] | None = Field(
        None,
        description="The training method's own metrics at this step under TRL's names, e.g. DPO's "
        "`rewards/chosen`, `rewards/rejected`, `rewards/margins`, `rewards/accuracies`, a reward model's "
        "`accuracy`, KTO's `kl`; evaluation's with an `eval_` prefix. Null when the step logged none.",
    )


# What a metric name in `extra` may be (TRL's names: letters, digits, `_`, `/`, `.`, `-`), and how many a
# point keeps: the file is the run's to write, so ingest takes no more than this from it.
EXTRA_NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_./\-]{0,63}$"
MAX_EXTRA = 64
