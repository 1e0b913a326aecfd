"""Why a run failed, from its exit code, the scheduler's reason and the tail of train.log.

The result is an error code from the contract and a message that says what happened and what to
change. The trainer announces the failures a user can fix as `ftq-error: <code>: <message>` lines;
everything else is recognised from the messages torch, NCCL, the elastic launcher and the OS print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KNOWN_CODES = frozenset({
    "invalid_spec", "launch_error", "dataset_error", "model_error", "out_of_memory", "nccl_timeout",
    "rendezvous_error", "disk_full", "time_limit", "preempted", "node_failure", "cancelled", "unknown",
})

TAIL_BYTES = 64 * 1024
_FTQ_ERROR = re.compile(r"ftq-error: ([a-z_]+): (.+)")


@dataclass(frozen=True)
class Failure:
    code: str
    message: str


_REASONS: dict[str, Failure] = {
    "TIMEOUT": Failure("time_limit", "the SLURM job reached its time limit and was stopped; raise "
                       "resources.slurm.time_limit, or resume from the last checkpoint with resume_from"),
    "DEADLINE": Failure("time_limit", "the SLURM job reached its deadline and was stopped; resume it from "
                        "the last checkpoint with resume_from"),
    "PREEMPTED": Failure("preempted", "SLURM preempted the job for a higher-priority one; submit it again "
                         "with resume_from to continue from the last checkpoint"),
    "NODE_FAIL": Failure("node_failure", "a node of the job failed; submit it again with resume_from to "
                         "continue from the last checkpoint"),
    "BOOT_FAIL": Failure("node_failure", "a node of the job failed to boot; submit it again"),
    "OUT_OF_MEMORY": Failure("out_of_memory", "SLURM stopped the job for using more host memory than "
                             "allowed; lower per_device_train_batch_size or max_seq_len, or ask for more "
                             "memory"),
}

_GPU_OOM = Failure(
    "out_of_memory",
    "a GPU ran out of memory; lower training.per_device_train_batch_size or training.max_seq_len, turn on "
    "training.gradient_checkpointing, use LoRA, or shard the model with distributed.strategy fsdp or "
    "deepspeed zero_stage 3",
)
_HOST_OOM = Failure(
    "out_of_memory",
    "the training process was killed (exit 137: SIGKILL), most often by the host's out-of-memory killer; "
    "lower per_device_train_batch_size, max_seq_len or processes_per_node, or enable FSDP "
    "cpu_ram_efficient_loading",
)
_PATTERNS: list[tuple[re.Pattern[str], Failure]] = [
    (re.compile(r"No space left on device|ENOSPC"), Failure(
        "disk_full", "the disk holding the run directory is full; free space, raise training.save_steps or "
                     "set training.save_total_limit")),
    (re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"),
     _GPU_OOM),
    (re.compile(r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|ProcessGroupNCCL.*timed? ?out"
                r"|collective operation timeout"), Failure(
        "nccl_timeout", "a collective operation (NCCL) timed out: one rank stalled or the network between "
                        "GPUs/nodes failed; check that all nodes reach each other (NCCL_SOCKET_IFNAME), and "
                        "that no rank is much slower (data loading, an eval on one rank)")),
    (re.compile(r"Rendezvous\w*Error|RendezvousTimeout|rendezvous|EADDRINUSE|Address already in use"
                r"|failed to connect to the master|DistNetworkError"), Failure(
        "rendezvous_error", "the processes could not meet to start (rendezvous): the main node's address or "
                            "port is unreachable or in use; check the nodes can reach each other, or retry")),
    (re.compile(r"MemoryError\b|Cannot allocate memory"), _HOST_OOM),
]


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    try:
        with path.open("rb") as f:
            end = f.seek(0, 2)
            f.seek(max(0, end - size))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def classify(*, exit_code: int | None, log_tail: str, reason: str | None = None) -> Failure:
    """The most specific explanation: the scheduler's reason, the trainer's own word, then log patterns."""
    if reason:
        for key, failure in _REASONS.items():
            if reason.upper().startswith(key):
                return failure
    for line in log_tail.splitlines():
        m = _FTQ_ERROR.search(line)
        if m and m.group(1) in KNOWN_CODES:
            return Failure(m.group(1), m.group(2).strip()[:2000])
    for pattern, failure in _PATTERNS:
        if pattern.search(log_tail):
            return failure
    if exit_code in (137, -9):
        return _HOST_OOM
    last = _last_error_line(log_tail)
    what = f"the training run exited with code {exit_code}" if exit_code is not None else (
        "the training run ended without an exit status (its processes vanished)"
    )
    hint = f"; the log ends with: {last}" if last else ""
    return Failure("unknown", f"{what}{hint}; the job's log (GET /jobs/<id>/logs) has the full output")


def _last_error_line(tail: str) -> str | None:
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"Error|Exception|error:|Traceback", ln) and not ln.startswith("Traceback"):
            return ln[:500]
    return lines[-1][:500] if lines else None
