"""Processes, read from /proc: who is alive, which run a process belongs to, stopping process groups."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, fn: Callable[[], T | None], timeout: float = 60, every: float = 0.2) -> T:
    """fn()'s first truthy value; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """Running or sleeping: neither gone nor a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def live_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and pid_alive(int(e))]


def proc_groups() -> dict[int, list[int]]:
    """pgid -> live member pids."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        out.setdefault(int(fields[2]), []).append(int(entry))
    return out


def proc_children(pid: int) -> list[int]:
    """Children of every thread of `pid` (`ftq up` starts its worker again from a thread)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def marked_pids(job_ids: str | Iterable[str]) -> dict[str, list[int]]:
    """Live processes of runs, by job: every launcher marks a run's processes with FTQ_JOB_ID."""
    wanted = {job_ids} if isinstance(job_ids, str) else set(job_ids)
    out: dict[str, list[int]] = {}
    for pid in live_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(b"FTQ_JOB_ID="):
                job = var.split(b"=", 1)[1].decode(errors="replace")
                if job in wanted:
                    out.setdefault(job, []).append(pid)
    return out


def run_pids(job_id: str) -> list[int]:
    """Live processes of one run, wherever they are (their own sessions included)."""
    return marked_pids(job_id).get(job_id, [])


def procs_with(marker: str) -> list[int]:
    """Live processes (other than this one) whose command line holds `marker`."""
    found = []
    for pid in live_pids():
        if pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process (all its threads) has used so far."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_gone(pids: Iterable[int], timeout: float = 30) -> None:
    """Wait until none of `pids` is alive; AssertionError naming the survivors otherwise."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"still alive after {timeout:.0f}s: {alive}"


def _start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and fields[0] not in ("Z", "X") else None


class Paced:
    """While in effect, one run's processes get the CPU `share` of the time: SIGSTOP, then SIGCONT after
    `(1 - share) * period`, every `period`; all continued by `stop()` (or on leaving the `with`).

    For a test that needs a single-process run still training through a fault or a restart: without it
    the run must be given steps enough to outlast the fault at full speed on a quiet machine, and each
    of those steps is CPU the rest of the suite waits for. Paced, the run is the same real run (its
    steps, checkpoints and metric points as ever), only slower in wall time. Not for a run of several
    processes: a stopped rank would hold the others in their collectives."""

    def __init__(self, job_id: str, share: float = 0.1, period: float = 0.2) -> None:
        self.job_id, self.share, self.period = job_id, share, period
        self._done = threading.Event()
        self._seen: dict[int, int] = {}  # pid -> start time, so that a pid the system reused is never stopped
        self._thread = threading.Thread(target=self._pace, name=f"pace-{job_id}", daemon=True)
        self._thread.start()

    def _send(self, sig: int) -> None:
        for pid, started in list(self._seen.items()):
            if _start_ticks(pid) != started:
                self._seen.pop(pid, None)
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _pace(self) -> None:
        refreshed = 0.0
        while not self._done.is_set():
            if time.monotonic() - refreshed > 1.0:  # a scan reads every process's environment
                for pid in run_pids(self.job_id):
                    started = _start_ticks(pid)
                    if started is not None:
                        self._seen.setdefault(pid, started)
                refreshed = time.monotonic()
            self._send(signal.SIGSTOP)
            self._done.wait((1 - self.share) * self.period)
            self._send(signal.SIGCONT)
            self._done.wait(self.share * self.period)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._send(signal.SIGCONT)

    def __enter__(self) -> Paced:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 25) -> None:
    """SIGTERM the process group `proc` leads (it was started in a session of its own), SIGKILL it after
    `timeout` seconds, and reap `proc`."""
    if proc.poll() is not None:
        return
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def kill_runs(data_dir: Path) -> list[int]:
    """SIGKILL the process group of every local run under data_dir that is still alive: jobs, their exports
    and evaluations, serving engines and Tinker training clients (runs live in sessions of their own: a
    failed test, or a stack stopped under them, would leave them running). Returns the groups killed."""
    killed = []
    groups = proc_groups()
    patterns = (
        "runs/*/launch.json",
        "runs/*/*/*/launch.json",
        "engines/*/launch.json",
        "tinker/*/*/launch.json",
    )
    records = [r for pattern in patterns for r in data_dir.glob(pattern)]
    for record in records:
        try:
            pgid = int(json.loads(record.read_text())["pgid"])
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if pgid in groups:
            signal_group(pgid, signal.SIGKILL)
            killed.append(pgid)
    return killed
