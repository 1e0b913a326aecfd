"""The export controller in process, on a real SQLite store and the real local launcher: an export
draws on the same CPU slots as jobs, is launched as `python -m trainer.export` in exports/<id>/, and
its end is settled by the sweep with the export's own error; a claim its worker never launched is
queued again. The exports here fail in trainer.export's first check (no final/), before anything heavy."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ftq.contract import runs
from ftq.store.models import Export
from tests.harness import rows
from tests.integration.worker.test_reconcile import SCRIPT_SLEEP, add_job, job, store

__all__ = ["store"]  # the fixture, shared with test_reconcile


def add_export(
    export_id: str, job_id: str, status: str = "queued", *, run_dir: bool = True, **values: Any
) -> None:
    from ftq.runtime.settings import get_settings

    if run_dir:  # the succeeded job's run directory (its final/ is left out: the export fails at once)
        runs.run_dir(get_settings().runs_dir, job_id).mkdir(parents=True, exist_ok=True)
    rows.add_export(export_id, job_id, status, **values)


def export(export_id: str) -> Export:
    return rows.get_export(export_id)


def settle(export_id: str, want: set[str], timeout: float = 30) -> Export:
    return rows.sweep_until(lambda: export(export_id), want, timeout)


def test_an_export_is_launched_in_its_folder_and_settled_with_its_error(store: Path) -> None:
    add_job("j_gone", "exit 0\n", status="succeeded")
    add_export("exp_no_run_dir", "j_gone", run_dir=False)
    # Without the job's run directory an export fails at once, naming why, instead of waiting forever.
    assert settle("exp_no_run_dir", {"failed"}).error_code == "launch_error"
    add_job("j_done", "exit 0\n", status="succeeded")
    add_export("exp_1", "j_done")
    e = settle("exp_1", {"failed"})
    assert e.error_code == "model_error" and "no final/ folder" in (e.error_message or "")
    assert e.exit_code == 2 and e.resources is None
    folder = store / "j_done" / runs.EXPORTS / "exp_1"
    assert (folder / runs.EXPORT_REQUEST).is_file() and (folder / runs.LAUNCH_SCRIPT).is_file()
    assert "-m trainer.export" in (folder / runs.LAUNCH_SCRIPT).read_text()
    assert (folder / runs.EXIT_STATUS).read_text().strip() == "2"


def test_every_record_about_an_export_carries_its_job_id(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ftq.runtime.logs import JobIdFilter

    caplog.handler.addFilter(JobIdFilter())
    add_job("j_logged", "exit 0\n", status="succeeded")
    add_export("exp_logged", "j_logged")
    with caplog.at_level(logging.INFO, logger="worker"):
        settle("exp_logged", {"failed"})
    about = [r for r in caplog.records if "exp_logged" in r.getMessage()]
    messages = [r.getMessage() for r in about]
    assert any(" launched: " in m for m in messages) and any(" ended: " in m for m in messages)
    assert {getattr(r, "job_id", None) for r in about} == {"j_logged"}


def test_an_export_waits_for_the_slot_a_job_holds(store: Path) -> None:
    from worker import controller

    add_job("j_busy", SCRIPT_SLEEP.replace("sleep 30", "sleep 3"))
    add_job("j_done", "exit 0\n", status="succeeded")
    controller.submit("j_busy")
    assert job("j_busy").status == "running"  # it holds the one CPU slot (cpu_slots=1)
    add_export("exp_wait", "j_done")
    assert controller.schedule() == []
    assert export("exp_wait").status == "queued"
    settle("exp_wait", {"failed"})  # once the job ended, the export got the slot and ran
    assert job("j_busy").status == "succeeded"


def test_a_job_waits_for_the_slot_an_export_holds(store: Path) -> None:
    from worker import controller

    add_job("j_done", "exit 0\n", status="succeeded")
    add_export("exp_holds", "j_done", status="starting", resources={"cpu_slots": 1})
    add_job("j_next", "exit 0\n")
    assert controller.schedule() == []
    assert job("j_next").status == "queued"


def test_a_claimed_export_its_worker_never_launched_is_queued_again(store: Path) -> None:
    # The store fixture has set the starting grace to 0: the claim is old enough to settle at once.
    add_job("j_done", "exit 0\n", status="succeeded")
    add_export("exp_orphan", "j_done", status="starting", resources={"cpu_slots": 1})
    assert not (store / "j_done" / runs.EXPORTS / "exp_orphan").exists()
    # The sweep queues it again, claims it and launches it: it runs to its (quick) end.
    e = settle("exp_orphan", {"failed"})
    assert e.error_code == "model_error"
    assert (store / "j_done" / runs.EXPORTS / "exp_orphan" / runs.LAUNCH_RECORD).is_file()


def test_an_export_waits_for_its_owners_quota_and_is_claimed_by_the_one_scheduler(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots, the owner's quota one, and their job holds one: the export waits though a slot is free,
    as a job would; once the job ends, the scheduler's tick claims the export with the jobs."""
    from ftq.contract.status import JobStatus
    from ftq.store import repository
    from ftq.store.db import session_scope
    from ftq.store.transitions import utcnow
    from service.exports.service import with_queue
    from tests.harness.inprocess import use_settings
    from worker import controller

    use_settings(monkeypatch, data_dir=store.parent, cpu_slots=2, quota_cpu_slots=f"{rows.OWNER}:1")
    add_job("j_done", "exit 0\n", status="succeeded")
    add_job("j_holds", SCRIPT_SLEEP, status="running", resources={"cpu_slots": 1}, started_at=utcnow())
    add_export("exp_quota", "j_done")
    controller.exports_changed("j_done")  # the task a new export sends
    assert export("exp_quota").status == "queued"
    assert controller.schedule() == []
    # The API shows why it waits, as it does for a job.
    with session_scope() as s:
        (waiting,) = with_queue(s, rows.OWNER, [export("exp_quota")])
        assert waiting.queue is not None and waiting.queue.reason == "quota"
        assert waiting.queue.position == 1
        assert with_queue(s, "someone-else", [export("exp_quota")])[0].queue is None  # the owner's rows only
    with session_scope() as s:
        assert repository.JOBS.mark_finished(s, "j_holds", JobStatus.succeeded, exit_code=0)
    assert controller.schedule() == [controller.Claim("export", "exp_quota")]
    e = export("exp_quota")
    assert e.status == "starting" and e.resources == {"cpu_slots": 1}
    with session_scope() as s:
        assert with_queue(s, rows.OWNER, [e])[0].queue is None


def test_a_side_run_on_several_devices_counts_each_in_its_owners_usage(store: Path) -> None:
    """An evaluation of a large base runs on several GPUs of a node (worker.evaluations.evaluation_gpus):
    its launch records them, and its end counts devices x time in /usage and in fair share."""
    from datetime import timedelta

    from ftq.contract.status import JobStatus
    from ftq.store import repository, side_runs
    from ftq.store.db import session_scope
    from ftq.store.exports import EXPORTS, ExportRepository
    from ftq.store.transitions import utcnow

    add_job("j_big", "exit 0\n", status="succeeded")
    started = utcnow() - timedelta(seconds=100)
    add_export("exp_wide", "j_big", status="running", resources={"cpu_slots": 1}, started_at=started)
    with session_scope() as s:
        side_runs.record_devices(s, Export, "exp_wide", 4)
        assert EXPORTS.mark_finished(s, "exp_wide", JobStatus.succeeded, exit_code=0)
        s.commit()
    with session_scope() as s:
        ((_, _, seconds, _),) = ExportRepository(s, rows.OWNER).usage_rows(None, None)
        assert 400 <= seconds < 420  # 4 devices x ~100 s
        usage = {u.owner: u for u in repository.owner_usage(s)}
        assert usage[rows.OWNER].total_device_seconds >= 400


def test_a_queued_evaluation_asks_for_the_gpus_its_jobs_base_needs(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read from the store as the scheduler reads it (the job by its id, not by the table's primary key):
    a cuda job on Llama 2 70B's shapes gets an evaluation of 4 x 80 GiB GPUs, counted once a job."""
    import json

    from ftq.store.db import session_scope
    from ftq.store.models import Evaluation
    from ftq.store.transitions import utcnow
    from tests.harness.inprocess import use_settings
    from worker import evaluations

    use_settings(monkeypatch, data_dir=store.parent, gpu_pool="0,1,2,3,4,5,6,7", cpu_slots=1)
    model = tmp_path / "llama70b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 8192,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "intermediate_size": 28672,
                "vocab_size": 32000,
                "torch_dtype": "bfloat16",
            }
        )
    )
    spec = {
        "model": {"name_or_path": str(model)},
        "dataset": {"name_or_path": "./tiny/data"},
        "resources": {"launcher": "local", "device": "cuda", "processes_per_node": 1, "num_nodes": 1},
        "training": {"max_steps": 1},
        "lora": {"r": 16},
    }
    rows.add_job("j_70b", spec=spec, plan={}, status="succeeded", device="cuda")
    now = utcnow()
    with session_scope() as s:
        s.add(
            Evaluation(
                id="ev_70b",
                job_id="j_70b",
                trigger="request",
                status="queued",
                created_at=now,
                updated_at=now,
            )
        )
        s.commit()
    kind = evaluations.EvaluationKind()
    with session_scope() as s:
        (request,) = kind.queued(s)
        assert request.need.count == 4 and kind.devices_of(s, request) == 4
