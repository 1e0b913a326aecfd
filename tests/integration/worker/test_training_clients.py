"""Tinker training clients in the worker (issue 52), in process on a real SQLite store and the real local
launcher: a training client waits in the one queue for the CPU slot a job holds, is launched as `python -m
trainer.tinker_host` in `tinker/clients/<n>/` with its request and key owner-only, loads the tiny model with
a LoRA and answers its key only: forward_backward + optim_step lower the NLL of a fixed batch; it is
stopped on request and its devices x time count in its owner's usage."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import httpx
import pytest

from ftq.contract.runs import read_endpoint
from ftq.contract.status import JobStatus
from ftq.contract.tinker import KEY_HEADER
from ftq.store import repository, training_clients
from ftq.store.db import session_scope
from ftq.store.models import TrainingClient
from ftq.store.training_clients import TinkerRepository, get_training_client
from tests.harness import EXAMPLES, rows, tiny_assets
from tests.integration.worker.test_reconcile import SCRIPT_SLEEP, add_job, job, store

__all__ = ["store"]  # the fixture, shared with test_reconcile

MODEL_ID = "ses_test:train:0"


def add_client(owner: str = rows.OWNER) -> None:
    config = {
        "base": "ftq-tiny",
        "base_folder": str((EXAMPLES / "tiny" / "model").resolve()),
        "lora": {"rank": 4, "seed": 0, "train_attn": True, "train_mlp": True, "train_unembed": False},
    }
    with session_scope() as s:
        TinkerRepository(s, owner).add_client(
            MODEL_ID,
            session_id="ses_test",
            base="ftq-tiny",
            launcher="local",
            device="cpu",
            devices=1,
            priority="normal",
            config=config,
            lora_rank=4,
        )
        s.commit()


def client() -> TrainingClient:
    with session_scope() as s:
        row = get_training_client(s, MODEL_ID)
        assert row is not None
        s.expunge(row)
        return row


def settle(want: set[str], timeout: float = 30) -> TrainingClient:
    return rows.sweep_until(client, want, timeout)  # type: ignore[type-var]  # any row with a status


def test_a_training_client_waits_for_the_slot_then_trains_in_its_own_process(store: Path) -> None:
    from worker import controller

    tiny_assets()
    add_job("j_busy", SCRIPT_SLEEP.replace("sleep 30", "sleep 2"))
    controller.submit("j_busy")
    assert job("j_busy").status == "running"  # the one CPU slot
    add_client()
    controller.training_clients_changed(MODEL_ID)  # the task the API sends
    assert client().status == "queued"
    row = settle({"running"})
    assert job("j_busy").status == "succeeded" and row.resources == {"cpu_slots": 1}
    folder = store.parent / "tinker" / "clients" / f"tc_{row.seq}"
    assert "-m trainer.tinker_host" in (folder / "launch.sh").read_text()
    for name in ("host.json", "host.key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    deadline = time.monotonic() + 90
    while (url := read_endpoint(folder)) is None:
        assert time.monotonic() < deadline, (folder / "train.log").read_text()
        time.sleep(0.2)
    key = {KEY_HEADER: row.api_key}
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        assert http.get("/health").status_code == 200
        assert http.post("/info", json={}).status_code == 401  # the API's key only
        tokens = list(range(5, 37))
        datum = {
            "tokens": tokens[:-1],
            "loss_fn_inputs": {"target_tokens": {"data": tokens[1:], "dtype": "int64"}},
        }
        losses = []
        for _ in range(4):
            r = http.post(
                "/forward_backward", json={"data": [datum], "loss_fn": "cross_entropy"}, headers=key
            )
            assert r.status_code == 200, r.text
            losses.append(r.json()["metrics"]["loss:sum"])
            assert len(r.json()["loss_fn_outputs"][0]["logprobs"]) == len(tokens) - 1
            step = http.post("/optim_step", json={"adam_params": {"learning_rate": 1e-2}}, headers=key)
            assert step.status_code == 200, step.text
        assert losses[-1] < losses[0] * 0.9, losses
        bad = http.post("/forward_backward", json={"data": [datum], "loss_fn": "cispo"}, headers=key)
        assert bad.status_code == 400 and "cispo" in bad.json()["error"]
    assert "forward_backward" in (folder / "train.log").read_text()  # each call's time is logged

    with session_scope() as s:
        assert TinkerRepository(s, "someone-else").request_cancel(MODEL_ID) is None
        assert TinkerRepository(s, rows.OWNER).request_cancel(MODEL_ID) == JobStatus.cancelling
        s.commit()
    controller.training_clients_changed(MODEL_ID)
    row = settle({"cancelled"})
    assert row.resources is None and not (folder / "endpoint.json").exists()
    with session_scope() as s:
        ((owner, _, seconds, device),) = TinkerRepository(s, rows.OWNER).usage_rows(None, None)
        assert (owner, device) == (rows.OWNER, "cpu") and seconds > 0
        assert TinkerRepository(s, "someone-else").usage_rows(None, None) == []
        usage = {u.owner: u for u in repository.owner_usage(s)}
        assert usage[rows.OWNER].total_device_seconds >= seconds


def test_a_client_saved_idle_stops_waits_paused_and_comes_back_in_a_new_run(store: Path) -> None:
    """The worker's side of FTQ_TINKER_IDLE_SECONDS (the API saves the state, then marks the row): the run
    stops, the row waits `paused` holding no device with that run's device time counted once; its resume
    queues a new launch (never the old run adopted from its folder) that loads the saved state."""
    from worker import controller

    tiny_assets()
    add_client()
    controller.training_clients_changed(MODEL_ID)
    row = settle({"running"})
    folder = store.parent / "tinker" / "clients" / f"tc_{row.seq}"
    deadline = time.monotonic() + 90
    while (url := read_endpoint(folder)) is None:
        assert time.monotonic() < deadline, (folder / "train.log").read_text()
        time.sleep(0.2)
    state = store.parent / "tinker" / "checkpoints" / f"tc_{row.seq}" / "idle" / "state"
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        key = {KEY_HEADER: row.api_key}
        saved = http.post(
            "/save_state", json={"folder": str(state), "optimizer": True, "grads": True}, headers=key
        )
        assert saved.status_code == 200, saved.text
    first_pid = row.pid
    with session_scope() as s:
        assert training_clients.mark_idle_saved(s, MODEL_ID, str(state))
        s.commit()
    controller.training_clients_changed(MODEL_ID)  # the task the API sends after its save
    row = settle({"paused"})
    assert row.resources is None and row.started_at is None and row.idle_state == str(state)
    earlier = row.earlier_device_seconds or 0.0
    assert earlier > 0 and not (folder / "endpoint.json").exists()
    with session_scope() as s:
        counted = {u.owner: u for u in repository.owner_usage(s)}[rows.OWNER].total_device_seconds
        assert counted == pytest.approx(earlier)  # the run's time, counted as it ended

        assert TinkerRepository(s, rows.OWNER).resume_idle(MODEL_ID)
        s.commit()
    controller.training_clients_changed(MODEL_ID)
    row = settle({"running"})
    assert row.pid != first_pid and row.idle_state is None
    assert row.config["load"] == {"folder": str(state), "optimizer": True, "grads": True, "path": None}
    deadline = time.monotonic() + 90
    while read_endpoint(folder) is None:
        assert time.monotonic() < deadline, (folder / "train.log").read_text()
        time.sleep(0.2)

    with session_scope() as s:
        assert TinkerRepository(s, rows.OWNER).request_cancel(MODEL_ID) == JobStatus.cancelling
        s.commit()
    controller.training_clients_changed(MODEL_ID)
    row = settle({"cancelled"})
    with session_scope() as s:
        ((_, _, seconds, _),) = TinkerRepository(s, rows.OWNER).usage_rows(None, None)
        assert seconds > earlier  # both runs
        total = {u.owner: u for u in repository.owner_usage(s)}[rows.OWNER].total_device_seconds
        assert total == pytest.approx(seconds, rel=0.05)  # each run counted once
        events = [
            e.type.removeprefix("training_client.") for e in TinkerRepository(s, rows.OWNER).events(MODEL_ID)
        ]
    assert events == ["created", "started", "idle_saved", "resumed", "started", "stopped"], events
