"""One metric point: what the trainer writes to metrics.jsonl, ingest stores and the API serves."""

from __future__ import annotations

from pydantic import BaseModel

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
