"""Deployments (serving engines) in the worker, in process on a real SQLite store and the real local
launcher: a deployment waits in the one queue for the CPU slot a job holds (with the job's reasons), is
launched as `python -m ftq.engine.serve` in `engines/<id>/` with its request and key owner-only, fails
with the command that installs vLLM where there is none, is stopped on request or when no call has used
it for long, and its devices x time count in its owner's usage.

The engine here is a stand-in venv whose `python` sleeps (the real vLLM engine is tests/e2e/serving's):
what is tested is the run around it."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from ftq.contract.status import JobStatus
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.deployments import DEPLOYMENTS, DeploymentRepository, get_deployment
from ftq.store.models import Deployment
from tests.harness import rows
from tests.integration.worker.test_reconcile import SCRIPT_SLEEP, add_job, job, store

__all__ = ["store"]  # the fixture, shared with test_reconcile


@pytest.fixture
def fake_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A venv that looks like vLLM's to ftq.engine.LocalEngine.python(); its `python` sleeps."""
    venv = tmp_path / "venv-vllm"
    (venv / "lib" / "python3.11" / "site-packages" / "vllm").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").write_text("")
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text('#!/bin/bash\necho "stand-in engine: $*"\nexec sleep 60\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FTQ_VLLM_VENV", str(venv))
    yield venv


def add_deployment(dep_id: str, owner: str = rows.OWNER, **values: object) -> None:
    config = {"model": "/nonexistent/base", "name": "base", "device": "cpu", "max_model_len": 64}
    fields: dict[str, object] = {
        "key": "/nonexistent/base",
        "label": "ftq-tiny-serve",
        "launcher": "local",
        "device": "cpu",
        "devices": 1,
        "tensor_parallel_size": 1,
        "priority": "normal",
        "config": config,
        "api_key": "k-" + dep_id,
    }
    with session_scope() as s:
        DeploymentRepository(s, owner).add(deployment_id=dep_id, **{**fields, **values})
        s.commit()


def dep(dep_id: str) -> Deployment:
    with session_scope() as s:
        row = get_deployment(s, dep_id)
        assert row is not None
        s.expunge(row)
        return row


def settle(dep_id: str, want: set[str], timeout: float = 30) -> Deployment:
    return rows.sweep_until(lambda: dep(dep_id), want, timeout)


def test_a_deployment_waits_for_the_slot_a_job_holds_then_runs_in_its_folder(
    store: Path, fake_venv: Path
) -> None:
    from worker import controller

    add_job("j_busy", SCRIPT_SLEEP.replace("sleep 30", "sleep 2"))
    controller.submit("j_busy")
    assert job("j_busy").status == "running"  # the one CPU slot
    add_deployment("dep_wait")
    controller.deployments_changed("dep_wait")  # the task the API sends
    assert dep("dep_wait").status == "queued"
    with session_scope() as s:
        queue = DeploymentRepository(s, rows.OWNER).queue_of(["dep_wait"])
        assert queue["dep_wait"].reason == "no_free_devices"
        assert DeploymentRepository(s, "someone-else").queue_of(["dep_wait"]) == {}
    d = settle("dep_wait", {"running"})
    assert job("j_busy").status == "succeeded" and d.resources == {"cpu_slots": 1}
    folder = store.parent / "engines" / "dep_wait"
    assert "-m ftq.engine.serve" in (folder / "launch.sh").read_text()
    for name in ("engine.json", "engine.key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert (folder / "engine.key").read_text().strip() == "k-dep_wait"
    deadline = time.monotonic() + 60  # the stand-in is past ftq.engine.serve once it wrote its endpoint
    while not (folder / "endpoint.json").exists():
        assert time.monotonic() < deadline, (folder / "train.log").read_text()
        time.sleep(0.1)
    assert (folder / "endpoint.json").read_text().startswith('{"url": "http://127.0.0.1:')
    # A job now waits for the slot the engine holds.
    add_job("j_next", SCRIPT_SLEEP.replace("sleep 30", "sleep 0"))
    assert controller.schedule() == []
    assert job("j_next").status == "queued"

    # Stopped on request: cancelled, its slot freed, its time in its owner's usage.
    with session_scope() as s:
        assert DeploymentRepository(s, rows.OWNER).request_cancel("dep_wait") == JobStatus.cancelling
        assert DeploymentRepository(s, "someone-else").request_cancel("dep_wait") is None
        s.commit()
    controller.deployments_changed("dep_wait")
    d = settle("dep_wait", {"cancelled"})
    assert d.resources is None and not (folder / "endpoint.json").exists()
    with session_scope() as s:
        ((owner, _, seconds, device, _, _),) = DeploymentRepository(s, rows.OWNER).usage_rows(None, None)
        assert (owner, device) == (rows.OWNER, "cpu") and seconds > 0
        usage = {u.owner: u for u in repository.owner_usage(s)}
        assert usage[rows.OWNER].total_device_seconds >= seconds
    settle_job = rows.sweep_until(lambda: job("j_next"), {"succeeded"})
    assert settle_job.exit_code == 0


def test_without_vllm_a_deployment_fails_naming_the_command(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from worker import controller

    monkeypatch.setenv("FTQ_VLLM_VENV", str(tmp_path / "no-venv"))
    add_deployment("dep_none")
    controller.deployments_changed("dep_none")
    d = settle("dep_none", {"failed"})
    assert d.error_code == "launch_error" and "make vllm" in (d.error_message or "")


def test_an_engine_no_call_has_used_for_long_is_stopped_by_the_worker(store: Path, fake_venv: Path) -> None:
    """The API stops its idle engines; one whose API is gone is stopped by the worker, well past
    FTQ_SERVE_IDLE_SECONDS (the default 600 s here: 2 x idle + 60 s)."""
    from ftq.store.transitions import utcnow

    add_deployment("dep_abandoned")
    d = settle("dep_abandoned", {"running"})
    assert d.status == "running"
    with session_scope() as s:
        s.query(Deployment).filter_by(id="dep_abandoned").update(
            {"last_used_at": utcnow() - timedelta(seconds=1259)}
        )
        s.commit()
    assert settle("dep_abandoned", {"running"}).status == "running"  # not yet
    with session_scope() as s:
        s.query(Deployment).filter_by(id="dep_abandoned").update(
            {"last_used_at": utcnow() - timedelta(seconds=1261)}
        )
        s.commit()
    assert settle("dep_abandoned", {"cancelled"}).error_code == "cancelled"
    with session_scope() as s:
        assert not DEPLOYMENTS.mark_starting(s, "dep_abandoned", resources={"cpu_slots": 1})


def test_a_deployment_waits_for_its_owners_quota_like_a_job(
    store: Path, fake_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots, the owner's quota one, and their job holds one: the engine waits though a slot is free
    (reason `quota`), while another owner's engine starts; once the job ends, the engine gets the slot."""
    from ftq.store.transitions import utcnow
    from tests.harness.inprocess import use_settings
    from worker import controller

    use_settings(monkeypatch, data_dir=store.parent, cpu_slots=2, quota_cpu_slots=f"{rows.OWNER}:1")
    monkeypatch.setenv("FTQ_VLLM_VENV", str(fake_venv))
    add_job("j_holds", SCRIPT_SLEEP, status="running", resources={"cpu_slots": 1}, started_at=utcnow())
    add_deployment("dep_quota")
    controller.deployments_changed("dep_quota")
    assert dep("dep_quota").status == "queued"
    with session_scope() as s:
        assert DeploymentRepository(s, rows.OWNER).queue_of(["dep_quota"])["dep_quota"].reason == "quota"
    # Over the quota alone: refused with the scheduler's words, not left waiting.
    add_deployment("dep_too_big", devices=2)
    controller.deployments_changed("dep_too_big")
    refused = dep("dep_too_big")
    assert refused.status == "failed" and refused.error_code == "quota_exceeded", refused.error_message
    with session_scope() as s:
        assert repository.JOBS.mark_finished(s, "j_holds", JobStatus.succeeded, exit_code=0)
        s.commit()
    assert settle("dep_quota", {"running"}).resources == {"cpu_slots": 1}
    with session_scope() as s:
        DeploymentRepository(s, rows.OWNER).request_cancel("dep_quota")
        s.commit()
    settle("dep_quota", {"cancelled"})
