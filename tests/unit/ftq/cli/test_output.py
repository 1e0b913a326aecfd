"""What the CLI prints for a job's events and its log lines: each event a sentence numbered within its job
(never a raw dict, never the server's id, which runs across every job), and each line of train.log with a
prefix short enough for 80 columns (the time; the level and the logger only where they say something)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ftq.cli.output import EventCount, LogLines, fmt_event
from ftq.client import Event


def _event(type_: str, data: dict[str, Any], id_: int = 7) -> Event:
    return Event(id=id_, job_id="job_1", type=type_, time=datetime.now(UTC), data=data)


@pytest.mark.parametrize(
    ("type_", "data", "line"),
    [
        ("job.created", {"name": "tiny"}, "event 3  job.created  as tiny"),
        ("job.queued", {"position": 1}, "event 3  job.queued  position 1 in the queue"),
        (
            "job.started",
            {"launcher": "local", "host": "vm", "external_id": None, "slurm_job_id": None, "pid": 11017,
             "num_nodes": 1, "processes_per_node": 2, "attempt": 0},
            "event 3  job.started  local on vm, 1 node(s) x 2 process(es), pid 11017",
        ),
        (
            "job.checkpoint",
            {"step": 20, "path": "checkpoints/checkpoint-20"},
            "event 3  job.checkpoint  at step 20: saved checkpoints/checkpoint-20",
        ),
        (
            "job.eval",
            {"step": 20, "metrics": {"eval_loss": 6.046294689178467}},
            "event 3  job.eval  at step 20: eval_loss 6.046",
        ),
        (
            "job.evaluation",
            {"evaluation_id": "eval_1", "checkpoint": "20", "step": 20, "status": "succeeded",
             "metrics": {"qa/score": 0.08083333333333333, "held/loss": 6.049802146350356},
             "job_status": "running",
             "best_checkpoint": {"step": 20, "metric": "qa/score", "value": 0.08083}},
            "event 3  job.evaluation  checkpoint 20 succeeded: held/loss 6.05, qa/score 0.08083 (the best)",
        ),
        (
            "job.evaluation",
            {"evaluation_id": "eval_3", "checkpoint": "40", "step": 40, "status": "succeeded",
             "metrics": {"qa/score": 0.07724}, "job_status": "succeeded",
             "best_checkpoint": {"step": 20, "metric": "qa/score", "value": 0.08083}},
            "event 3  job.evaluation  checkpoint 40 succeeded: qa/score 0.07724; best: step 20",
        ),
        (
            "job.evaluation",
            {"evaluation_id": "eval_2", "checkpoint": "final", "step": None, "status": "failed",
             "metrics": {}, "job_status": "succeeded", "best_checkpoint": None},
            "event 3  job.evaluation  final/ failed",
        ),
        (
            "job.warning",
            {"kind": "straggler", "step": 23, "message": "throughput fell"},
            "event 3  job.warning  straggler at step 23: throughput fell",
        ),
        ("job.retried", {"attempt": 1, "reason": "node lost"}, "event 3  job.retried  retry 1: node lost"),
        ("job.paused", {"step": 7, "checkpoint": 6}, "event 3  job.paused  at step 7; resumes from step 6"),
        ("job.resumed", {"checkpoint": None}, "event 3  job.resumed  from the start"),
        ("job.succeeded", {}, "event 3  job.succeeded"),
        (
            "job.failed",
            {"error": {"code": "out_of_memory", "message": "CUDA out of memory", "exit_code": 1}},
            "event 3  job.failed  out_of_memory: CUDA out of memory (exit code 1)",
        ),
        ("job.future", {"a": 1, "b": {"x": 0.5}}, "event 3  job.future  a 1, b x 0.5"),
    ],
)  # fmt: skip
def test_each_event_is_a_sentence(type_: str, data: dict[str, Any], line: str) -> None:
    shown = fmt_event(_event(type_, data), 3)
    assert shown == line
    assert "{" not in shown and "=" not in shown


def test_events_are_numbered_within_their_job_not_by_the_servers_id() -> None:
    count = EventCount()
    lines = [count.line(_event("job.succeeded", {}, id_)) for id_ in (41, 57, 90)]
    assert lines == ["event 1  job.succeeded", "event 2  job.succeeded", "event 3  job.succeeded"]
    assert count.after == 90  # the cursor of the next read is still the server's id


def test_log_lines_get_a_prefix_that_fits_80_columns() -> None:
    lines = LogLines()
    raw = [
        "2026-12-07 20:59:38,091 trainer INFO strategy ddp (DistributedType.MULTI_CPU), 2 process(es)",
        "2026-12-07 20:59:38,832 trainer.memory INFO rank 1 loading: peak RSS +8 MiB (RSS 459 -> 467 MiB)",
        "2026-12-07 20:59:54,555 trainer INFO step 39/40  loss 5.8438  lr 6.16e-06  grad norm 1.163  "
        "3,023 tokens/s  eta 0:00:00",
        "2026-12-07 20:59:46,666 trainer INFO step 20/40  eval loss 6.0463  eta 0:00:05",
        "2026-12-07 20:59:48,285 trainer WARNING ftq-warning: straggler: throughput fell",
        "Traceback (most recent call last):",
        "2026-12-08 00:00:01,002 trainer INFO step 40/40  loss 5.8598  lr 1.54e-06  grad norm 0.964  "
        "3,175 tokens/s",
        "2026-12-08 00:00:02,100 trainer INFO trained to step 40 in 14.0s",
        "2026-12-08 00:00:03,000 INFO trainer.evaluate: scored 20 rows",
    ]
    assert [lines.short(line) for line in raw] == [
        "20:59:38 strategy ddp (DistributedType.MULTI_CPU), 2 process(es)",
        "20:59:38 trainer.memory rank 1 loading: peak RSS +8 MiB (RSS 459 -> 467 MiB)",
        # The step line loses its eta (the follow's bar shows the eta as it is now) and fits 80 columns.
        "20:59:54 step 39/40  loss 5.8438  lr 6.16e-06  grad norm 1.163  3,023 tokens/s",
        "20:59:46 step 20/40  eval loss 6.0463",
        "20:59:48 WARNING ftq-warning: straggler: throughput fell",
        "Traceback (most recent call last):",
        # A new day: its first line says the date.
        "2026-12-08 00:00:01 step 40/40  loss 5.8598  lr 1.54e-06  grad norm 0.964  3,175 tokens/s",
        "00:00:02 trained to step 40 in 14.0s",
        "00:00:03 trainer.evaluate scored 20 rows",
    ]
    fresh = LogLines()
    assert all(len(fresh.short(line)) <= 80 for line in raw[:5])
