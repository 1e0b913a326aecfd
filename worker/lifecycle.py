"""The lifecycle of a launched run, one for every kind: a job's run (`worker.controller`) and a side run
(`worker.side_runs`: an export, an evaluation). Launch it or adopt the launch a dead worker left, cancel
it, settle a claim whose worker died mid-launch, bring it in line with what its launcher reports, and
record how it ended.

What differs between the kinds is a `Kind`: how to read its row, its table's transitions (one
`ftq.store.transitions.RunTable` each), what it asks of the scheduler, what its launch request is, and its
own steps (a job's retries, time limit, ingest before the end, the cancel line in train.log and SLURM's
pending reason; an export's request file and Hub token). Everything here is safe to run twice or
concurrently: the store's compare-and-set transitions decide who acts, the run lock keeps two launches of
one run from both starting, and what a launch left behind (the run's folder, /proc, the scheduler) is
looked at before anything new is started.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.status import JobStatus
from ftq.runtime import logs
from ftq.store.db import session_scope
from ftq.store.models import Deployment, Evaluation, Export, Job, TrainingClient
from ftq.store.transitions import RunTable
from worker import locks, recovery
from worker.failures import Failure
from worker.launchers.base import Launcher, LaunchHandle, LaunchRequest, RunPhase, RunRef, RunState
from worker.scheduling import Running, RunRequest

log = logging.getLogger(__name__)

# A `starting` row younger than this may be between its claim and its launch: leave it alone.
STARTING_GRACE_SECONDS = 15.0

LauncherFor = Callable[[str], Launcher]


RunRow = Job | Export | Evaluation | Deployment | TrainingClient  # a row of any kind of run


@dataclass(frozen=True)
class RunView:
    """What a sweep needs of a row (a job or an export), read once so no session is held across launcher
    calls. `run_dir` is the folder the launch runs in: a job's run directory, an export's folder."""

    id: str
    status: str
    launcher: str
    external_id: str | None
    pid: int | None
    pid_start_ticks: int | None
    updated_at: datetime
    run_dir: Path

    @classmethod
    def of(cls, row: RunRow, *, launcher: str, run_dir: Path, **more: Any) -> Self:
        """The view of a row, with what the row does not hold itself (and a subclass's `more`)."""
        handle = (row.external_id, row.pid, row.pid_start_ticks)
        return cls(row.id, row.status, launcher, *handle, row.updated_at, run_dir, **more)

    @property
    def launched(self) -> bool:
        return bool(self.pid or self.external_id)

    def handle(self) -> LaunchHandle:
        return LaunchHandle(self.external_id, self.pid, self.pid_start_ticks)

    def ref(self) -> RunRef:
        return RunRef(self.id, self.run_dir, self.external_id, self.pid, self.pid_start_ticks)


@dataclass(frozen=True)
class End:
    """How a row ends: its terminal status, its error, and the run's own end where it ran."""

    status: JobStatus
    error_code: str | None = None
    error_message: str | None = None
    run: RunState | None = None

    def record(self, session: Session, transitions: RunTable, row_id: str) -> bool:
        """Move the row to its end: the error, the run's exit code, and its own start and end where its
        scheduler knows them (SLURM; else the launch and now)."""
        run = self.run
        return transitions.mark_finished(
            session,
            row_id,
            self.status,
            error_code=self.error_code,
            error_message=self.error_message,
            exit_code=run.exit_code if run is not None else None,
            run_started=utc(run.started_at) if run is not None else None,
            run_ended=utc(run.ended_at) if run is not None else None,
        )


def utc(ts: float | None) -> datetime | None:
    """A unix time as a datetime (None for none)."""
    return datetime.fromtimestamp(ts, UTC) if ts else None


# Why a claim goes back to the queue when its worker stopped before launching it (a job's retried event).
NEVER_LAUNCHED = "claimed but never launched (its worker stopped)"
CANCELLED_BEFORE_START = End(JobStatus.cancelled, ErrorCode.cancelled, "cancelled before it started")


class Refused(Exception):
    """A launch refused for a reason the user can act on: the row fails with `code` and this message,
    without a traceback in the worker's log."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


Row = TypeVar("Row")  # the stored row(s) one launch request is made from
View = TypeVar("View", bound=RunView)


class Kind(Protocol[Row, View]):
    """How the lifecycle reads, moves and schedules one kind of run, and that kind's own steps."""

    name: str  # its `worker.scheduling` kind: "job", "export"
    run_noun: str  # what could not be started: "run" or "export"
    transitions: RunTable  # its table's compare-and-set transitions

    def label(self, v: View) -> str:
        """The row in a log line: `job j_1`, `export exp_1 of job j_1`."""
        ...

    def job_id(self, v: View) -> str:
        """The job the row is about: every log record about it carries this id (`ftq.runtime.logs`)."""
        ...

    def read(self, session: Session, row_id: str) -> tuple[Row, View] | None: ...

    def prepare(self, session: Session, v: View) -> bool:
        """Before the run lock: make the folder ready, or record why it cannot be (False)."""
        ...

    def request(self, row: Row, v: View) -> LaunchRequest:
        """Write the folder's files for this attempt and say what to launch; `Refused` to fail it."""
        ...

    def queued(self, session: Session) -> list[RunRequest]:
        """Its queued rows, as the scheduler weighs them."""
        ...

    def holding(self, session: Session) -> list[Running]:
        """Its rows that hold local devices now."""
        ...

    def while_running(self, v: View, launcher: Launcher, state: RunState) -> None:
        """Each sweep while the launcher reports the run pending or running."""
        ...

    def before_end(self, v: View) -> None:
        """The run has ended; before its status is recorded."""
        ...

    def stopped_by_worker(self, v: View) -> Failure | None:
        """The failure the worker itself made the run end with (whatever its exit code), if any."""
        ...

    def retried(self, session: Session, row: Row, v: View, failure: Failure) -> bool:
        """Queue the row again after this failure instead of failing it; True when it was."""
        ...

    def after_cancelled(self, row: Row, v: View) -> None:
        """The row has just been recorded cancelled after its run ended."""
        ...

    def held(self, session: Session, row: Row, v: View, state: RunState) -> bool:
        """The run ended after a pause was asked of it: record the row paused (True), unless the run got to
        its end first (False: it ends as any run does)."""
        ...


def age(ts: datetime) -> float:
    ts = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    return (datetime.now(UTC) - ts).total_seconds()


def write_attempt_files(folder: Path, files: dict[str, str]) -> None:
    """Write one attempt's files into a run's folder, owner-only (the scripts executable), each in
    place at once; then drop the records a previous attempt that never started left (its launch record,
    exit status), which must not be read as this attempt's."""
    for name, text in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        # Created owner-only (not chmod after writing): no moment in which another account may open it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp.chmod(0o700 if name in (runs.LAUNCH_SCRIPT, runs.SBATCH_SCRIPT) else 0o600)
        tmp.replace(folder / name)
    for stale in runs.ATTEMPT_RECORDS:
        (folder / stale).unlink(missing_ok=True)


# Launch ---------------------------------------------------------------------------------------------------


def _launchable(v: RunView) -> bool:
    return v.status in (JobStatus.starting, JobStatus.cancelling)


def launch(kind: Kind[Row, View], row_id: str, launcher_for: LauncherFor) -> None:
    """Start the run of a `starting` row, or adopt the one a previous attempt already started."""
    with session_scope() as session:
        found = kind.read(session, row_id)
        if found is None or not _launchable(found[1]) or not kind.prepare(session, found[1]):
            return
        run_dir, job_id = found[1].run_dir, kind.job_id(found[1])
    with logs.job_context(job_id), locks.run_lock(run_dir), session_scope() as session:
        found = kind.read(session, row_id)  # again, under the lock: the truth now
        if found is None or not _launchable(found[1]):
            return
        row, v = found
        launcher = launcher_for(v.launcher)
        handle = v.handle() if v.launched else launcher.find(v.run_dir)
        if handle is None:
            if v.status == JobStatus.cancelling:
                CANCELLED_BEFORE_START.record(session, kind.transitions, row_id)
                return
            try:
                handle = launcher.submit(kind.request(row, v))
            except Refused as exc:
                End(JobStatus.failed, exc.code, str(exc)).record(session, kind.transitions, row_id)
                return
            except Exception as exc:
                log.exception("launch of %s failed", kind.label(v))
                why = f"the {kind.run_noun} could not be started: {exc}"[:2000]
                End(JobStatus.failed, ErrorCode.launch_error, why).record(session, kind.transitions, row_id)
                return
            log.info("%s launched: %s", kind.label(v), handle)
        else:
            log.info("%s: adopting the launch found in its run directory: %s", kind.label(v), handle)
        kind.transitions.record_launch(session, row_id, **asdict(handle))
        # Commit the handle before anything else can fail: it is what makes the run adoptable.
        session.commit()
        kind.transitions.mark_running(session, row_id, **asdict(handle))
        session.commit()
        found = kind.read(session, row_id)
        if found is not None and found[1].status == JobStatus.cancelling:
            # A cancel came in while the launch was under way: act on it now.
            launcher.cancel(found[1].ref())


# Cancel ---------------------------------------------------------------------------------------------------


def cancel(kind: Kind[Row, View], row_id: str, launcher_for: LauncherFor) -> None:
    """SIGTERM (or scancel) a `cancelling` row's run now; the sweep escalates and records the end. One
    not launched yet is settled at once, unless its launch is under way (that launch sees `cancelling`
    and cancels what it started)."""
    with session_scope() as session:
        found = kind.read(session, row_id)
        if found is None or found[1].status != JobStatus.cancelling:
            return
        v = found[1]
    launcher = launcher_for(v.launcher)
    with logs.job_context(kind.job_id(v)):
        if v.launched:
            launcher.cancel(v.ref())
            return
        settle_unlaunched(kind, v, launcher)


# Reconcile ------------------------------------------------------------------------------------------------


def sweep(
    views: Iterable[View],
    launcher_for: LauncherFor,
    settle: Callable[[View, Launcher, RunState | None], None],
    noun: str,
) -> None:
    """One sweep over runs: each launcher polled once for all of its runs, then each run settled with
    what its poll said. A failure is logged and left to the next sweep: one launcher that cannot be
    reached, or one run that cannot be settled, must not stop the others."""
    by_launcher: dict[str, list[View]] = {}
    for v in views:
        by_launcher.setdefault(v.launcher, []).append(v)
    for name, group in by_launcher.items():
        try:
            launcher = launcher_for(name)
            states = launcher.poll([v.ref() for v in group if v.launched])
        except Exception:
            log.exception("polling the %s launcher for %ss failed; trying again next sweep", name, noun)
            continue
        for v in group:
            try:
                settle(v, launcher, states.get(v.id))
            except Exception:
                log.exception("reconciling %s %s failed; trying again next sweep", noun, v.id)


def reconcile_one(kind: Kind[Row, View], v: View, launcher: Launcher, state: RunState | None) -> None:
    """Bring one row in line with what its launcher reported (`state`: None when it was not polled)."""
    with logs.job_context(kind.job_id(v)):
        _reconcile_one(kind, v, launcher, state)


def _reconcile_one(kind: Kind[Row, View], v: View, launcher: Launcher, state: RunState | None) -> None:
    if not v.launched:
        if v.status == JobStatus.starting and age(v.updated_at) < STARTING_GRACE_SECONDS:
            return
        settle_unlaunched(kind, v, launcher)
        return
    if state is None:
        return
    if state.phase in (RunPhase.pending, RunPhase.running):
        if v.status == JobStatus.starting:
            with session_scope() as session:
                kind.transitions.mark_running(session, v.id, **asdict(v.handle()))
        elif v.status == JobStatus.cancelling:
            launcher.cancel(v.ref())
        kind.while_running(v, launcher, state)
        return
    finish(kind, v, launcher, state)


def settle_unlaunched(kind: Kind[Row, View], v: View, launcher: Launcher) -> None:
    """A `starting`/`cancelling` row with no launch recorded: its worker died mid-launch, or it is slow.
    Adopt what it launched, finish what already ended, cancel what was cancelled, queue again the rest."""
    with locks.try_run_lock(v.run_dir) as free:
        if not free:
            return  # a launch is in progress right now
        # Nothing was launched from a folder that was never made (nor is worth a scheduler query).
        handle = launcher.find(v.run_dir) if v.run_dir.is_dir() else None
        if handle is not None and not (handle.pid or handle.external_id):
            # Only an exit status is left: the run started and has already ended.
            state = launcher.poll([RunRef(v.id, v.run_dir, None, None, None)]).get(v.id)
            if state is not None and state.phase in (RunPhase.exited, RunPhase.lost):
                finish(kind, v, launcher, state)
            return
        with session_scope() as session:
            if handle is not None:
                log.info("%s: adopting a launch its worker did not record: %s", kind.label(v), handle)
                kind.transitions.record_launch(session, v.id, **asdict(handle))
                kind.transitions.mark_running(session, v.id, **asdict(handle))
            elif v.status == JobStatus.cancelling:
                CANCELLED_BEFORE_START.record(session, kind.transitions, v.id)
            elif kind.transitions.requeue(session, v.id, reason=NEVER_LAUNCHED):
                log.info("%s was %s; queued again", kind.label(v), NEVER_LAUNCHED)


def finish(kind: Kind[Row, View], v: View, launcher: Launcher, state: RunState) -> None:
    """The run has ended: record how (or, for a failure the kind retries, queue it again)."""
    with logs.job_context(kind.job_id(v)):
        _finish(kind, v, launcher, state)


def _finish(kind: Kind[Row, View], v: View, launcher: Launcher, state: RunState) -> None:
    kind.before_end(v)
    launcher.kill_leftovers(v.ref())
    with session_scope() as session:
        found = kind.read(session, v.id)
        if found is None:
            return
        row, current = found
        stopped = kind.stopped_by_worker(v)
        if current.status == JobStatus.cancelling:
            cancelled = End(JobStatus.cancelled, ErrorCode.cancelled, "cancelled on request", state)
            cancelled.record(session, kind.transitions, v.id)
            kind.after_cancelled(row, v)
        elif current.status in (JobStatus.starting, JobStatus.running) and kind.held(session, row, v, state):
            pass  # a pause stopped the run: the row is now paused, to be resumed
        elif stopped is None and state.phase == RunPhase.exited and state.exit_code == 0 and not state.reason:
            End(JobStatus.succeeded, run=state).record(session, kind.transitions, v.id)
        elif current.status in (JobStatus.starting, JobStatus.running):
            failure = stopped or recovery.why_it_failed(v.run_dir, state)
            if stopped is None and kind.retried(session, row, v, failure):
                return
            failed = End(JobStatus.failed, failure.code, failure.message, state)
            failed.record(session, kind.transitions, v.id)
    log.info("%s ended: %s", kind.label(v), state)
