"""Running a `python` grader's source: one batch per child process, never in the caller's.

The child is `python -I` (no environment, no user site, no script folder on sys.path) started with an
empty environment in a fresh empty working directory, in a session of its own (the deadline kills its
whole process group). It is started by `unshare --net` where the host allows it (only a loopback that
is down, so no socket reaches anything; elsewhere the audit hook below still refuses socket creation),
with a run user (FTQ_RUN_AS_USER) becomes that user, who cannot read the service's data directory, and
sets its own RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC and RLIMIT_FSIZE before anything else. In the child,
an audit hook refuses sockets, fork/exec/subprocess, rlimit changes and ctypes before the grader's code
is compiled.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from ftq.grading.errors import GraderError

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
import json, math, resource, sys, traceback
for name, value in json.loads(sys.argv[1]).items():
    resource.setrlimit(getattr(resource, name), (value, value))
out = sys.stdout
sys.stdout = sys.stderr
_DENIED = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
           "subprocess.Popen", "pty.spawn", "ctypes.", "os.kill", "os.killpg", "os.putenv",
           "resource.setrlimit", "resource.prlimit")
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


@functools.cache
def net_isolated() -> bool:
    """Whether this host lets the sandbox leave the network (`unshare --net` works: root or
    CAP_SYS_ADMIN, and util-linux's unshare installed)."""
    try:
        subprocess.run(["unshare", "--net", "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _argv(limits: Limits) -> list[str]:
    """The child's command line: python in a network namespace of its own (where the host allows one),
    switched to the run user by `unshare` after the namespace is made (making one needs root)."""
    memory = limits.memory_mb * 1024 * 1024
    rlimits = {
        "RLIMIT_CPU": limits.cpu_seconds,
        "RLIMIT_AS": memory,
        "RLIMIT_FSIZE": 16 * 1024 * 1024,
        "RLIMIT_NPROC": limits.processes,
    }
    python = [limits.python, "-I", "-S", "-c", _CHILD, json.dumps(rlimits)]
    if not net_isolated():
        return python
    who = []
    if limits.uid is not None:
        who = [
            "--setgid",
            str(limits.gid if limits.gid is not None else limits.uid),
            "--setuid",
            str(limits.uid),
        ]
    return ["unshare", "--net", *who, "--", *python]


def run_python(
    grader: str, source: str, batch: list[tuple[dict[str, Any], dict[str, Any]]], limits: Limits
) -> list[float]:
    """Each (sample, item)'s reward from the source's `grade`, in one sandboxed child process; a
    GraderError naming the grader and the limit where it raised, hung or exceeded one."""
    request = json.dumps({"source": source, "batch": batch})
    with tempfile.TemporaryDirectory(prefix="ftq-grader-") as cwd:
        if limits.uid is not None:
            os.chown(cwd, limits.uid, limits.gid if limits.gid is not None else limits.uid)
        # No preexec_fn: the API calls this from threads, where code between fork and exec may deadlock.
        # The child sets its own rlimits first thing; `unshare` or Popen switches the user.
        switch = limits.uid is not None and not net_isolated()
        proc = subprocess.Popen(
            _argv(limits),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
            close_fds=True,
            user=limits.uid if switch else None,
            group=(limits.gid if limits.gid is not None else limits.uid) if switch else None,
            # Root's supplementary groups are dropped (before `unshare` switches the user, too).
            extra_groups=[] if limits.uid is not None else None,
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
