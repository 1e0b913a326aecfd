"""Why a run failed, from its exit code, the scheduler's reason and the tail of train.log.

The result is an error code from the contract and a message that says what happened and what to
change. The trainer announces the failures a user can fix as `ftq-error: <code>: <message>` lines;
everything else is recognised from the messages torch, NCCL, the elastic launcher and the OS print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ftq.contract.errors import USER_ERROR_PREFIX, ErrorCode
from ftq.runtime.userfiles import human_size

KNOWN_CODES = frozenset(c.value for c in ErrorCode)

TAIL_BYTES = 64 * 1024
_FTQ_ERROR = re.compile(re.escape(USER_ERROR_PREFIX) + r" ([a-z_]+): (.+)")


@dataclass(frozen=True)
class Failure:
    code: str
    message: str


_REASONS: dict[str, Failure] = {
    "TIMEOUT": Failure(
        "time_limit",
        "the SLURM job reached its time limit and was stopped; raise "
        "resources.slurm.time_limit, or resume from the last checkpoint with resume_from",
    ),
    "DEADLINE": Failure(
        "time_limit",
        "the SLURM job reached its deadline and was stopped; resume it from "
        "the last checkpoint with resume_from",
    ),
    "PREEMPTED": Failure(
        "preempted",
        "SLURM preempted the job for a higher-priority one; submit it again "
        "with resume_from to continue from the last checkpoint",
    ),
    "NODE_FAIL": Failure(
        "node_failure",
        "a node of the job failed; submit it again with resume_from to continue from the last checkpoint",
    ),
    "BOOT_FAIL": Failure("node_failure", "a node of the job failed to boot; submit it again"),
    "OUT_OF_MEMORY": Failure(
        "out_of_memory",
        "SLURM stopped the job for using more host memory than "
        "allowed; lower per_device_train_batch_size or max_seq_len, or ask for more "
        "memory",
    ),
}

_GPU_OOM = Failure(
    "out_of_memory",
    "a GPU ran out of memory; lower training.per_device_train_batch_size or training.max_seq_len, turn on "
    "training.gradient_checkpointing, use LoRA, or shard the model with distributed.strategy fsdp or "
    "deepspeed zero_stage 3",
)
_HOST_OOM = Failure(
    "out_of_memory",
    "the training process was killed (exit 137: SIGKILL), most often by the host's out-of-memory killer "
    "(the kernel log could not be read to confirm it); "
    "lower per_device_train_batch_size, max_seq_len or processes_per_node, or enable FSDP "
    "cpu_ram_efficient_loading",
)
# The local launcher's reaper saw the run end on a nearly full disk, with no exit status written
# (launch.sh could not): said as a reason, since the disk may have room again by the time it is read.
DISK_FULL_AT_EXIT = "DISK_FULL_AT_EXIT"
_TIME_LIMIT = _REASONS["TIMEOUT"]
_PREEMPTED = _REASONS["PREEMPTED"]
_NODE_FAIL = _REASONS["NODE_FAIL"]
_DISK_FULL = Failure(
    "disk_full",
    "the disk holding the run directory is full; free space, raise training.save_steps or "
    "set training.save_total_limit",
)
# In order: what the scheduler says first (its kill causes the errors printed after it), then the root
# causes before their consequences (one rank's CUDA OOM makes the others time out in NCCL).
_PATTERNS: list[tuple[re.Pattern[str], Failure]] = [
    (
        re.compile(
            r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT"
            r"|CANCELLED (?:AT \S+ )?DUE TO TIME LIMIT"
        ),
        _TIME_LIMIT,
    ),
    (re.compile(r"CANCELLED (?:AT \S+ )?DUE TO PREEMPTION"), _PREEMPTED),
    (re.compile(r"CANCELLED (?:AT \S+ )?DUE TO NODE FAILURE|DUE TO NODE FAILURE"), _NODE_FAIL),
    (re.compile(r"No space left on device|ENOSPC|StorageFull|Errno 28\b"), _DISK_FULL),
    (
        re.compile(
            r"CUDA out of memory|torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError"
            r"|CUBLAS_STATUS_ALLOC_FAILED|CUDA error: out of memory|NCCL.*[Oo]ut of memory"
        ),
        _GPU_OOM,
    ),
    (
        re.compile(
            r"Watchdog caught collective operation timeout|collective operation timeout"
            r"|ran for \d+ milliseconds before timing out|NCCL communicator was aborted"
            r"|ProcessGroupNCCL.*(?:timed out|[Tt]imeout)"
        ),
        Failure(
            "nccl_timeout",
            "a collective operation (NCCL) timed out: one rank stalled or the network between "
            "GPUs/nodes failed; check that all nodes reach each other (NCCL_SOCKET_IFNAME), and "
            "that no rank is much slower (data loading, an eval on one rank)",
        ),
    ),
    (
        re.compile(
            r"Rendezvous\w*Error|RendezvousTimeout|DistNetworkError|DistStoreError|EADDRINUSE"
            r"|Address already in use|failed to listen on any local network address"
            r"|failed to connect to the master|TCPStore.*(?:timed out|Timed out)"
        ),
        Failure(
            "rendezvous_error",
            "the processes could not meet to start (rendezvous): the main node's address or "
            "port is unreachable or in use; check the nodes can reach each other, or retry",
        ),
    ),
    (re.compile(r"\bMemoryError\b|Cannot allocate memory"), _HOST_OOM),
]

# A process of the run was ended by SIGKILL, as torch's elastic agent, accelerate or bash report it.
_SIGKILL = re.compile(
    r"Signal 9 \(SIGKILL\)|Signals\.SIGKILL|exitcode\s*:\s*-9\b|exit(?:ed with)? code -9\b"
    r"|non-zero exit status -9\b|\bKilled\s*$",
    re.MULTILINE,
)
_PIDS_IN_LOG = re.compile(
    r"exitcode\s*:\s*-9 \(pid: (\d+)\)|\(exitcode: -9\) local_rank: \d+ \(pid: (\d+)\)"
    r"|Signal 9 \(SIGKILL\) received by PID (\d+)"
)
# "Out of memory: Killed process 123 (python)" and "Memory cgroup out of memory: Killed process 123 (...)".
_KERNEL_OOM = re.compile(r"out of memory: Killed process (\d+) \(([^)]*)\)", re.IGNORECASE)
# Under this much free space the disk of the run directory counts as full.
DISK_FULL_BYTES = 1024 * 1024


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    try:
        with path.open("rb") as f:
            end = f.seek(0, 2)
            f.seek(max(0, end - size))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def classify(
    *,
    exit_code: int | None,
    log_tail: str,
    reason: str | None = None,
    kernel_log: str | None = None,
    disk_free: int | None = None,
    since_uptime: float | None = None,
) -> Failure:
    """The most specific explanation: the scheduler's reason, the trainer's own word, then log patterns.

    `kernel_log` (the kernel's messages, `dmesg` form, when readable) decides whether a SIGKILL was the
    out-of-memory killer; without it a SIGKILL is reported as most likely that. `disk_free` is the free
    space where the run writes; a full disk explains a run that could not even log its error.
    `since_uptime` (seconds since boot when the run started) bounds the kernel messages considered.
    """
    if reason and reason.startswith(DISK_FULL_AT_EXIT):
        free = reason.removeprefix(DISK_FULL_AT_EXIT + ": ").split(" ", 1)[0]
        return _disk_full(int(free)) if free.isdigit() else _DISK_FULL
    if reason:
        for key, failure in _REASONS.items():
            if reason.upper().startswith(key):
                return failure
    # The last one: a log that a requeued job appends to also holds the earlier attempts' reports.
    for line in reversed(log_tail.splitlines()):
        m = _FTQ_ERROR.search(line)
        if m and m.group(1) in KNOWN_CODES:
            return Failure(m.group(1), m.group(2).strip()[:2000])
    for pattern, failure in _PATTERNS:
        if pattern.search(log_tail):
            return failure
    if disk_free is not None and disk_free < DISK_FULL_BYTES:
        return _disk_full(disk_free)
    if exit_code in (137, -9) or _SIGKILL.search(log_tail):
        return _sigkill(log_tail, kernel_log, since_uptime)
    last = _last_error_line(log_tail)
    what = (
        f"the training run exited with code {exit_code}"
        if exit_code is not None
        else ("the training run ended without an exit status (its processes vanished)")
    )
    hint = f"; the log ends with: {last}" if last else ""
    return Failure("unknown", f"{what}{hint}; the job's log (GET /jobs/<id>/logs) has the full output")


def _disk_full(free: int) -> Failure:
    return Failure(_DISK_FULL.code, f"{_DISK_FULL.message} ({human_size(free)} free when it ended)")


# A run that left no exit status (launch.sh could not write it) on a file system with less than this
# free (or under 5% of it) ran out of space: a checkpoint that failed midway leaves the rest of it.
NEARLY_FULL_BYTES = 64 * 1024**2


def nearly_full(run_dir: Path) -> Failure | None:
    """disk_full when the file system holding `run_dir` is nearly full now, else None."""
    import shutil

    try:
        usage = shutil.disk_usage(run_dir)
    except OSError:
        return None
    if usage.free < max(DISK_FULL_BYTES, min(NEARLY_FULL_BYTES, usage.total // 20)):
        return _disk_full(usage.free)
    return None


def disk_full_reason(free: int) -> str:
    """The reason a launcher gives for a run that ended on a nearly full disk without an exit status."""
    return f"{DISK_FULL_AT_EXIT}: {free} bytes free when the run ended"


def _sigkill(log_tail: str, kernel_log: str | None, since_uptime: float | None) -> Failure:
    """A SIGKILL: the kernel's OOM killer when its log says so, else say plainly that we do not know."""
    if kernel_log is None:
        return _HOST_OOM
    named = {int(g) for m in _PIDS_IN_LOG.finditer(log_tail) for g in m.groups() if g}
    for when, pid, comm in reversed(kernel_oom_kills(kernel_log)):
        if since_uptime is not None and when is not None and when < since_uptime:
            continue
        # The log names the killed ranks (torch's elastic agent does): the kernel's victim must be one.
        if named and pid not in named:
            continue
        return Failure(
            "out_of_memory",
            f"the kernel's out-of-memory killer ended process {pid} ({comm}) of the run: the host (or the "
            "memory limit of its cgroup) ran out of RAM; lower per_device_train_batch_size, max_seq_len or "
            "processes_per_node, use LoRA, or enable FSDP cpu_ram_efficient_loading",
        )
    return Failure(
        "unknown",
        "a process of the run was killed with SIGKILL (exit 137), and the kernel log records no "
        "out-of-memory kill for it: something else ended it (an operator, a watchdog, the scheduler); "
        "submit it again, with resume_from to continue from its last checkpoint",
    )


_DMESG_LINE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def kernel_oom_kills(kernel_log: str) -> list[tuple[float | None, int, str]]:
    """(seconds since boot or None, pid, command) of each out-of-memory kill in a `dmesg` text."""
    out: list[tuple[float | None, int, str]] = []
    for line in kernel_log.splitlines():
        m = _DMESG_LINE.match(line)
        when, text = (float(m.group(1)), m.group(2)) if m else (None, line)
        k = _KERNEL_OOM.search(text)
        if k:
            out.append((when, int(k.group(1)), k.group(2)))
    return out


def read_kernel_log() -> str | None:
    """The kernel's message buffer in `dmesg` form, or None where it cannot be read (no root, a
    container without /dev/kmsg): then a SIGKILL is reported as a probable, not a certain, OOM kill."""
    import os

    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines: list[str] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: the ring buffer overwrote a record; go on with the next
                    continue
                return None
            if not record:
                break
            # "<level>,<seq>,<usec since boot>,<flags>;<message>"
            head, _, message = record.decode(errors="replace").partition(";")
            fields = head.split(",")
            usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
            lines.append(f"[{usec / 1e6:12.6f}] {message.splitlines()[0] if message else ''}")
    finally:
        os.close(fd)
    return "\n".join(lines)


def uptime_now() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def classify_run(run_dir: Path, *, exit_code: int | None, reason: str | None = None) -> Failure:
    """classify() with what this host can tell about the run: its log tail, the free space where it
    wrote, and (for a SIGKILL) the kernel's out-of-memory messages since the run started."""
    import shutil
    import time

    tail = read_tail(run_dir / "train.log")
    try:
        disk_free: int | None = shutil.disk_usage(run_dir).free
    except OSError:
        disk_free = None
    kernel_log = None
    since = None
    if exit_code in (137, -9) or _SIGKILL.search(tail):
        kernel_log = read_kernel_log()
        up = uptime_now()
        try:
            # The run's start, as the run directory's spec.json was written just before the launch.
            started = (run_dir / "spec.json").stat().st_mtime
        except OSError:
            started = None
        if up is not None and started is not None:
            since = up - (time.time() - started) - 5
    return classify(
        exit_code=exit_code,
        log_tail=tail,
        reason=reason,
        kernel_log=kernel_log,
        disk_free=disk_free,
        since_uptime=since,
    )


def _last_error_line(tail: str) -> str | None:
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"Error|Exception|error:|Traceback", ln) and not ln.startswith("Traceback"):
            return ln[:500]
    return lines[-1][:500] if lines else None
