"""The contract's `error.code` values: one enum for the API, the failure classifier and the trainer."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    invalid_spec = "invalid_spec"
    launch_error = "launch_error"
    dataset_error = "dataset_error"
    model_error = "model_error"
    out_of_memory = "out_of_memory"
    nccl_timeout = "nccl_timeout"
    rendezvous_error = "rendezvous_error"
    disk_full = "disk_full"
    time_limit = "time_limit"
    preempted = "preempted"
    node_failure = "node_failure"
    cancelled = "cancelled"
    diverged = "diverged"  # the loss became NaN or infinite (training.stop_on_nan)
    quota_exceeded = "quota_exceeded"
    unknown = "unknown"
    # An export's push to the Hugging Face Hub: no token on this server, the Hub unreachable or refusing.
    hub_error = "hub_error"
    # An experiment tracker (W&B online, MLflow) unreachable when the run started, with
    # FTQ_TRACKER_FAILURE=fail (the default, continue, trains on without it and says so in a job.warning).
    tracker_error = "tracker_error"
    # A grader (training.grader, POST /graders/run) raised, hung or exceeded a sandbox limit.
    grader_error = "grader_error"


# How the trainer reports a failure the user can fix: exit status 2 and one stderr line
# `ftq-error: <code>: <message>`, which the worker's classifier reads from the log's tail.
EXIT_USER_ERROR = 2
USER_ERROR_PREFIX = "ftq-error:"
