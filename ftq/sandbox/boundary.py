"""bubblewrap, driven: the command line a Box becomes (a pure function), and one run of it under a deadline
for the whole process tree, with its output capped while it streams."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# The folders of a merged-/usr system, or real folders on an older one: bound (or linked) as they are.
_ROOT_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Inside, tenant code is this user and group whatever started it: it owns nothing it can see.
SANDBOX_ID = 65534
# The only variable bwrap itself is started with: its first process inside (pid 1, readable by the
# sandboxed code through /proc/1/environ) inherits bwrap's environment, not --clearenv's.
_BWRAP_ENV = {"PATH": "/usr/bin:/bin"}
# How long the tree gets to close its pipes after it is killed before they are closed on it.
_DRAIN_SECONDS = 2.0
# The fix named when bwrap cannot start.
FIX = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; RHEL: dnf install bubblewrap) on "
    "every host that runs the API, the worker or a run, allow user namespaces "
    "(sysctl user.max_user_namespaces > 0; kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu "
    "24.04), or point FTQ_SANDBOX_BWRAP at the bwrap binary"
)


class SandboxUnavailable(Exception):
    """bwrap is missing or could not build the sandbox on this host; the message names the fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the tenant-code sandbox cannot start on this host: {reason}. Fix: {FIX}")
        self.reason = reason


@dataclass(frozen=True)
class Box:
    """What one sandboxed command may see and do. Every path is the server's choice."""

    argv: tuple[str, ...]
    read_only: tuple[str, ...] = ()  # host paths, bound read-only at the same place
    writable: tuple[str, ...] = ()  # server-made folders the command writes its results into
    devices: tuple[str, ...] = ()  # device nodes passed through (GPUs)
    env: Mapping[str, str] = field(default_factory=dict)  # the command's whole environment
    cwd: str = "/tmp"
    tmp_bytes: int = 64 * 1024 * 1024  # /tmp and /dev/shm, each
    uid: int | None = None  # the run user bwrap starts as (the caller must be root); None: the caller
    gid: int | None = None
    bwrap: str = "bwrap"


@dataclass(frozen=True)
class Outcome:
    """How the command ended: its exit status (negative: the signal), its stdout (whole, under the cap)
    and the tail of its stderr, and whether the deadline or the output cap ended it."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    output_exceeded: bool = False
    seconds: float = 0.0


def _root_entries(root: Path = Path("/")) -> list[str]:
    args: list[str] = []
    for name in _ROOT_ENTRIES:
        path = root / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    return args


def argv(box: Box, *, timeout: float | None = None, root_entries: list[str] | None = None) -> list[str]:
    """The bwrap command line for the box (pure: the host's /bin, /lib... layout is passed in, or read).

    bwrap dies with its starter (--die-with-parent: a killed API or trainer takes its sandboxes with it
    at once). With `timeout`, the command also runs under coreutils' `timeout` inside the sandbox, which
    kills it a second after the deadline whatever happens outside; its end ends the pid namespace."""
    inside = list(box.argv)
    if timeout is not None:
        inside = ["/usr/bin/timeout", "--signal=KILL", f"{timeout + 1:g}", *inside]
    args = [
        box.bwrap,
        "--unshare-user",
        "--disable-userns",  # no nested user namespace: no unshare or nsenter inside
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--uid",
        str(SANDBOX_ID),
        "--gid",
        str(SANDBOX_ID),
        "--hostname",
        "ftq-sandbox",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
        *(root_entries if root_entries is not None else _root_entries()),
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(box.tmp_bytes),
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--size",
        str(box.tmp_bytes),
        "--tmpfs",
        "/dev/shm",
    ]
    for path in box.read_only:
        args += ["--ro-bind", path, path]
    for path in box.writable:
        args += ["--bind", path, path]
    for path in box.devices:
        args += ["--dev-bind", path, path]
    args += ["--chdir", box.cwd, "--clearenv"]
    for name, value in sorted(box.env.items()):
        args += ["--setenv", name, value]
    return [*args, "--", *inside]


def _user(box: Box) -> dict[str, object]:
    """Popen's arguments that start bwrap as the run user (unprivileged bwrap: its own user namespace)."""
    if box.uid is None:
        return {}
    if os.geteuid() != 0:
        if box.uid == os.geteuid():
            return {}
        raise SandboxUnavailable(f"only root can start the sandbox as uid {box.uid} (FTQ_RUN_AS_USER)")
    gid = box.gid if box.gid is not None else box.uid
    return {"user": box.uid, "group": gid, "extra_groups": []}


def _feed(pipe: object, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)  # type: ignore[attr-defined]
    with contextlib.suppress(OSError, ValueError):
        pipe.close()  # type: ignore[attr-defined]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # bwrap's own process group: the outer bwrap; its first process inside dies with it
    # (--die-with-parent), and with that process the kernel kills everything in the pid namespace,
    # a grandchild that called setsid included.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.kill()


def run(
    box: Box,
    stdin: bytes = b"",
    *,
    timeout: float,
    max_output: int = 8 * 1024 * 1024,
    stderr_tail: int = 64 * 1024,
) -> Outcome:
    """Run the box's command with `stdin`. The tree is killed when `timeout` seconds pass or stdout and
    stderr together pass `max_output` bytes; stderr keeps its last `stderr_tail` bytes.

    SandboxUnavailable when bwrap is missing or fails before the command starts."""
    if shutil.which(box.bwrap, path=_BWRAP_ENV["PATH"]) is None:
        raise SandboxUnavailable(f"{box.bwrap!r} is not installed")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv(box, timeout=timeout),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_BWRAP_ENV,
            cwd="/",
            start_new_session=True,
            close_fds=True,
            **_user(box),  # type: ignore[call-overload]
        )
    except FileNotFoundError:
        raise SandboxUnavailable(f"{box.bwrap!r} is not installed") from None
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
    feeder.start()

    out = bytearray()
    err = bytearray()
    total = 0
    timed_out = exceeded = False
    deadline = started + timeout
    killed_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                timed_out = True
                _kill(proc)
                killed_at = now
            if killed_at is not None and now - killed_at > _DRAIN_SECONDS:
                break
            wait = (killed_at + _DRAIN_SECONDS if killed_at is not None else deadline) - now
            for key, _ in sel.select(timeout=max(0.01, wait)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                if killed_at is not None:
                    continue
                total += len(chunk)
                buf += chunk
                if buf is err and len(err) > stderr_tail:
                    del err[: len(err) - stderr_tail]
                if total > max_output:
                    exceeded = True
                    _kill(proc)
                    killed_at = time.monotonic()
    for pipe in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            pipe.close()
    try:
        code = proc.wait(timeout=_DRAIN_SECONDS)
    except subprocess.TimeoutExpired:
        _kill(proc)
        code = proc.wait()
    feeder.join(timeout=_DRAIN_SECONDS)
    if code == 1 and not out and err.startswith(b"bwrap: ") and not (timed_out or exceeded):
        # bwrap's own failure before the command ran (a mount it could not make, an interpreter the
        # sandbox's user cannot execute). A command that fakes this line only fails its own run.
        raise SandboxUnavailable(bytes(err).decode(errors="replace").strip().splitlines()[0])
    return Outcome(
        returncode=code,
        stdout=bytes(out),
        stderr=bytes(err),
        timed_out=timed_out,
        output_exceeded=exceeded,
        seconds=time.monotonic() - started,
    )


_checked: set[tuple[str, int | None, int | None]] = set()


def check(bwrap: str = "bwrap", uid: int | None = None, gid: int | None = None) -> None:
    """SandboxUnavailable unless a sandbox of this host's layout starts (as the given run user); a
    success is remembered for the process, a failure is probed again next time (an operator may fix it
    without a restart)."""
    key = (bwrap, uid, gid)
    if key in _checked:
        return
    outcome = run(Box(argv=("/bin/true",), uid=uid, gid=gid, bwrap=bwrap), timeout=30)
    if outcome.returncode != 0:
        tail = outcome.stderr.decode(errors="replace").strip()
        raise SandboxUnavailable(tail or f"a trial sandbox exited with status {outcome.returncode}")
    _checked.add(key)


def interpreter_paths(python: str) -> tuple[str, list[str]]:
    """`python` as an absolute path, and what it needs read-only: its prefix and base prefix (outside
    /usr), and the file itself where it lies outside them. Asked of the interpreter itself, outside any
    sandbox (no tenant code runs here)."""
    try:
        answer = subprocess.run(
            [python, "-I", "-c", "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix]))"],
            capture_output=True,
            timeout=30,
            env=_BWRAP_ENV,
            check=True,
        )
        prefixes = json.loads(answer.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise SandboxUnavailable(f"the interpreter {python!r} does not run: {e}") from None
    keep: list[str] = []
    for p in prefixes:
        p = os.path.realpath(p)
        if not (p == "/usr" or p.startswith("/usr/")) and p not in keep:
            keep.append(p)
    path = os.path.abspath(python)
    if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in ("/usr", *keep)):
        keep.append(path)  # a wrapper script outside the prefixes (an operator's FTQ_PYTHON), itself
    return path, keep
