"""The runtime's parts on their own: scheduling, failure classification, metric tailing, and the local
launcher driving real processes (a stand-in launch.sh, no training)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ftq.settings import Settings
from tests.launching import launch_request
from worker import failures, ingest, scheduling
from worker.launchers.base import LaunchRequest, RunPhase, RunRef
from worker.launchers.local import LocalLauncher, group_members, marked, read_stat


def spec(device: str = "cpu", procs: int = 1, launcher: str = "local") -> dict:
    res = {"launcher": launcher, "device": device, "processes_per_node": procs, "num_nodes": 1}
    return {"resources": res}


# Scheduling ------------------------------------------------------------------------------------------------


def test_gpus_are_disjoint_and_jobs_wait_first_come_first_served() -> None:
    s = Settings(gpu_pool="0,1,2,3", cpu_slots=2)
    held = [{"gpus": [1]}, {"cpu_slots": 1}]
    queued = [
        ("a", spec("cuda", 2)),
        ("b", spec("cuda", 2)),
        ("c", spec("cuda", 1)),
        ("d", spec("cpu", 1)),
        ("e", spec("cpu", 1)),
        ("f", spec(launcher="slurm", device="cuda", procs=8)),
    ]
    out = {d.job_id: d for d in scheduling.decide(queued, held, s)}
    assert out["a"].resources == {"gpus": [0, 2]}
    # b does not fit in the one GPU left; c, although it would fit, waits behind b (no starvation).
    assert "b" not in out and "c" not in out
    assert out["d"].resources == {"cpu_slots": 1} and "e" not in out
    assert out["f"].resources == {}


def test_a_job_larger_than_the_pool_is_refused_with_the_reason() -> None:
    out = scheduling.decide([("big", spec("cuda", 8))], [], Settings(gpu_pool="0,1"))
    assert out[0].impossible and "needs 8 GPUs" in out[0].impossible and "FTQ_GPU_POOL" in out[0].impossible
    out = scheduling.decide([("cpu", spec("cpu", 3))], [], Settings(cpu_slots=2))
    assert out[0].impossible and "FTQ_CPU_SLOTS" in out[0].impossible


# Failure classification -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "code", "reason", "exit_code"),
    [
        (
            "x\nftq-error: dataset_error: column 'text' not found; set dataset.text_field\n",
            "dataset_error",
            None,
            1,
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory", None, 1),
        ("", "out_of_memory", None, 137),
        ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(5)", "nccl_timeout", None, 1),
        ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "rendezvous_error", None, 1),
        ("OSError: [Errno 28] No space left on device", "disk_full", None, 1),
        ("slurmstepd: error: *** JOB 12 CANCELLED DUE TO TIME LIMIT ***", "time_limit", "TIMEOUT", 0),
        ("", "preempted", "PREEMPTED", None),
        ("", "node_failure", "NODE_FAIL", None),
        ("ValueError: something odd", "unknown", None, 3),
    ],
)
def test_failures_are_classified(tail: str, code: str, reason: str | None, exit_code: int | None) -> None:
    f = failures.classify(exit_code=exit_code, log_tail=tail, reason=reason)
    assert f.code == code
    assert len(f.message) > 20
    if code == "dataset_error":
        assert f.message == "column 'text' not found; set dataset.text_field"
    if code == "unknown":
        assert "exited with code 3" in f.message and "ValueError: something odd" in f.message


# Metric tailing ------------------------------------------------------------------------------------------


def test_only_complete_lines_are_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    lines, offset = ingest.read_new_lines(path, 0)
    assert lines == [b'{"step": 1, "loss": 2.0}'] and offset == 25
    assert ingest.read_new_lines(path, offset) == ([], offset)
    with path.open("ab") as f:
        f.write(b'ss": NaN, "max_steps": 9}\n')
    lines, offset2 = ingest.read_new_lines(path, offset)
    point = ingest.parse_point(lines[0])
    assert point is not None and point["step"] == 2 and point["loss"] is None and point["max_steps"] == 9
    assert offset2 == path.stat().st_size
    assert ingest.parse_point(b"not json") is None and ingest.parse_point(b'{"loss": 1}') is None


# Local launcher, real processes --------------------------------------------------------------------------

STAND_IN = """#!/usr/bin/env bash
# A stand-in launch.sh: a child in a session of its own (as torch's ranks are), then wait.
set -u
python3 -c "import os, signal, time; os.setsid(); {child}; time.sleep(300)" &
trap '{on_term}' TERM
while true; do sleep 0.1; done
"""


def _request(tmp_path: Path, job_id: str, script: str) -> LaunchRequest:
    run_dir = tmp_path / job_id
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text(script)
    return launch_request(job_id, run_dir, resources={"cpu_slots": 1})


def _wait(pred, timeout: float = 15) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


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


def test_cancel_terms_the_group_and_ranks_in_other_sessions(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cancel_grace_seconds=30))
    req = _request(tmp_path, "job_term", STAND_IN.format(child="pass", on_term="exit 143"))
    handle = launcher.submit(req)
    ref = RunRef("job_term", req.run_dir, None, handle.pid, handle.pid_start_ticks)
    assert _wait(lambda: len(marked("job_term")) >= 2)
    launcher.cancel(ref)
    assert _wait(lambda: launcher.poll([ref])["job_term"].phase != RunPhase.running)
    assert marked("job_term") == [] and group_members(handle.pid) == []  # type: ignore[arg-type]


def test_cancel_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path, cancel_grace_seconds=1))
    # This launch ignores SIGTERM, and so does its child in another session.
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    req = _request(tmp_path, "job_stubborn", STAND_IN.format(child=ignore, on_term="true"))
    handle = launcher.submit(req)
    ref = RunRef("job_stubborn", req.run_dir, None, handle.pid, handle.pid_start_ticks)
    assert _wait(lambda: len(marked("job_stubborn")) >= 2)
    launcher.cancel(ref)
    time.sleep(0.5)
    launcher.cancel(ref)  # within the grace period: nothing more yet
    assert launcher.poll([ref])["job_stubborn"].phase == RunPhase.running
    assert json.loads((req.run_dir / "cancel.json").read_text())["term_sent"] > 0
    time.sleep(0.8)
    launcher.cancel(ref)  # past it: SIGKILL to everything of the run
    assert _wait(lambda: launcher.poll([ref])["job_stubborn"].phase != RunPhase.running)
    assert marked("job_stubborn") == []


def test_find_adopts_a_launch_whose_record_was_never_written(tmp_path: Path) -> None:
    launcher = LocalLauncher(Settings(data_dir=tmp_path))
    req = _request(tmp_path, "job_orphan", STAND_IN.format(child="pass", on_term="exit 143"))
    handle = launcher.submit(req)
    (req.run_dir / "launch.json").unlink()  # as if the worker died right after the start
    found = launcher.find(req.run_dir)
    assert found is not None and found.pid == handle.pid and found.pid_start_ticks == handle.pid_start_ticks
    launcher.kill_leftovers(RunRef("job_orphan", req.run_dir, None, handle.pid, handle.pid_start_ticks))
    assert _wait(lambda: marked("job_orphan") == [])
