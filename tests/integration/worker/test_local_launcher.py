"""The local launcher driving real processes (a stand-in launch.sh in a session of its own, no training):
start, poll, exit status, cancel with escalation, and adopting a launch whose record was never written;
then one real training run, which a cancel stops with a checkpoint."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ftq.contract import runs
from ftq.contract.spec import JobSpec
from ftq.planning.render import render_plan
from ftq.runtime.settings import Settings
from tests.harness import tiny_spec
from tests.harness.launching import launch_request
from trainer.callbacks import read_points
from worker.launchers.base import LaunchRequest, RunPhase, RunRef
from worker.launchers.local import LocalLauncher, group_members, marked, read_stat

STAND_IN = """#!/usr/bin/env bash
# A stand-in launch.sh shaped like the real one: a launcher (as torch's agent is) whose child, the rank,
# runs in a session of its own; the launcher notes a SIGTERM it gets, and ends when the rank does.
set -u
cat > rank.py <<'PY'
import signal, sys, time
{child}
open('rank_ready', 'w').close()
time.sleep(300)
PY
python3 -c "
import signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: open('launcher_got_sigterm', 'w').close())
rc = subprocess.call([sys.executable, 'rank.py'], start_new_session=True)
sys.exit(128 - rc if rc < 0 else rc)
"
printf '%s\\n' "$?" > exit_status
"""


def _request(tmp_path: Path, job_id: str, script: str) -> LaunchRequest:
    run_dir = tmp_path / job_id
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text(script)
    return launch_request(job_id, run_dir, resources={"cpu_slots": 1})


def _wait(pred: Callable[[], object], timeout: float = 15) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _started_stand_in(launcher: LocalLauncher, tmp_path: Path, job_id: str, child: str) -> RunRef:
    """The stand-in launched with `child` run first in its rank, once the rank is up."""
    req = _request(tmp_path, job_id, STAND_IN.format(child=child))
    handle = launcher.submit(req)
    ref = RunRef(job_id, req.run_dir, None, handle.pid, handle.pid_start_ticks)
    assert _wait(lambda: (req.run_dir / "rank_ready").exists())
    return ref


def test_local_launcher_runs_polls_and_reads_the_exit_status(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cpu_slots=2, pass_env="FTQ_RT_SECRET"))
    os.environ["FTQ_RT_SECRET"] = "s3cret"
    try:
        req = _request(
            tmp_path,
            "job_ok",
            'echo "omp=$OMP_NUM_THREADS cuda=[$CUDA_VISIBLE_DEVICES] '
            'secret=$FTQ_RT_SECRET"\nprintf "0\\n" > exit_status\n',
        )
        handle = launcher.submit(req)
    finally:
        del os.environ["FTQ_RT_SECRET"]
    assert handle.pid and handle.pid_start_ticks is not None
    ref = RunRef("job_ok", req.run_dir, None, handle.pid, handle.pid_start_ticks)
    assert _wait(lambda: launcher.poll([ref])["job_ok"].phase == RunPhase.exited)
    assert launcher.poll([ref])["job_ok"].exit_code == 0
    log = (req.run_dir / "train.log").read_text()
    assert "cuda=[]" in log and "secret=s3cret" in log and "omp=" in log
    # The worker reaps its children: no zombie is left behind.
    assert _wait(lambda: read_stat(handle.pid) is None)  # type: ignore[arg-type]
    # A pid reused by another process (different start ticks) is not taken for the run.
    stale = RunRef("job_ok", req.run_dir, None, os.getpid(), 1)
    assert launcher.poll([stale])["job_ok"].phase == RunPhase.exited
    # launch.json lets a restarted worker find the launch again.
    assert launcher.find(req.run_dir) == handle


def test_no_exit_status_and_no_process_is_lost(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path))
    ref = RunRef("gone", tmp_path, None, 2**22 + 17, 5)
    assert launcher.poll([ref])["gone"].phase == RunPhase.lost


def test_cancel_terms_the_ranks_and_leaves_the_launcher_to_end_by_itself(tmp_path: Path) -> None:
    # Signalled too, torch's agent would end in a page of traceback in train.log.
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cancel_grace_seconds=30))
    ref = _started_stand_in(launcher, tmp_path, "job_term", "pass")
    launcher.cancel(ref)
    assert _wait(lambda: launcher.poll([ref])["job_term"].phase != RunPhase.running)
    assert marked("job_term") == [] and group_members(ref.pid) == []  # type: ignore[arg-type]
    assert not (ref.run_dir / "launcher_got_sigterm").exists()
    assert (ref.run_dir / "exit_status").read_text().strip() == "143"  # the rank's SIGTERM, passed up


def test_a_cancel_from_two_callers_at_once_sends_one_sigterm(tmp_path: Path) -> None:
    # The cancel task and a reconcile sweep can both act on one cancelling job in the same moment.
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cancel_grace_seconds=30))
    count = "signal.signal(signal.SIGTERM, lambda *_: open('terms', 'a').write('x'))"
    ref = _started_stand_in(launcher, tmp_path, "job_twice", count)
    callers = [threading.Thread(target=launcher.cancel, args=(ref,)) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    try:
        assert _wait(lambda: (ref.run_dir / "terms").exists())
        time.sleep(0.5)
        assert (ref.run_dir / "terms").read_text() == "x"
    finally:
        launcher.kill_leftovers(ref)


def test_cancel_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cancel_grace_seconds=1))
    # This run's rank ignores SIGTERM.
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    ref = _started_stand_in(launcher, tmp_path, "job_stubborn", ignore)
    launcher.cancel(ref)
    time.sleep(0.5)
    launcher.cancel(ref)  # within the grace period: nothing more yet
    assert launcher.poll([ref])["job_stubborn"].phase == RunPhase.running
    assert json.loads((ref.run_dir / "cancel.json").read_text())["term_sent"] > 0
    time.sleep(0.8)
    launcher.cancel(ref)  # past it: SIGKILL to everything of the run
    assert _wait(lambda: launcher.poll([ref])["job_stubborn"].phase != RunPhase.running)
    assert marked("job_stubborn") == []


def test_a_cancel_before_the_ranks_start_signals_the_group_at_once(tmp_path: Path) -> None:
    # The launcher is still starting (or the fetch step runs): no rank to SIGTERM, and nothing to save.
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cancel_grace_seconds=60))
    script = (
        "python3 -c \"import time; open('launcher_up', 'w').close(); time.sleep(300)\"\n"
        'printf "%s\\n" "$?" > exit_status\n'
    )
    req = _request(tmp_path, "job_early", script)
    handle = launcher.submit(req)
    ref = RunRef("job_early", req.run_dir, None, handle.pid, handle.pid_start_ticks)
    assert _wait(lambda: (req.run_dir / "launcher_up").exists())
    cancelled = time.monotonic()
    launcher.cancel(ref)
    # Before, SIGTERM went to no process, and only a call after the grace (60 s here) ended the run.
    assert _wait(lambda: launcher.poll([ref])["job_early"].phase != RunPhase.running, timeout=5)
    assert time.monotonic() - cancelled < 5
    assert group_members(ref.pid) == []  # type: ignore[arg-type]


def test_find_adopts_a_launch_whose_record_was_never_written(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path))
    req = _request(tmp_path, "job_orphan", STAND_IN.format(child="pass"))
    handle = launcher.submit(req)
    (req.run_dir / "launch.json").unlink()  # as if the worker died right after the start
    found = launcher.find(req.run_dir)
    assert found is not None and found.pid == handle.pid and found.pid_start_ticks == handle.pid_start_ticks
    launcher.kill_leftovers(RunRef("job_orphan", req.run_dir, None, handle.pid, handle.pid_start_ticks))
    assert _wait(lambda: marked("job_orphan") == [])


@pytest.mark.slow
def test_a_cancelled_training_run_saves_a_checkpoint_within_the_grace(tiny_dir: Path, tmp_path: Path) -> None:
    """A real two-process run under the rendered launch.sh: the cancel's SIGTERM to the ranks (in their
    own sessions) makes them checkpoint after their current step and exit, long before the grace would
    have the launcher SIGKILL them."""
    settings = Settings(data_dir=tmp_path, cancel_grace_seconds=120, python=sys.executable)
    launcher = LocalLauncher(settings)
    # Cancelled right after its start, before any rank is up: the run ends within seconds, not after the
    # grace period's SIGKILL (issue 50: 22 s, the SIGTERM having gone to no rank).
    early = _real_launch(launcher, settings, tiny_dir, "job_early")
    try:
        launcher.cancel(early)
        cancelled = time.time()
        assert _wait(lambda: launcher.poll([early])["job_early"].phase != RunPhase.running, timeout=10)
        assert time.time() - cancelled < 10
        assert marked("job_early") == [] and group_members(early.pid) == []  # type: ignore[arg-type]
    finally:
        launcher.kill_leftovers(early)

    ref = _real_launch(launcher, settings, tiny_dir, "job_cancel")
    run_dir = ref.run_dir
    try:
        assert _wait(lambda: len(read_points(run_dir / runs.METRICS)) >= 3, timeout=240), (
            run_dir / runs.TRAIN_LOG
        ).read_text()[-3000:]
        launcher.cancel(ref)  # SIGTERM; the launcher would SIGKILL only on a call after the grace
        cancelled = time.time()
        assert _wait(lambda: launcher.poll([ref])["job_cancel"].phase == RunPhase.exited, timeout=100)
        assert time.time() - cancelled < settings.cancel_grace_seconds
    finally:
        launcher.kill_leftovers(ref)
    log = (run_dir / runs.TRAIN_LOG).read_text()
    stopped_at = read_points(run_dir / runs.METRICS)[-1]["step"]
    assert [(c.step, c.resumable) for c in runs.list_checkpoints(run_dir)] == [(stopped_at, True)], log[
        -3000:
    ]
    # A cancel is what was asked for: no error line, and the launch ends 0 without torch's agent
    # reporting failed ranks (it was never signalled).
    assert "ftq-error" not in log and "Traceback" not in log, log[-3000:]
    assert f"cancelled after step {stopped_at} with a checkpoint" in log
    assert runs.read_exit_status(run_dir) == 0


FILLS_THE_DISK = """#!/usr/bin/env bash
# A run that fills its disk and dies of it: neither its error nor its exit status can be written.
head -c 200000000 /dev/zero > filler 2>/dev/null
exit 1
"""


def test_a_run_that_ended_on_a_full_disk_freed_since_is_disk_full_not_a_kill(tmp_path: Path) -> None:
    """Issue 28, finding 9 (the fault campaign's full-disk phase): the run dies on a full disk without an
    exit status, then the space comes back before the worker reads the run. The reaper saw the disk
    full when the run ended, so the run is disk_full, not "killed (SIGKILL ...)"."""
    from tests.harness.disk import small_tmpfs
    from worker.recovery import why_it_failed

    with small_tmpfs(tmp_path / "disk", "16m") as disk:
        ended = threading.Event()
        launcher = LocalLauncher(Settings(data_dir=disk), on_exit=ended.set)
        req = _request(disk, "job_full", FILLS_THE_DISK)
        handle = launcher.submit(req)
        assert ended.wait(30)
        (req.run_dir / "filler").unlink()  # room again, before the run's end is read
        ref = RunRef("job_full", req.run_dir, None, handle.pid, handle.pid_start_ticks)
        state = launcher.poll([ref])["job_full"]
        assert state.phase == RunPhase.lost, state
        failure = why_it_failed(req.run_dir, state)
        assert failure.code == "disk_full" and "SIGKILL" not in failure.message, failure


def _real_launch(launcher: LocalLauncher, settings: Settings, tiny_dir: Path, job_id: str) -> RunRef:
    """The rendered launch.sh of a two-process tiny run that only a cancel ends, started."""
    body = tiny_spec(tiny_dir, max_steps=100_000, processes=2)
    spec = JobSpec.model_validate(body)
    run_dir = settings.data_dir / "runs" / job_id
    (run_dir / runs.CHECKPOINTS).mkdir(parents=True)
    plan = render_plan(spec, job_id=job_id, run_dir=run_dir, settings=settings)
    (run_dir / runs.SPEC).write_text(json.dumps(body))
    (run_dir / runs.ACCELERATE_CONFIG).write_text(plan.accelerate_config_yaml)
    (run_dir / runs.LAUNCH_SCRIPT).write_text(plan.launch_script)
    req = LaunchRequest(job_id=job_id, run_dir=run_dir, spec=spec, plan=plan, resources={"cpu_slots": 2})
    handle = launcher.submit(req)
    return RunRef(job_id, run_dir, None, handle.pid, handle.pid_start_ticks)
