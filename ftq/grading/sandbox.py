"""Running a `python` grader's source: one batch per child process, never in the caller's.

The child is `python -I` (no environment, no user site, no script folder on sys.path) started with an
empty environment in a fresh empty working directory, in a session of its own (the deadline kills its
whole process group). Before it runs the grader, the child's preexec step: leaves the host's network
(`unshare(CLONE_NEWNET)`: only a loopback that is down, so no socket reaches anything; where the kernel
refuses, the audit hook below still refuses socket creation), sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC
and RLIMIT_FSIZE, and, with a run user (FTQ_RUN_AS_USER), becomes that user, who cannot read the
service's data directory. In the child, an audit hook refuses sockets, fork/exec/subprocess and ctypes
before the grader's code is compiled.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from ftq.grading.errors import GraderError

_CLONE_NEWNET = 0x40000000
# How much of the grader's traceback an error message keeps.
_TRACEBACK_LINES = 12


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    memory_mb: int = 1024
    timeout_seconds: float = 30.0
    processes: int = 64
    uid: int | None = None  # the run user's; None: the caller's own user
    gid: int | None = None
    python: str = sys.executable  # the interpreter the child runs in (the standard library is enough)


# The child's program: read {"source", "batch"} from stdin, answer {"rewards"} or {"error", "kind"} on
# the stdout it was given (the grader's own prints go to stderr).
_CHILD = r"""
import json, math, sys, traceback
out = sys.stdout
sys.stdout = sys.stderr
_DENIED = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
           "subprocess.Popen", "pty.spawn", "ctypes.", "os.kill", "os.killpg", "os.putenv")
def _hook(event, args):
    if event.startswith(_DENIED):
        raise PermissionError(f"the grader sandbox refuses {event}")
    if event == "import" and args and str(args[0]).split(".")[0] in ("ctypes", "_ctypes", "_posixsubprocess"):
        raise PermissionError(f"the grader sandbox refuses {args[0]}")
request = json.loads(sys.stdin.read())
sys.addaudithook(_hook)
def answer(obj):
    out.write(json.dumps(obj)); out.flush()
def trimmed():
    lines = traceback.format_exc().splitlines()
    keep = [lines[0]]
    show = False
    for line in lines[1:]:
        if line.startswith('  File "<grader>"'):
            show = True
        if show or not line.startswith(" "):
            keep.append(line)
    return "\n".join(keep[-TRACEBACK_LINES:])
try:
    scope = {"__name__": "grader"}
    exec(compile(request["source"], "<grader>", "exec"), scope)
    grade = scope["grade"]
    rewards = []
    for sample, item in request["batch"]:
        value = float(grade(sample, item))
        if not math.isfinite(value):
            raise ValueError(f"grade() returned {value}")
        rewards.append(value)
except MemoryError:
    answer({"kind": "memory", "error": trimmed()})
except BaseException as e:
    answer({"kind": "raised", "error": trimmed()})
else:
    answer({"rewards": rewards})
""".replace("TRACEBACK_LINES", str(_TRACEBACK_LINES))


def _unshare_net() -> None:
    if hasattr(os, "unshare"):
        os.unshare(_CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")


def _preexec(limits: Limits) -> None:
    # Runs in the child between fork and exec: no logging, nothing that allocates much.
    with contextlib.suppress(OSError):
        _unshare_net()  # refused without CAP_SYS_ADMIN: the audit hook is then the only guard
    memory = limits.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    if limits.uid is not None:
        os.setgroups([])
        os.setgid(limits.gid if limits.gid is not None else limits.uid)
        os.setuid(limits.uid)


def net_isolated() -> bool:
    """Whether this host lets the sandbox leave the network (a child can unshare CLONE_NEWNET)."""
    try:
        subprocess.run(["unshare", "--net", "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def run_python(
    grader: str, source: str, batch: list[tuple[dict[str, Any], dict[str, Any]]], limits: Limits
) -> list[float]:
    """Each (sample, item)'s reward from the source's `grade`, in one sandboxed child process; a
    GraderError naming the grader and the limit where it raised, hung or exceeded one."""
    request = json.dumps({"source": source, "batch": batch})
    with tempfile.TemporaryDirectory(prefix="ftq-grader-") as cwd:
        if limits.uid is not None:
            os.chown(cwd, limits.uid, limits.gid if limits.gid is not None else limits.uid)
        proc = subprocess.Popen(
            [limits.python, "-I", "-S", "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
            close_fds=True,
            preexec_fn=lambda: _preexec(limits),
        )
        try:
            out, err = proc.communicate(request.encode(), timeout=limits.timeout_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise GraderError(
                grader, f"exceeded the wall-clock limit ({limits.timeout_seconds:g} s)", limit="wall_clock"
            ) from None
        finally:
            # Whatever it left behind in its group (a fork that escaped the hook) goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    return _answer(grader, proc.returncode, out, err, limits, len(batch))


def _answer(grader: str, status: int, out: bytes, err: bytes, limits: Limits, n: int) -> list[float]:
    try:
        answer = json.loads(out.decode(errors="replace") or "null")
    except json.JSONDecodeError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("rewards"), list) and len(answer["rewards"]) == n:
        return [float(x) for x in answer["rewards"]]
    if isinstance(answer, dict) and answer.get("kind") == "memory":
        raise GraderError(
            grader,
            f"exceeded the memory limit ({limits.memory_mb} MB)",
            limit="memory",
            details=answer["error"],
        )
    if isinstance(answer, dict) and "error" in answer:
        raise GraderError(grader, "raised an exception", details=str(answer["error"]))
    if status in (-signal.SIGXCPU, -signal.SIGKILL) or status == 128 + signal.SIGXCPU:
        raise GraderError(grader, f"exceeded the CPU-time limit ({limits.cpu_seconds} s)", limit="cpu")
    tail = "\n".join(err.decode(errors="replace").splitlines()[-_TRACEBACK_LINES:])
    if "MemoryError" in tail:
        raise GraderError(
            grader, f"exceeded the memory limit ({limits.memory_mb} MB)", limit="memory", details=tail
        )
    raise GraderError(grader, f"ended without an answer (exit status {status})", details=tail)
