"""The SLURM launcher: each run is one batch job (`sbatch job.sbatch`), watched by squeue, ended by scancel.

Every SLURM command runs as an argv list, never through a shell; `FTQ_SLURM_BIN_DIR` says where the
commands live when they are not on PATH.

How the end of a job is learned, in order, for each run (`poll` looks at all runs at once):
1. `squeue --states=all` (one call for every run): while the controller still holds the job record,
   its state and exit code are the truth. SLURM keeps a finished job for `MinJobAge` (300 s by default).
2. `sacct`, once the job has left squeue, where accounting is configured. With
   `AccountingStorageType=accounting_storage/none` sacct answers "accounting storage is disabled"; the
   launcher notes that once and does not ask again.
3. `run_dir/exit_status`, which job.sbatch writes when its launch ends (an EXIT trap, so also after
   scancel or the time limit's SIGTERM). The run dir is on storage shared by nodes and service, so this
   works with no accounting at all. slurmstepd's own line in train.log (`*** JOB 42 ON node1 CANCELLED
   AT ... DUE TO TIME LIMIT ***`) supplies the reason the exit code cannot.
4. None of these: the run is `lost` (for example a job cancelled while pending, purged from the
   controller, on a cluster without accounting).

A requeued job (preemption or node failure with `--requeue`) keeps its job id and goes back to PENDING;
`poll` reports it pending with `requeued=True`, and job.sbatch resumes it from the newest checkpoint
(`--resume_from_checkpoint latest` when `$SLURM_RESTART_COUNT` > 0).

A job near its time limit gets SLURM's warning (`--signal=B:USR1@<FTQ_SLURM_SIGNAL_GRACE_SECONDS>`),
which job.sbatch passes to the trainer; it checkpoints and exits with `ftq-error: time_limit`, and with
`resources.slurm.requeue_on_timeout` `worker.recovery` queues the job again: a new batch job (a new id)
that resumes from that checkpoint.

Secrets reach the job through the environment of `sbatch` (its default `--export=ALL`), never through
the script, the plan or the store. That environment is `launch_environment`'s allowlist (never the API
tokens, the database or the broker URL). SLURM keeps it in the controller's state directory (owned by
SlurmUser), and in accounting only where `AccountingStoreFlags=job_env` asks it to. The job runs as the
account that submitted it, the worker's: FTQ_RUN_AS_USER is the local launcher's (see "Run isolation"
in docs/operating/security.md for what to set on a cluster).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from ftq.contract import runs
from ftq.runtime.settings import Settings, get_settings
from worker.failures import read_tail
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

# A cancel is repeated after this long if the job is still there (a lost scancel, a restarted controller).
RECANCEL_SECONDS = 30.0
COMMAND_TIMEOUT = 60.0
# Where sbatch finds the cluster when its configuration is not at the default path. The rest of SLURM_*
# stays out of the run's environment (launch_environment's allowlist): a worker that itself runs inside
# an allocation must not hand SLURM_JOB_ID and friends to sbatch, or the new job thinks it is a step of
# the old one.
_SLURM_CLIENT_ENV = ("SLURM_CONF",)


@dataclass(frozen=True)
class StateRule:
    phase: RunPhase
    reason: str | None = None  # what RunState.reason says for an ended job
    requeued: bool = False


# Every job state squeue (`%T`) and sacct print, and what it means for a run. Decisions:
# - SUSPENDED and STOPPED keep their allocation and continue when resumed: running, not ended.
# - REQUEUE_HOLD and SPECIAL_EXIT are requeued jobs held until someone releases them: pending and
#   requeued (they are still SLURM's to run, and a cancel of the ftq job scancels them).
# - RESV_DEL_HOLD waits for a released hold: pending.
# - COMPLETING is an ended batch script whose processes or epilog are still being cleaned up: running,
#   so a job is never reported ended while a process of it is left.
# - REVOKED (a federation sibling started elsewhere) means the job will not run here: ended.
# - A state not in this table (a newer SLURM) counts as running while squeue holds the job; once it
#   leaves squeue, exit_status decides.
SLURM_STATES: dict[str, StateRule] = {
    "PENDING": StateRule(RunPhase.pending),
    "CONFIGURING": StateRule(RunPhase.pending),
    "REQUEUED": StateRule(RunPhase.pending, requeued=True),
    "REQUEUE_FED": StateRule(RunPhase.pending, requeued=True),
    "REQUEUE_HOLD": StateRule(RunPhase.pending, requeued=True),
    "SPECIAL_EXIT": StateRule(RunPhase.pending, requeued=True),
    "RESV_DEL_HOLD": StateRule(RunPhase.pending),
    "RUNNING": StateRule(RunPhase.running),
    "COMPLETING": StateRule(RunPhase.running),
    "SIGNALING": StateRule(RunPhase.running),
    "STAGE_OUT": StateRule(RunPhase.running),
    "RESIZING": StateRule(RunPhase.running),
    "SUSPENDED": StateRule(RunPhase.running),
    "STOPPED": StateRule(RunPhase.running),
    "COMPLETED": StateRule(RunPhase.exited),
    "FAILED": StateRule(RunPhase.exited),
    "CANCELLED": StateRule(RunPhase.exited, "CANCELLED"),
    "TIMEOUT": StateRule(RunPhase.exited, "TIMEOUT"),
    "DEADLINE": StateRule(RunPhase.exited, "DEADLINE"),
    "NODE_FAIL": StateRule(RunPhase.exited, "NODE_FAIL"),
    "BOOT_FAIL": StateRule(RunPhase.exited, "BOOT_FAIL"),
    "PREEMPTED": StateRule(RunPhase.exited, "PREEMPTED"),
    "OUT_OF_MEMORY": StateRule(RunPhase.exited, "OUT_OF_MEMORY"),
    "REVOKED": StateRule(RunPhase.exited, "REVOKED"),
}
_UNKNOWN_STATE = StateRule(RunPhase.running)

# slurmstepd writes this into the job's output when it stops a job; "DUE TO ..." names why.
_STEPD_KILL = re.compile(r"\*\*\* JOB (\d+) ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
_STEPD_REASONS = {
    "TIME LIMIT": "TIMEOUT",
    "PREEMPTION": "PREEMPTED",
    "NODE FAILURE": "NODE_FAIL",
    "JOB REQUEUE": None,  # an earlier attempt of a requeued job, not the end of this one
}


def state_from_slurm(
    state: str, *, exit_code: int | None = None, signal: int | None = None, restarts: int = 0
) -> RunState:
    """A SLURM job state (`CANCELLED by 0` as sacct prints it is fine) as a RunState.

    `exit_code`/`signal` are the job's; a job killed by a signal reports exit code 128 + signal, as a
    shell would.
    """
    word = state.split()[0].rstrip("+").upper() if state.strip() else ""
    rule = SLURM_STATES.get(word)
    if rule is None:
        log.warning("unknown SLURM job state %r: treating it as running", state)
        rule = _UNKNOWN_STATE
    if rule.phase != RunPhase.exited:
        return RunState(phase=rule.phase, requeued=rule.requeued or restarts > 0)
    code: int | None
    if word == "COMPLETED":
        code = 0
    elif signal:
        code = 128 + signal
    else:
        code = exit_code
    return RunState(phase=RunPhase.exited, exit_code=code, signal=signal or None, reason=rule.reason)


def decode_wait_status(raw: str) -> tuple[int | None, int | None]:
    """squeue's `exit_code` is the batch script's wait status: (exit code, signal)."""
    try:
        status = int(raw)
    except ValueError:
        return None, None
    sig = status & 0x7F
    if sig:
        return None, sig
    return (status >> 8) & 0xFF, None


def slurm_time(value: str) -> float | None:
    """A SLURM timestamp (`2026-12-01T13:50:00`, the controller's local time) as unix time; None for
    `N/A`, `Unknown`, `None` or anything else."""
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def parse_squeue(text: str) -> dict[str, RunState]:
    """Lines of `JobID|State|Reason|exit_code|RestartCnt|StartTime|EndTime|` as RunStates by job id (the
    last two optional). A pending job carries SLURM's reason and its expected start; a started one its
    start (and end, once ended)."""
    out: dict[str, RunState] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5 or not fields[0]:
            continue
        job_id, state, reason, raw_status, restarts = fields[:5]
        start = slurm_time(fields[5]) if len(fields) > 5 else None
        end = slurm_time(fields[6]) if len(fields) > 6 else None
        code, sig = decode_wait_status(raw_status)
        try:
            restart_cnt = int(restarts)
        except ValueError:
            restart_cnt = 0
        run = state_from_slurm(state, exit_code=code, signal=sig, restarts=restart_cnt)
        if run.phase == RunPhase.pending:
            run = replace(
                run, pending_reason=reason if reason not in ("", "None") else None, expected_start=start
            )
        else:
            run = replace(run, started_at=start, ended_at=end if run.phase == RunPhase.exited else None)
        out[job_id] = run
    return out


def parse_sacct(text: str) -> dict[str, RunState]:
    """`sacct --parsable2 --noheader --allocations --format=JobIDRaw,State,ExitCode,Start,End` lines (the
    last two optional: the run's start and end by SLURM's clock).

    ExitCode is `code:signal`.
    """
    out: dict[str, RunState] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        code_s, _, sig_s = fields[2].partition(":")
        code = int(code_s) if code_s.isdigit() else None
        sig = int(sig_s) if sig_s.isdigit() and int(sig_s) else None
        run = state_from_slurm(fields[1], exit_code=code, signal=sig)
        if len(fields) >= 5:
            run = replace(run, started_at=slurm_time(fields[3]), ended_at=slurm_time(fields[4]))
        out[fields[0]] = run
    return out


def reason_from_log(log_tail: str, external_id: str | None) -> str | None:
    """Why slurmstepd stopped this job, from its last `*** JOB n ... CANCELLED ... ***` line in train.log."""
    found: str | None = None
    for m in _STEPD_KILL.finditer(log_tail):
        if external_id and m.group(1) != external_id:
            continue
        due = m.group(2)
        found = "CANCELLED" if due is None else _STEPD_REASONS.get(due, due.replace(" ", "_"))
    return found


class SlurmError(RuntimeError):
    """A SLURM command failed in a way that says nothing about the job (controller down, bad config)."""


class SlurmLauncher:
    name = "slurm"

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or get_settings()
        if self.settings.run_users:
            log.warning(
                "FTQ_RUN_AS_USER applies to local runs: SLURM jobs run as the account that submits them "
                "(this worker's); see Run isolation in docs/operating/security.md"
            )
        # None: not asked yet; False: this cluster keeps no accounting (sacct is skipped from then on).
        self._sacct_ok: bool | None = None

    # Commands ------------------------------------------------------------------------------------------
    def bin(self, name: str) -> str:
        d = self.settings.slurm_bin_dir
        return str(Path(d) / name) if d else name

    def _run(
        self, argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                stdin=subprocess.DEVNULL,
                check=False,
                # sbatch hands its umask to the job (SLURM_UMASK): train.log and what the run writes
                # are then the submitting account's alone.
                umask=0o077,
            )
        except FileNotFoundError as exc:
            raise SlurmError(
                f"{argv[0]} not found: install SLURM's client commands or set FTQ_SLURM_BIN_DIR"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT:.0f}s") from exc

    # Environment ----------------------------------------------------------------------------------------
    def run_env(self, req: LaunchRequest) -> dict[str, str]:
        env = launch_environment(self.settings)
        env.update({k: os.environ[k] for k in _SLURM_CLIENT_ENV if k in os.environ})
        # SLURM hands out GPUs (--gres) and sets CUDA_VISIBLE_DEVICES per node; the worker's own
        # value is for this host only.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if req.on_cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        add_run_environment(env, self.settings, req)
        if self.settings.slurm_bin_dir:
            # srun and scontrol inside the batch script come from the same place as sbatch.
            env["PATH"] = self.settings.slurm_bin_dir + os.pathsep + env.get("PATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env["FTQ_JOB_ID"] = req.job_id
        return env

    # Launcher protocol ----------------------------------------------------------------------------------
    def submit(self, req: LaunchRequest) -> LaunchHandle:
        """`sbatch --parsable job.sbatch` from the run directory; the job id is the handle."""
        script_text = req.plan.sbatch_script
        if not script_text:
            raise ValueError("the plan has no sbatch_script (rendered without resources.launcher: slurm?)")
        run_dir = req.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        script = run_dir / runs.SBATCH_SCRIPT
        if not script.is_file() or script.read_text() != script_text:
            tmp = run_dir / f".{runs.SBATCH_SCRIPT}.tmp"
            tmp.write_text(script_text)
            tmp.chmod(0o700)
            tmp.replace(script)
        proc = self._run([self.bin("sbatch"), "--parsable", str(script)], cwd=run_dir, env=self.run_env(req))
        m = re.match(r"\s*(\d+)", proc.stdout)
        if proc.returncode != 0 or m is None:
            detail = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
            raise SlurmError(f"sbatch refused the job: {detail}")
        job_id = m.group(1)
        # Written after the fact so a worker that dies here leaves a trail `find` follows.
        record = run_dir / runs.LAUNCH_RECORD
        tmp = run_dir / f".{runs.LAUNCH_RECORD}.tmp"
        tmp.write_text(json.dumps({"external_id": job_id, "submitted": time.time()}))
        tmp.replace(record)
        log.info("job %s submitted to SLURM as %s", req.job_id, job_id)
        return LaunchHandle(external_id=job_id)

    def find(self, run_dir: Path) -> LaunchHandle | None:
        """A batch job submitted earlier for this run directory, by a worker that did not record it."""
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            job_id = str(json.loads((run_dir / runs.LAUNCH_RECORD).read_text())["external_id"])
            if job_id.isdigit():
                return LaunchHandle(external_id=job_id)
        # The record may not have been written: look for the job by its name (job.sbatch names it).
        proc = self._run([self.bin("squeue"), "--noheader", "--name", f"ftq-{run_dir.name}", "--format=%i"])
        if proc.returncode != 0:
            raise SlurmError(f"squeue failed: {proc.stderr.strip()}")
        ids = [int(x) for x in proc.stdout.split() if x.isdigit()]
        return LaunchHandle(external_id=str(max(ids))) if ids else None

    def poll(self, refs: list[RunRef]) -> dict[str, RunState]:
        ids = sorted({r.external_id for r in refs if r.external_id and r.external_id.isdigit()}, key=int)
        known = self._squeue(ids) if ids else {}
        missing = [i for i in ids if i not in known]
        if missing:
            known.update(self._sacct(missing))
        out: dict[str, RunState] = {}
        for ref in refs:
            state = known.get(ref.external_id) if ref.external_id else None
            out[ref.job_id] = state if state is not None else self._from_run_dir(ref)
        return out

    def kill_leftovers(self, run: RunRef) -> None:
        """Nothing to do: SLURM ends every process of a job's steps when the job ends (proctrack)."""

    def cancel(self, run: RunRef) -> None:
        """`scancel <id>`: SLURM sends SIGTERM to every step and the script, SIGKILL after KillWait.

        Reconcile calls this on every sweep until the job has ended; SLURM needs to be told once, so a
        repeat within RECANCEL_SECONDS (recorded in run_dir/cancel.json) asks nothing of the controller.
        """
        if not run.external_id:
            return
        record = run.run_dir / runs.CANCEL_RECORD
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            sent = json.loads(record.read_text())
            recent = time.time() - float(sent["sent"]) < RECANCEL_SECONDS
            if sent["external_id"] == run.external_id and recent:
                return
        proc = self._run([self.bin("scancel"), run.external_id])
        err = proc.stderr.strip()
        if proc.returncode != 0 and not re.search(r"already completing|completed|Invalid job id", err):
            raise SlurmError(f"scancel {run.external_id} failed: {err}")
        with contextlib.suppress(OSError):
            tmp = run.run_dir / f".{runs.CANCEL_RECORD}.tmp"
            tmp.write_text(json.dumps({"external_id": run.external_id, "sent": time.time()}))
            tmp.replace(record)

    # Sources of truth -----------------------------------------------------------------------------------
    def _squeue(self, ids: list[str]) -> dict[str, RunState]:
        proc = self._run(
            [
                self.bin("squeue"),
                "--noheader",
                "--states=all",
                f"--jobs={','.join(ids)}",
                "--Format=JobID:|,State:|,Reason:|,exit_code:|,RestartCnt:|,StartTime:|,EndTime:|",
            ]
        )
        if proc.returncode != 0:
            # Asked about one id only, squeue fails when the job record is gone (with several it
            # leaves unknown ids out): that is an answer, not an error.
            if "Invalid job id" in proc.stderr:
                return {}
            raise SlurmError(f"squeue failed: {proc.stderr.strip()}")
        return parse_squeue(proc.stdout)

    def _sacct(self, ids: list[str]) -> dict[str, RunState]:
        if self._sacct_ok is False:
            return {}
        try:
            proc = self._run(
                [
                    self.bin("sacct"),
                    "--noheader",
                    "--parsable2",
                    "--allocations",
                    f"--jobs={','.join(ids)}",
                    "--format=JobIDRaw,State,ExitCode,Start,End",
                ]
            )
        except SlurmError:
            self._sacct_ok = False
            return {}
        if proc.returncode != 0:
            if "accounting storage is disabled" in proc.stderr or "not found" in proc.stderr:
                log.info("SLURM accounting is not configured: job ends are read from exit_status files")
                self._sacct_ok = False
            else:
                log.warning("sacct failed: %s", proc.stderr.strip())
            return {}
        self._sacct_ok = True
        return parse_sacct(proc.stdout)

    def _from_run_dir(self, ref: RunRef) -> RunState:
        code = runs.read_exit_status(ref.run_dir)
        if code is None:
            return RunState(phase=RunPhase.lost, reason="not in squeue, no accounting record, no exit status")
        reason = None
        if code != 0:
            reason = reason_from_log(read_tail(ref.run_dir / runs.TRAIN_LOG), ref.external_id)
        return RunState(phase=RunPhase.exited, exit_code=code, reason=reason)
