"""The first hour of a new user (issue 20): the documented commands work as written from a fresh shell, one
port setting (FTQ_PORT) reaches the server and the CLI, `make help` lists the targets, and `ftq up` and
train.log stay readable while a job trains and when it is cancelled."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from ftq.contract import runs
from tests.harness import REPO, Deployment, clean_env, free_port, pid_alive, run_ftq, tiny_spec
from trainer.callbacks import read_points


def test_make_help_lists_the_targets() -> None:
    out = subprocess.run(
        ["make", "-s", "help"], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    listed = set(re.findall(r"^  ([a-z-]+)\s", out.stdout, re.M))
    assert {"up", "install", "test", "test-fast", "lint", "typecheck", "openapi", "bench", "clean"} <= listed


def test_ftq_port_sets_the_server_port_and_the_cli_default_url(tmp_path: Path) -> None:
    port = free_port()
    # Given FTQ_PORT, the harness starts `ftq api` without --port.
    with Deployment(tmp_path, mode="api", port=port, env={"FTQ_PORT": str(port)}) as dep:
        assert f"Uvicorn running on http://127.0.0.1:{port} " in dep.log("api")
        # bin/ftq from another folder, no FTQ_URL: the CLI finds the server through FTQ_PORT too.
        ls = subprocess.run(
            [str(REPO / "bin" / "ftq"), "ls"],
            cwd=tmp_path,
            env=clean_env(FTQ_PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ls.returncode == 0, ls.stderr
        elsewhere = run_ftq("ls", url=None, env={"FTQ_PORT": str(free_port())})
        assert elsewhere.returncode != 0 and "127.0.0.1:" in elsewhere.stderr
        bad = run_ftq("ls", url=None, env={"FTQ_PORT": "80x"})
        assert bad.returncode == 2 and "FTQ_PORT='80x' is not a port number" in bad.stderr, bad.stderr


@pytest.mark.slow  # a real two-process tiny run under `ftq up`, cancelled after a checkpoint
def test_ftq_up_is_quiet_and_a_cancelled_runs_log_ends_with_one_line(tmp_path: Path) -> None:
    with Deployment(tmp_path, mode="up", settings={"cpu_slots": 4, "cancel_grace_seconds": 60}) as dep:
        spec = tiny_spec(max_steps=100_000, processes=2, save_steps=4)  # only the cancel ends it
        job_id = dep.post_job(spec)["id"]
        metrics = dep.run_dir(job_id) / runs.METRICS
        dep.wait_for(job_id, lambda _: len(read_points(metrics)) >= 10, timeout=300, what="10 steps")
        dep.cancel(job_id)
        job = dep.wait_terminal(job_id, timeout=120)
        assert job["status"] == "cancelled", dep.report(job_id)
        up_lines = dep.log("up").splitlines()
        train_log = dep.train_log(job_id)
    # The whole of `ftq up`'s output, start-up included, over a job of several seconds (sweeps every 2 s).
    assert len(up_lines) < 20, "\n".join(up_lines)
    # The worker's lines about the job in words, without Celery's two task lines beside each (issue 50).
    assert any(f"job {job_id} launched: pid " in line for line in up_lines), up_lines
    assert any(f"job {job_id} ended: " in line for line in up_lines), up_lines
    assert not any("RunState(" in line or "LaunchHandle(" in line for line in up_lines), up_lines
    assert not any("Task ftq." in line for line in up_lines), up_lines
    steps = [int(m) for m in re.findall(r" trainer INFO step (\d+)/100000  loss ", train_log)]
    points = [p["step"] for p in read_points(metrics) if p["loss"] is not None]
    assert steps == points, train_log[-4000:]  # one line per logging step, from rank 0 alone
    assert "{'loss'" not in train_log and train_log.count("strategy ddp") == 1, train_log[-4000:]
    last = train_log.rstrip("\n").splitlines()[-1]
    stopped = re.fullmatch(
        r"ftq: cancelled at step (\d+); checkpoint saved \((checkpoints/checkpoint-\1)\)", last
    )
    assert stopped, train_log[-4000:]
    # What comes before that line is the rank's own note, not torch's agent reporting a signal.
    assert "Traceback" not in train_log and "death signal" not in train_log, train_log[-4000:]
    assert (dep.run_dir(job_id) / stopped.group(2) / "trainer_state.json").is_file()
    assert int(stopped.group(1)) >= 10


def test_ctrl_c_stops_ftq_up_and_its_workers_cleanly(tmp_path: Path) -> None:
    dep = Deployment(tmp_path, mode="up").start()
    try:
        proc = dep.procs["up"]
        found = re.search(r"worker pid (\d+)  webhook sender pid (\d+)", dep.log("up"))
        assert found, dep.log("up")
        workers = [int(pid) for pid in found.groups()]
        # What a terminal's Ctrl-C does: SIGINT to the foreground process group (ftq up's).
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
        log = dep.log("up")
    finally:
        dep.close()
    assert code == 0, log[-3000:]
    assert "starting it again" not in log and "Traceback" not in log, log[-3000:]
    assert log.rstrip().endswith("ftq: stopped"), log[-3000:]
    assert not [pid for pid in workers if pid_alive(pid)], log[-3000:]
