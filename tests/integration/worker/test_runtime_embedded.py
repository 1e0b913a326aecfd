"""The worker runtime end to end on `ftq up`'s embedded defaults (SQLite, filesystem broker, local).

Real processes throughout: `ftq up`, its Celery worker, `accelerate launch` and the trainer.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Deployment, Paced, no_text_field_folder, proc_groups, run_pids, tiny_spec, wait_gone

pytestmark = pytest.mark.slow


def read_all_metrics(stack: Deployment, job_id: str) -> list[dict[str, Any]]:
    """Poll with after_step while the job runs; every page holds only points newer than asked for."""
    points: list[dict[str, Any]] = []
    after = 0
    deadline = time.time() + 240
    while time.time() < deadline:
        r = stack.http.get(f"/jobs/{job_id}/metrics", params={"after_step": after, "limit": 3})
        assert r.status_code == 200, r.text
        page = r.json()
        assert all(p["step"] > after for p in page["data"]), (after, page)
        points += page["data"]
        after = page["next_after_step"]
        if page["complete"]:
            return points
        if not page["data"]:
            time.sleep(0.3)
    raise AssertionError(f"metrics never complete: {points}\n{stack.report(job_id)}")


def read_all_logs(stack: Deployment, job_id: str) -> str:
    text, offset = [], 0
    for _ in range(10_000):
        r = stack.http.get(f"/jobs/{job_id}/logs", params={"offset": offset, "limit": 4096})
        assert r.status_code == 200, r.text
        chunk = r.json()
        assert chunk["offset"] == offset and chunk["next_offset"] - offset <= 4096
        text.append(chunk["text"])
        offset = chunk["next_offset"]
        if chunk["complete"]:
            return "".join(text)
    raise AssertionError("logs never complete")


@pytest.fixture(scope="module")
def first_wave(embedded: Deployment, tiny_dir: Path) -> dict[str, str]:
    """Three jobs posted together so that their slow start-ups overlap (4 CPU slots: 1 + 1 + 2)."""
    good = embedded.post_job(tiny_spec(tiny_dir, max_steps=8))
    assert good["status"] == "queued"
    bad_spec = tiny_spec(tiny_dir, max_steps=4, name="bad")
    bad_spec["dataset"]["name_or_path"] = str(no_text_field_folder(embedded.data_dir))
    bad = embedded.post_job(bad_spec)
    cancel = embedded.post_job(tiny_spec(tiny_dir, max_steps=100_000, processes=2, name="to-cancel"))
    return {"good": good["id"], "bad": bad["id"], "cancel": cancel["id"]}


def test_tiny_job_succeeds_with_metrics_and_logs(embedded: Deployment, first_wave: dict[str, str]) -> None:
    job_id = first_wave["good"]
    points = read_all_metrics(embedded, job_id)
    job = embedded.job(job_id)
    assert job["status"] == "succeeded", embedded.report(job_id)
    assert job["error"] is None and job["started_at"] and job["finished_at"]
    assert [p["step"] for p in points] == list(range(1, 9))
    assert all(p["loss"] is not None and p["learning_rate"] is not None for p in points)
    assert job["progress"]["step"] == 8 and job["progress"]["max_steps"] == 8
    assert job["progress"]["eta_seconds"] == 0
    assert job["latest_metrics"]["step"] == 8
    # after_step returns only newer points, and says complete once the job is terminal.
    tail = embedded.http.get(f"/jobs/{job_id}/metrics", params={"after_step": 5}).json()
    assert [p["step"] for p in tail["data"]] == [6, 7, 8] and tail["complete"]
    # The log read in 4 KiB chunks is the whole train.log.
    log_text = read_all_logs(embedded, job_id)
    assert log_text == (embedded.run_dir(job_id) / "train.log").read_text(errors="replace")
    assert "trained to step 8" in log_text
    # The run's group is gone and left no process behind.
    assert embedded.pgid_of(job_id) not in proc_groups()
    assert run_pids(job_id) == []


def test_bad_dataset_fails_with_a_useful_error(embedded: Deployment, first_wave: dict[str, str]) -> None:
    failed = embedded.wait_terminal(first_wave["bad"])
    assert failed["status"] == "failed", failed
    assert failed["error"]["code"] == "dataset_error", failed["error"]
    assert failed["error"]["exit_code"] not in (None, 0)
    assert "text" in failed["error"]["message"], failed["error"]
    assert run_pids(first_wave["bad"]) == []


def test_cancel_two_process_job_leaves_no_process(embedded: Deployment, first_wave: dict[str, str]) -> None:
    job_id = first_wave["cancel"]
    embedded.wait_for(job_id, lambda j: j["status"] == "running", 120, "running")
    pgid = embedded.pgid_of(job_id)
    # bash + accelerate launch + two ranks (torch puts each rank in a session of its own): the
    # 2-process job is really up before it is cancelled.
    deadline = time.time() + 150
    while time.time() < deadline and len(run_pids(job_id)) < 4:
        time.sleep(0.3)
    assert len(run_pids(job_id)) >= 4, embedded.report(job_id)

    r = embedded.http.post(f"/jobs/{job_id}/cancel")
    assert r.status_code == 202 and r.json()["status"] in ("cancelling", "cancelled")
    done = embedded.wait_terminal(job_id, timeout=60)
    assert done["status"] == "cancelled" and done["error"] is None
    assert pgid not in proc_groups(), proc_groups().get(pgid)
    assert run_pids(job_id) == []
    # Cancel is idempotent and changes nothing on a finished job.
    again = embedded.http.post(f"/jobs/{job_id}/cancel")
    assert again.status_code == 202 and again.json()["status"] == "cancelled"


def test_kill9_ftq_up_mid_training_then_restart(embedded: Deployment, tiny_dir: Path) -> None:
    max_steps = 80
    job = embedded.post_job(tiny_spec(tiny_dir, max_steps=max_steps, name="survivor"))
    embedded.wait_for(job["id"], lambda j: (j["progress"]["step"] or 0) >= 1, 120, "first point")
    up_pid = embedded.pid("up")
    worker_pids = [p for p in proc_groups().get(up_pid, []) if p != up_pid]
    pgid = embedded.pgid_of(job["id"])

    embedded.kill9("up")
    # The worker follows `ftq up` down; the training run does not.
    wait_gone(worker_pids)
    assert pgid in proc_groups() or (embedded.run_dir(job["id"]) / "exit_status").exists()

    embedded.start_server()
    done = embedded.wait_terminal(job["id"], timeout=180)
    assert done["status"] == "succeeded", embedded.report(job["id"])
    steps = [
        p["step"]
        for p in embedded.http.get(f"/jobs/{job['id']}/metrics", params={"limit": 10_000}).json()["data"]
    ]
    assert steps == list(range(1, max_steps + 1))
    assert done["progress"]["step"] == max_steps
    assert run_pids(job["id"]) == []


def test_pause_through_a_worker_restart_then_resume_continues_from_the_checkpoint(
    embedded: Deployment, tiny_dir: Path
) -> None:
    """One run for the whole scenario: paused mid-run (and `ftq up` killed while the pause is under way:
    the restarted worker's reconcile finishes it), then resumed from the checkpoint to its max steps."""
    # The run must still be training when the restarted worker looks at it (about 8 s after the pause is
    # asked for), so it is paced (a tenth of the CPU time, tests.harness.Paced) from its third step until
    # it has paused: about 10 steps a second on a quiet machine, fewer on a busy one. Unpaced it needed
    # 300 steps of six micro-batches (the pause came at step 137 on a quiet machine) that the resumed
    # run then trained to the end.
    max_steps = 200
    job = embedded.post_job(tiny_spec(tiny_dir, max_steps=max_steps, name="pause-resume"))
    job_id = job["id"]
    embedded.wait_for(job_id, lambda j: (j["progress"]["step"] or 0) >= 3, 120, "three steps")
    pgid = embedded.pgid_of(job_id)
    with Paced(job_id):
        r = embedded.http.post(f"/jobs/{job_id}/pause")
        assert r.status_code == 202, r.text
        assert r.json()["status"] in ("running", "paused")
        up_pid = embedded.pid("up")
        worker_pids = [p for p in proc_groups().get(up_pid, []) if p != up_pid]
        embedded.kill9("up")
        wait_gone(worker_pids)
        embedded.start_server()
        paused = embedded.wait_for(job_id, lambda j: j["status"] == "paused", 120, "paused")
    assert paused["finished_at"] is None and paused["progress"]["phase"] == "paused", paused
    # Its processes are gone (the devices are free), and it stopped with a checkpoint at its last step.
    assert pgid not in proc_groups(), proc_groups().get(pgid)
    assert run_pids(job_id) == []
    ckpts = embedded.http.get(f"/jobs/{job_id}/checkpoints").json()["data"]
    assert ckpts and ckpts[-1]["resumable"], ckpts
    pause_step = ckpts[-1]["step"]
    assert 3 <= pause_step < max_steps and paused["progress"]["step"] == pause_step, (ckpts, paused)
    assert f"ftq: paused at step {pause_step}" in embedded.train_log(job_id)
    # A paused job is not placed: still paused after a few scheduler ticks.
    time.sleep(3)
    assert embedded.job(job_id)["status"] == "paused"

    resumed = embedded.http.post(f"/jobs/{job_id}/resume")
    assert resumed.status_code == 202 and resumed.json()["status"] in ("queued", "starting", "running")
    done = embedded.wait_terminal(job_id, timeout=240)
    assert done["status"] == "succeeded", embedded.report(job_id)
    assert done["progress"]["step"] == max_steps
    # The second run continued from the checkpoint: every step was trained (and logged) exactly once,
    # the first after the resume being the one after the pause.
    lines = (embedded.run_dir(job_id) / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line)["step"] for line in lines if line.strip()]
    assert logged == list(range(1, max_steps + 1)), logged
    after_pause = embedded.train_log(job_id).split(f"ftq: paused at step {pause_step}")[1]
    assert re.search(rf"resuming from \S*checkpoint-{pause_step}\b", after_pause), after_pause[-3000:]
    events = embedded.http.get(f"/jobs/{job_id}/events", params={"limit": 1000}).json()["data"]
    by_type = [e["type"] for e in events if e["type"] != "job.checkpoint"]
    assert by_type.count("job.started") == 2 and by_type[-1] == "job.succeeded", by_type
    pause_event = next(e for e in events if e["type"] == "job.paused")
    assert pause_event["data"] == {"step": pause_step, "checkpoint": pause_step}, pause_event
    assert next(e for e in events if e["type"] == "job.resumed")["data"] == {"checkpoint": pause_step}
    assert by_type.index("job.paused") < by_type.index("job.resumed") < len(by_type) - 1
    assert run_pids(job_id) == []
