"""Running a `python` grader's source: one batch per sandboxed child process, never in the caller's.

The boundary is the operating system's (ftq.sandbox: bubblewrap, in fresh user, pid, network, ipc and
mount namespaces, an empty environment, a read-only interpreter, private /tmp and /dev/shm, one deadline
for the whole process tree, output capped while it streams). Inside it the child is `python -I -S` as
the sandbox's user, started by the run user (FTQ_RUN_AS_USER) where one is set; it sets RLIMIT_CPU,
RLIMIT_AS, RLIMIT_NPROC and RLIMIT_FSIZE before anything else, then installs an audit hook (refusing
sockets, fork/exec and ctypes: depth behind the boundary, not the boundary) and only then compiles the
grader. Where bubblewrap cannot start, `run_python` raises ftq.sandbox.SandboxUnavailable: python graders
are refused, never run weaker.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import sys
from dataclasses import dataclass
from typing import Any

from ftq import sandbox
from ftq.grading.errors import GraderError
from ftq.sandbox.boundary import interpreter_paths

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
    output_bytes: int = 4 * 1024 * 1024  # stdout and stderr together; past it the child is killed
    tmp_mb: int = 64  # the child's private /tmp and /dev/shm, each
    bwrap: str = "bwrap"  # FTQ_SANDBOX_BWRAP


# The child's program: read {"source", "batch"} from stdin, answer {"rewards"} or {"error", "kind"} on
# the stdout it was given (the grader's own prints go to stderr).
_CHILD = r"""
import json, math, resource, sys, traceback
for name, value in json.loads(sys.argv[1]).items():
    resource.setrlimit(getattr(resource, name), (value, value))
out = sys.stdout
sys.stdout = sys.stderr
# The hook reads only what was bound when it was defined (its defaults), never a module global or a
# builtin the grader could rebind (`sys.modules["__main__"]._DENIED = ...`, `builtins.str = ...`).
def _make_hook(denied=("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn",
                       "os.system", "subprocess.Popen", "pty.spawn", "ctypes.", "os.kill", "os.killpg",
                       "os.putenv", "resource.setrlimit", "resource.prlimit"),
               modules=frozenset(("ctypes", "_ctypes", "_posixsubprocess")), text=str, error=PermissionError):
    def hook(event, args):
        if event.startswith(denied):
            raise error("the grader sandbox refuses " + event)
        if event == "import" and args and text.__str__(args[0]).partition(".")[0] in modules:
            raise error("the grader sandbox refuses " + text.__str__(args[0]))
    return hook
request = json.loads(sys.stdin.read())
sys.addaudithook(_make_hook())
del _make_hook
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
def _interpreter(python: str) -> tuple[str, tuple[str, ...]]:
    path, folders = interpreter_paths(python)
    return path, tuple(folders)


def box(limits: Limits) -> sandbox.Box:
    """The sandbox a batch runs in: the interpreter read-only, its rlimits set by the child itself."""
    python, folders = _interpreter(limits.python)
    rlimits = {
        "RLIMIT_CPU": limits.cpu_seconds,
        "RLIMIT_AS": limits.memory_mb * 1024 * 1024,
        "RLIMIT_FSIZE": 16 * 1024 * 1024,
        "RLIMIT_NPROC": limits.processes,
    }
    return sandbox.Box(
        argv=(python, "-I", "-S", "-c", _CHILD, json.dumps(rlimits)),
        read_only=folders,
        env={"LANG": "C.UTF-8"},
        tmp_bytes=limits.tmp_mb * 1024 * 1024,
        uid=limits.uid,
        gid=limits.gid,
        bwrap=limits.bwrap,
    )


def run_python(
    grader: str, source: str, batch: list[tuple[dict[str, Any], dict[str, Any]]], limits: Limits
) -> list[float]:
    """Each (sample, item)'s reward from the source's `grade`, in one sandboxed child process; a
    GraderError naming the grader and the limit where it raised, hung or exceeded one;
    ftq.sandbox.SandboxUnavailable where the sandbox cannot start."""
    request = json.dumps({"source": source, "batch": batch}).encode()
    outcome = sandbox.run(
        box(limits), request, timeout=limits.timeout_seconds, max_output=limits.output_bytes
    )
    if outcome.timed_out:
        raise GraderError(
            grader, f"exceeded the wall-clock limit ({limits.timeout_seconds:g} s)", limit="wall_clock"
        )
    if outcome.output_exceeded:
        raise GraderError(
            grader,
            f"printed more than the output limit ({limits.output_bytes} bytes)",
            limit="output",
        )
    return _answer(grader, outcome.returncode, outcome.stdout, outcome.stderr, limits, len(batch))


def _rewards(answer: object, n: int) -> list[float] | None:
    """The child's rewards when they are exactly n finite numbers (a grader that writes to the real
    stdout itself gets no further than its own error)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("rewards"), list):
        return None
    values = answer["rewards"]
    if len(values) != n:
        return None
    if not all(type(x) in (int, float) and math.isfinite(x) for x in values):
        return None
    return [float(x) for x in values]


def _answer(grader: str, status: int, out: bytes, err: bytes, limits: Limits, n: int) -> list[float]:
    try:
        answer = json.loads(out.decode(errors="replace") or "null")
    except (json.JSONDecodeError, RecursionError):
        answer = None
    rewards = _rewards(answer, n)
    if rewards is not None:
        return rewards
    details = str(answer.get("error", "")) if isinstance(answer, dict) else ""
    if isinstance(answer, dict) and answer.get("kind") == "memory":
        raise GraderError(
            grader, f"exceeded the memory limit ({limits.memory_mb} MB)", limit="memory", details=details
        )
    if isinstance(answer, dict) and answer.get("kind") == "raised" and details:
        raise GraderError(grader, "raised an exception", details=details)
    # bwrap answers a command killed by a signal as 128 + the signal: RLIMIT_CPU's SIGXCPU, then SIGKILL.
    if status in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        raise GraderError(grader, f"exceeded the CPU-time limit ({limits.cpu_seconds} s)", limit="cpu")
    tail = "\n".join(err.decode(errors="replace").splitlines()[-_TRACEBACK_LINES:])
    if "MemoryError" in tail:
        raise GraderError(
            grader, f"exceeded the memory limit ({limits.memory_mb} MB)", limit="memory", details=tail
        )
    if answer is not None:
        raise GraderError(grader, "answered something other than its rewards", details=tail)
    raise GraderError(grader, f"ended without an answer (exit status {status})", details=tail)
