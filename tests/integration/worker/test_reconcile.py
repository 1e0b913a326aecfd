"""Reconcile in-process on a real SQLite store, with stand-in launch scripts (no training): the cases a
worker killed mid-submit leaves behind, scheduling as resources free up, and the final bookkeeping."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftq.contract import runs
from ftq.store.models import Job
from tests.harness import rows
from tests.harness.inprocess import migrate, quiesce_controller, reset_caches, use_settings

SCRIPT_OK = (
    'echo "step ok"\nprintf \'{"step": 1, "loss": 1.5, "max_steps": 1}\\n\' >> metrics.jsonl\n'
    "printf '0\\n' > .s && mv .s exit_status\n"
)
SCRIPT_FAIL = (
    "echo 'ftq-error: dataset_error: column text not found; set dataset.text_field' >&2\n"
    "printf '1\\n' > .s && mv .s exit_status\nexit 1\n"
)
SCRIPT_SLEEP = "sleep 30\nprintf '0\\n' > .s && mv .s exit_status\n"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from worker import controller, lifecycle

    use_settings(monkeypatch, data_dir=tmp_path, cpu_slots=1, cancel_grace_seconds=1)
    controller.get_launcher.cache_clear()
    monkeypatch.setattr(lifecycle, "STARTING_GRACE_SECONDS", 0.0)
    migrate()
    yield tmp_path / "runs"
    quiesce_controller(tmp_path)
    reset_caches()
    controller.get_launcher.cache_clear()


def add_job(job_id: str, script: str, status: str = "queued", **values: Any) -> None:
    # A valid spec and a whole plan, as the API stores them; only the launch script is the test's own.
    spec = {
        "model": {"name_or_path": "./tiny/model"},
        "dataset": {"name_or_path": "./tiny/data"},
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": 1, "num_nodes": 1},
        "training": {"max_steps": 1},
    }
    plan: dict[str, Any] = {
        "accelerate_config": {},
        "accelerate_config_yaml": "{}\n",
        "command": [],
        "sbatch_script": None,
        "trainer_args": {},
        "launch_script": "set -u\n" + script,
    }
    rows.add_job(job_id, spec=spec, plan=plan, status=status, **values)


def job(job_id: str) -> Job:
    return rows.get_job(job_id)


def settle(job_id: str, want: set[str], timeout: float = 20) -> Job:
    return rows.sweep_until(lambda: job(job_id), want, timeout)


def test_submit_runs_to_success_with_metrics_ingested_first(store: Path) -> None:
    from worker import controller

    add_job("j_ok", SCRIPT_OK)
    controller.submit("j_ok")
    assert job("j_ok").status in ("running", "succeeded")
    j = settle("j_ok", {"succeeded"})
    assert j.exit_code == 0 and j.progress_step == 1 and j.resources is None
    assert (j.latest_metrics or {}).get("loss") == 1.5
    assert json.loads((store / "j_ok" / runs.SPEC).read_text())["training"]["max_steps"] == 1


def test_an_ended_run_is_settled_and_the_next_started_without_a_sweep(store: Path) -> None:
    # Nothing here calls reconcile(): the worker that started the run learns its end from the reaper
    # and sweeps at once, which also starts the job that waited for the slot.
    from worker import controller

    add_job("j_first", SCRIPT_SLEEP.replace("sleep 30", "sleep 1"))
    add_job("j_next", SCRIPT_OK)
    controller.submit("j_first")
    assert job("j_first").status == "running" and job("j_next").status == "queued"
    deadline = time.time() + 20
    while time.time() < deadline and job("j_next").status != "succeeded":
        time.sleep(0.1)
    assert job("j_first").status == "succeeded" and job("j_next").status == "succeeded"
    assert (job("j_next").latest_metrics or {}).get("loss") == 1.5


def test_failure_gets_the_trainers_error(store: Path) -> None:
    add_job("j_bad", SCRIPT_FAIL)
    j = settle("j_bad", {"failed"})
    assert (j.error_code, j.exit_code) == ("dataset_error", 1)
    assert j.error_message == "column text not found; set dataset.text_field"


def test_jobs_wait_for_a_free_slot_first_come_first_served(store: Path) -> None:
    from worker import controller

    add_job("j_1", SCRIPT_SLEEP)
    add_job("j_2", SCRIPT_OK)
    controller.submit("j_2")
    assert job("j_1").status == "running" and job("j_2").status == "queued"  # one CPU slot: j_1 came first
    from ftq.store import repository
    from ftq.store.db import session_scope

    with session_scope() as s:
        repository.request_cancel(s, "j_1")
    controller.cancel("j_1")
    assert settle("j_1", {"cancelled"}).error_code == "cancelled"
    assert settle("j_2", {"succeeded"}).exit_code == 0


def test_claimed_but_never_launched_goes_back_to_the_queue(store: Path) -> None:
    # A worker died between the claim (queued -> starting) and the launch: nothing in the run dir.
    add_job("j_claimed", SCRIPT_OK, status="starting", resources={"cpu_slots": 1})
    assert settle("j_claimed", {"succeeded"}).exit_code == 0


def test_a_launch_the_dead_worker_did_not_record_is_adopted_not_repeated(store: Path) -> None:
    from worker.controller import get_launcher, write_run_dir

    add_job(
        "j_adopt",
        SCRIPT_SLEEP.replace("sleep 30", "echo once >> launches; sleep 1"),
        status="starting",
        resources={"cpu_slots": 1},
    )
    run_dir = store / "j_adopt"
    # What the dead worker got done: the run dir written and the process started, no pid in the store.
    from ftq.contract.plans import Plan
    from tests.harness.launching import launch_request

    adopt = job("j_adopt")
    write_run_dir(adopt, run_dir, Plan.model_validate(adopt.plan))
    get_launcher("local").submit(launch_request("j_adopt", run_dir, resources={"cpu_slots": 1}))
    j = settle("j_adopt", {"succeeded"})
    assert j.pid is not None and (run_dir / "launches").read_text() == "once\n"


def test_a_run_that_ended_while_no_worker_was_watching_is_finished(store: Path) -> None:
    # Only an exit status is left (the launch record was never written); the job says running.
    add_job("j_ended", SCRIPT_OK, status="running", resources={"cpu_slots": 1})
    run_dir = store / "j_ended"
    run_dir.mkdir(parents=True)
    (run_dir / runs.METRICS).write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n{"step": 3')
    (run_dir / runs.EXIT_STATUS).write_text("0\n")
    j = settle("j_ended", {"succeeded"})
    assert j.progress_step == 2 and (j.latest_metrics or {}).get("loss") == 0.25
