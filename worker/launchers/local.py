"""The local launcher: each run is `bash launch.sh` in its own session (process group) on this host.

What the launcher knows about a run survives a worker restart because it is all on disk or in /proc:
- `run_dir/launch.json` (written atomically right after the start): pid of the group leader, its start
  time in clock ticks (/proc/<pid>/stat field 22) and the pgid. A pid alone can be reused; pid plus
  start ticks cannot.
- `run_dir/exit_status`, written by launch.sh when the launch ends.
- `run_dir/cancel.json`: when SIGTERM was sent, so that a later look escalates to SIGKILL after the
  grace period, whichever worker makes it.
- `run_dir/launches.log`: one line appended per start, never rewritten: the audit that a job was
  launched exactly once, whatever crashed around it (bench/fault_series.py counts these lines).

Run isolation: a run gets `launch_environment`'s allowlist, never the worker's environment. With
FTQ_RUN_AS_USER the run starts as that unprivileged user (the worker must be root), so it cannot read the
worker's /proc entries, the store, or a run directory of another run user. Its run directory is then
owned by the worker with the run user's group and mode 1770: the run writes there, nobody else enters,
and the sticky bit keeps the run from removing or replacing what the worker wrote (the launch records,
spec.json, launch.sh, train.log). Without a run user every file is the worker's user's alone (umask 077).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pwd
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.runtime.settings import Settings, get_settings
from worker import failures
from worker.launchers.base import (
    LaunchHandle,
    LaunchRequest,
    RunPhase,
    RunRef,
    RunState,
    add_run_environment,
    launch_environment,
)

log = logging.getLogger(__name__)

LAUNCHES_LOG = "launches.log"
RUN_MARKER = "FTQ_JOB_ID"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str
    pgid: int
    start_ticks: int
    ppid: int = 0


def read_stat(pid: int) -> ProcInfo | None:
    """State, pgid and start time of one process, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return ProcInfo(pid=pid, state=rest[0], pgid=int(rest[2]), start_ticks=int(rest[19]), ppid=int(rest[1]))


def scan_proc() -> list[ProcInfo]:
    """Every live (non-zombie) process: one pass over /proc for all runs."""
    out: list[ProcInfo] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        info = read_stat(int(entry.name))
        if info is not None and info.state not in ("Z", "X", "x"):
            out.append(info)
    return out


def group_members(pgid: int, procs: list[ProcInfo] | None = None) -> list[int]:
    return [p.pid for p in (procs if procs is not None else scan_proc()) if p.pgid == pgid]


def _group_is_ours(run: RunRef, procs: list[ProcInfo]) -> bool:
    """Whether process group `run.pid` is still this run's. Linux does not hand out a pid that is some
    group's id, so members with that pgid are the run's leftovers, unless a process now holds that pid
    under another start time: the run's group emptied and the pid went round to someone else's."""
    if not run.pid:
        return False
    leader = next((p for p in procs if p.pid == run.pid), None)
    if leader is not None and run.pid_start_ticks and leader.start_ticks != run.pid_start_ticks:
        return False
    return bool(group_members(run.pid, procs))


def marked(job_id: str, procs: list[ProcInfo] | None = None, uid: int | None = None) -> list[int]:
    """Processes that carry the run's marker in their environment, whatever session they moved to.

    torch's elastic agent starts every rank in a session of its own, so a rank is not in the run's
    process group; it does inherit the environment, and with it `FTQ_JOB_ID`. With `uid` (the user the
    run started as) only that user's processes count: another owner's run could set the marker of a
    job that is not its own, to keep that job running or have the worker signal what it chose.
    """
    needle = f"\0{RUN_MARKER}={job_id}\0".encode()
    out = []
    for p in procs if procs is not None else scan_proc():
        try:
            env = Path(f"/proc/{p.pid}/environ").read_bytes()
            if needle in b"\0" + env and (uid is None or _real_uid(p.pid) == uid):
                out.append(p.pid)
        except OSError:
            continue
    return out


def _real_uid(pid: int) -> int:
    # From status, not the owner of /proc/<pid>: a process that made itself non-dumpable shows as root's
    # there, and would slip past the cleanup of its run.
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise ProcessLookupError(pid)


# The run's group writes its run directory; the sticky bit: only the worker removes the worker's files.
SHARED_RUN_DIR_MODE = 0o1770
# What the run must read (spec, accelerate config, launch.sh) and append to (train.log, which launch.sh
# opens again); the worker's records (launch.json, cancel.json, launches.log) stay 0600.
_RUN_READS = (runs.SPEC, runs.ACCELERATE_CONFIG, runs.LAUNCH_SCRIPT)
# A run user's files are readable by its group (a non-root API added to that group reads logs and
# artifacts through it); without a run user, the worker's user's alone.
RUN_USER_UMASK = 0o027
SERVICE_UMASK = 0o077


@dataclass(frozen=True)
class RunUser:
    name: str
    uid: int
    gid: int
    home: str


def run_user(settings: Settings, owner: str | None) -> RunUser | None:
    """Who this owner's runs start as (FTQ_RUN_AS_USER); None: the worker's own user."""
    name = settings.run_user_for(owner)
    if name is None:
        return None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise LookupError(f"FTQ_RUN_AS_USER names user {name!r}, who does not exist on this host") from None
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise ValueError(f"FTQ_RUN_AS_USER: {name!r} is root or in root's group; name an unprivileged user")
    for other in set(settings.run_users.values()) - {name}:
        with contextlib.suppress(KeyError):
            if pwd.getpwnam(other).pw_gid == pw.pw_gid:
                # The group is what opens a run directory: shared, one owner's run enters another's.
                raise ValueError(f"FTQ_RUN_AS_USER: {name!r} and {other!r} share a group; give each its own")
    if os.geteuid() != 0:
        raise PermissionError(
            "FTQ_RUN_AS_USER needs a worker running as root (it starts each run as that user)"
        )
    return RunUser(name=name, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir)


def _permits(path: Path, user: RunUser, bits: int) -> bool:
    info = path.stat()
    if info.st_uid == user.uid:
        mode = info.st_mode >> 6
    elif info.st_gid == user.gid:
        mode = info.st_mode >> 3
    else:
        mode = info.st_mode
    return mode & bits == bits


def cannot_run(path: str, user: RunUser) -> str | None:
    """Why `user` could not execute `path` (a folder on the way it may not enter, the file itself), or
    None. A venv under root's 0700 home is the usual case: every run would fail with a bare EACCES."""
    for candidate in dict.fromkeys((Path(path).absolute(), Path(path).resolve())):
        try:
            for folder in reversed(candidate.parents):
                if not _permits(folder, user, 0o1):
                    return f"{folder} is mode {stat.S_IMODE(folder.stat().st_mode):o}"
            if not _permits(candidate.resolve(), user, 0o5):
                return f"{candidate.resolve()} is not readable and executable for it"
        except OSError as exc:
            return str(exc)
    return None


def run_user_problems(settings: Settings) -> list[str]:
    """What would stop a launch as each configured run user (no such user, root, a shared group, an
    FTQ_PYTHON it cannot execute, a worker that is not root)."""
    problems: list[str] = []
    for owner in settings.run_users:
        try:
            user = run_user(settings, None if owner == "*" else owner)
        except (LookupError, ValueError, PermissionError) as exc:
            problems.append(str(exc))
            continue
        why = cannot_run(settings.python, user) if user is not None else None
        if user is not None and why:
            problems.append(f"run user {user.name} cannot run FTQ_PYTHON {settings.python} ({why})")
    return list(dict.fromkeys(problems))


def share_run_dir(run_dir: Path, user: RunUser) -> None:
    """Open the run directory to the run's group only (see the module docstring)."""
    os.chown(run_dir, -1, user.gid)
    os.chmod(run_dir, SHARED_RUN_DIR_MODE)
    checkpoints = run_dir / runs.CHECKPOINTS
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        os.chown(checkpoints, -1, user.gid)
        # The group is the run user's own: the trainer saves and rotates its checkpoints here.
        os.chmod(checkpoints, 0o770)  # noqa: S103
    # An uploaded dataset's copy (worker/files.py): the run reads it, and only reads it.
    dataset = run_dir / runs.DATASET_DIR
    if dataset.is_dir() and not dataset.is_symlink():
        os.chown(dataset, -1, user.gid)
        os.chmod(dataset, 0o750)  # noqa: S103  (the group is the run user's own)
        for path in dataset.iterdir():
            if path.is_file() and not path.is_symlink():
                os.chown(path, -1, user.gid)
                os.chmod(path, 0o640)
    for name in (*_RUN_READS, runs.TRAIN_LOG):
        path = run_dir / name
        if path.is_file() and not path.is_symlink():
            os.chown(path, -1, user.gid)
            os.chmod(path, 0o660 if name == runs.TRAIN_LOG else 0o640)


def _write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _create_own(path: Path, text: str) -> bool:
    """Write a new record; False if one is already there (someone else got here first)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def _read_own(path: Path) -> str:
    """A record the worker wrote. A run can write in its run directory: a launch or cancel record it
    planted (a pid to signal, a cancel that never escalates) or a symlink counts as missing."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as f:
        if os.fstat(fd).st_uid != os.geteuid():
            raise FileNotFoundError(f"{path} was not written by the worker")
        return f.read()


def read_launch_record(run_dir: Path) -> LaunchHandle | None:
    try:
        data = json.loads(_read_own(run_dir / runs.LAUNCH_RECORD))
        return LaunchHandle(external_id=None, pid=int(data["pid"]), pid_start_ticks=int(data["start_ticks"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_uid(run_dir: Path) -> int | None:
    """The user this run started as (its launch record), or None when unknown."""
    try:
        uid = json.loads(_read_own(run_dir / runs.LAUNCH_RECORD)).get("uid")
    except (OSError, ValueError, AttributeError):
        return None
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None


def _cwd_matches(pid: int, run_dir: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")) == run_dir
    except OSError:
        return False


# Runs this process started that ended on a nearly full disk without writing their exit status
# (launch.sh could not), by leader pid: the reason their end is read with, since the disk may have room
# again by then. In memory: after a worker restart the run directory is all there is to read.
_ENDED_ON_FULL_DISK: dict[int, str] = {}


def _reap(proc: subprocess.Popen[bytes], on_exit: Callable[[], None] | None, run_dir: Path) -> None:
    # The worker is the run's parent until it exits: wait so the ended run is not left a zombie.
    with contextlib.suppress(Exception):
        proc.wait()
    with contextlib.suppress(Exception):
        if runs.read_exit_status(run_dir) is None:
            nearly = failures.nearly_full(run_dir)
            if nearly is not None:
                import shutil

                _ENDED_ON_FULL_DISK[proc.pid] = failures.disk_full_reason(shutil.disk_usage(run_dir).free)
    if on_exit is not None:
        try:
            on_exit()
        except Exception:
            log.exception("the sweep after run %s ended failed; the periodic one will settle it", proc.pid)


class LocalLauncher:
    name = "local"

    def __init__(self, settings: Settings | None = None, on_exit: Callable[[], None] | None = None):
        self.settings = settings or get_settings()
        # Called in the reaper thread when a run this process started ends: the worker sweeps at once
        # instead of at its next interval, so the job is settled (and the next one started) sooner.
        self.on_exit = on_exit
        for problem in run_user_problems(self.settings):
            # Said once at start, where the operator looks; each launch it stops fails with the same words.
            log.error("%s: the launches this stops will fail", problem)

    # Environment -----------------------------------------------------------------------------------
    def run_env(self, req: LaunchRequest, user: RunUser | None = None) -> dict[str, str]:
        env = launch_environment(self.settings)
        if user is not None:
            # The worker's HOME is not the run user's to write (caches go under it).
            home = user.home if os.path.isdir(user.home) else str(req.run_dir)
            env.update({"HOME": home, "USER": user.name, "LOGNAME": user.name})
        gpus = req.resources.get("gpus")
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        else:
            # A CPU job must not grab a GPU the pool hands to someone else.
            env["CUDA_VISIBLE_DEVICES"] = ""
            slots = max(1, int(req.resources.get("cpu_slots", 1)))
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            # Each CPU slot gets an equal share of the cores, so concurrent jobs do not oversubscribe.
            per_proc = max(1, cpus // max(self.settings.cpu_slots, slots))
            env["OMP_NUM_THREADS"] = str(per_proc)
            env["MKL_NUM_THREADS"] = str(per_proc)
        add_run_environment(env, self.settings, req)
        env["PYTHONUNBUFFERED"] = "1"
        # A cancel's SIGTERM lets the ranks checkpoint at their next step (trainer/preempt.py) until the
        # grace is over; torchrun's agent would SIGKILL them after its own 30 s otherwise.
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(max(30, math.ceil(self.settings.cancel_grace_seconds)))
        env[RUN_MARKER] = req.job_id
        return env

    # Launcher protocol -----------------------------------------------------------------------------
    def submit(self, req: LaunchRequest) -> LaunchHandle:
        """Start `bash launch.sh` in a new session. The caller has written the run directory."""
        run_dir = req.run_dir
        script = run_dir / runs.LAUNCH_SCRIPT
        if not script.is_file():
            raise FileNotFoundError(f"{script} is missing")
        user = run_user(self.settings, req.owner)
        as_user: dict[str, Any] = {"umask": SERVICE_UMASK}
        log_fd = os.open(
            run_dir / runs.TRAIN_LOG,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        with os.fdopen(log_fd, "ab") as logf:
            if user is not None:
                why = cannot_run(self.settings.python, user)
                if why:
                    raise PermissionError(
                        f"run user {user.name} cannot run FTQ_PYTHON {self.settings.python} ({why}): set "
                        "FTQ_PYTHON to an interpreter it may run, with ftq's packages"
                    )
                share_run_dir(run_dir, user)
                # No supplementary groups: the worker's (root's) must not follow the run.
                as_user = {"user": user.uid, "group": user.gid, "extra_groups": [], "umask": RUN_USER_UMASK}
            proc = subprocess.Popen(
                ["bash", str(script)],
                cwd=run_dir,
                env=self.run_env(req, user),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                **as_user,
            )
        threading.Thread(
            target=_reap, args=(proc, self.on_exit, run_dir), name=f"reap-{proc.pid}", daemon=True
        ).start()
        info = read_stat(proc.pid)
        # The process may already have ended (and been reaped); its ticks then no longer matter.
        ticks = info.start_ticks if info is not None else 0
        _write_atomic(
            run_dir / runs.LAUNCH_RECORD,
            json.dumps(
                {
                    "pid": proc.pid,
                    "pgid": proc.pid,
                    "start_ticks": ticks,
                    "started": time.time(),
                    "uid": user.uid if user is not None else os.geteuid(),
                }
            ),
        )
        with open(run_dir / LAUNCHES_LOG, "a") as audit:
            audit.write(f"{time.time():.3f} pid={proc.pid} start_ticks={ticks} by_worker_pid={os.getpid()}\n")
        return LaunchHandle(external_id=None, pid=proc.pid, pid_start_ticks=ticks)

    def find(self, run_dir: Path) -> LaunchHandle | None:
        """A launch already made from this run directory (by a worker that died before recording it)."""
        record = read_launch_record(run_dir)
        if record is not None:
            return record
        if runs.read_exit_status(run_dir) is not None:
            return LaunchHandle(external_id=None, pid=None, pid_start_ticks=None)
        # The start happened but launch.json was not written: find the group by its working directory.
        for p in scan_proc():
            if p.pid == p.pgid and _cwd_matches(p.pid, run_dir):
                return LaunchHandle(external_id=None, pid=p.pid, pid_start_ticks=p.start_ticks)
        return None

    def poll(self, refs: list[RunRef]) -> dict[str, RunState]:
        procs = scan_proc()
        by_pid = {p.pid: p for p in procs}
        groups: dict[int, int] = {}
        for p in procs:
            groups[p.pgid] = groups.get(p.pgid, 0) + 1
        out: dict[str, RunState] = {}
        for ref in refs:
            out[ref.job_id] = self._state(ref, procs, by_pid, groups)
        return out

    def _state(
        self, ref: RunRef, procs: list[ProcInfo], by_pid: dict[int, ProcInfo], groups: dict[int, int]
    ) -> RunState:
        if ref.pid:
            leader = by_pid.get(ref.pid)
            leader_alive = leader is not None and (
                not ref.pid_start_ticks or leader.start_ticks == ref.pid_start_ticks
            )
            # The group outlives its leader while any member is left; Linux does not hand out a pid
            # that is still some group's id, so members with pgid == pid are this run's.
            if leader_alive or groups.get(ref.pid, 0) > 0:
                return RunState(phase=RunPhase.running)
        # Only when the group is gone: ranks in sessions of their own (read environ only then).
        if marked(ref.job_id, procs, run_uid(ref.run_dir)):
            return RunState(phase=RunPhase.running)
        code = runs.read_exit_status(ref.run_dir)
        if code is not None:
            return RunState(phase=RunPhase.exited, exit_code=code)
        if ref.pid and ref.pid in _ENDED_ON_FULL_DISK:
            return RunState(phase=RunPhase.lost, reason=_ENDED_ON_FULL_DISK[ref.pid])
        return RunState(phase=RunPhase.lost, reason="no process and no exit status")

    def cancel(self, run: RunRef) -> None:
        """SIGTERM to the ranks the first time; SIGKILL to everything once the grace period has passed.

        The ranks checkpoint at their next step and exit 0 (trainer/preempt.py), and the launcher above
        them (torch's agent, or accelerate's single-process launch) then ends by itself. Signalled
        too, the agent would stop its ranks on its own clock and end in a page of traceback in
        train.log. The record is written first, with O_EXCL: the cancel task and a reconcile sweep
        may both get here at once, and only one of them sends the signal; the trainer looks for it.
        """
        record = run.run_dir / runs.CANCEL_RECORD
        try:
            sent = float(json.loads(_read_own(record))["term_sent"])
        except FileNotFoundError:
            sent = None
        except (OSError, ValueError, KeyError, TypeError):
            return  # being written by the other caller this very moment
        if sent is None:
            if _create_own(record, json.dumps({"term_sent": time.time()})):
                self._signal_ranks(run, signal.SIGTERM)
            return
        if time.time() - sent >= self.settings.cancel_grace_seconds:
            self._signal_group(run, signal.SIGKILL)

    def kill_leftovers(self, run: RunRef) -> None:
        """After a run ended, SIGKILL what is left of it (stray ranks, dataloader or compile workers)."""
        self._signal_group(run, signal.SIGKILL)

    def _signal_ranks(self, run: RunRef, sig: signal.Signals) -> None:
        """Signal the processes doing the training, not the launch script nor the launcher under it.

        With several processes torch's agent starts each rank in a session of its own (found by the
        run's marker); with one, accelerate runs the trainer as a child in the run's group. Either way
        the launch script (the group leader) and its direct child (the launcher) are left out.

        A run whose ranks have not started yet (the fetch step, accelerate or torch's agent starting up)
        has nothing to checkpoint: its whole group gets the signal at once, rather than nothing until the
        grace period's SIGKILL (a cancel right after the start took 22 s).
        """
        procs = scan_proc()
        if not _group_is_ours(run, procs):
            return
        launchers = {p.pid for p in procs if p.ppid == run.pid} | {run.pid}
        targets = [p.pid for p in procs if p.pgid == run.pid and p.pid not in launchers]
        targets += [pid for pid in marked(run.job_id, procs, run_uid(run.run_dir)) if pid not in launchers]
        if not targets:
            log.info("job %s has no ranks yet: %s to its process group", run.job_id, sig.name)
            self._signal_group(run, sig)
            return
        log.info("sending %s to the ranks of job %s: %s", sig.name, run.job_id, sorted(set(targets)))
        for pid in set(targets):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _signal_group(self, run: RunRef, sig: signal.Signals) -> None:
        """Signal the run's process group and every process carrying its marker (ranks elsewhere)."""
        procs = scan_proc()
        members = set(group_members(run.pid, procs)) if run.pid and _group_is_ours(run, procs) else set()
        if run.pid and members:
            log.info("sending %s to process group %s (job %s)", sig.name, run.pid, run.job_id)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, sig)
        # Once each: torch's elastic agent, given a second SIGTERM while it stops its ranks, ends in a
        # 45-line traceback in train.log instead of its one line.
        for pid in marked(run.job_id, procs, run_uid(run.run_dir)):
            if pid in members:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
