"""The trainer's check that its trackers are reachable, before the model loads (issue 28, finding 6),
against real sockets: a closed port, and a server that accepts and never answers. The real `mlflow
server` answers it in tests/e2e/client/test_trackers.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.spec import IntegrationsSpec
from trainer import trackers
from trainer.errors import TrackerError
from worker.failures import classify


@pytest.fixture
def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _mlflow(monkeypatch: pytest.MonkeyPatch, url: str, failure: str) -> IntegrationsSpec:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("FTQ_TRACKER_FAILURE", failure)
    monkeypatch.setenv("FTQ_TRACKER_CHECK_SECONDS", "1")
    monkeypatch.delenv("RANK", raising=False)
    return IntegrationsSpec.model_validate({"mlflow": {"experiment": "e"}, "tensorboard": True})


def test_an_unreachable_tracker_is_told_in_seconds(closed_url: str, silent_url: str) -> None:
    for url, says in ((closed_url, "ConnectionRefusedError"), (silent_url, "no answer within 1 s")):
        started = time.monotonic()
        problem = trackers.probe(url, 1.0)
        assert problem is not None and says in problem, problem
        assert time.monotonic() - started < 30  # liveness only: not minutes of retries


def test_a_silent_server_gets_the_same_answer_when_the_wait_ends_late(
    monkeypatch: pytest.MonkeyPatch, silent_url: str
) -> None:
    """The probe's socket times out after the same `seconds` that its wait lasts. On a loaded machine the
    wait can end last: the answer is still that the server did not answer (a full run once said
    "TimeoutError: timed out")."""
    join = threading.Thread.join

    def late_join(self: threading.Thread, timeout: float | None = None) -> None:
        join(self, None if timeout is None else timeout + 2)

    monkeypatch.setattr(threading.Thread, "join", late_join)
    assert trackers.probe(silent_url, 0.5) == "no answer within 0.5 s"


def test_fail_ends_the_run_with_tracker_error_naming_the_setting_and_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, closed_url: str
) -> None:
    integrations = _mlflow(monkeypatch, closed_url, "fail")
    with pytest.raises(TrackerError) as caught:
        trackers.check_reachable(integrations, tmp_path)
    line = caught.value.line()
    assert "FTQ_MLFLOW_TRACKING_URI" in line and closed_url in line and "FTQ_TRACKER_FAILURE=fail" in line
    # The worker reads the line back as the job's error code.
    failure = classify(exit_code=2, log_tail=f"Traceback ...\n{line}\n")
    assert failure.code == ErrorCode.tracker_error == "tracker_error"


def test_continue_drops_the_tracker_and_warns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, silent_url: str
) -> None:
    integrations = _mlflow(monkeypatch, silent_url, "continue")
    trackers.check_reachable(integrations, tmp_path)
    assert integrations.mlflow is None and integrations.report_to == ["tensorboard"]
    [warning] = [json.loads(line) for line in (tmp_path / runs.WARNINGS).read_text().splitlines()]
    assert warning["kind"] == "tracker_unreachable"
    assert silent_url in warning["message"] and "FTQ_TRACKER_FAILURE=continue" in warning["message"]


def test_offline_and_local_trackers_are_not_probed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
    spec = IntegrationsSpec.model_validate({"wandb": {"project": "p"}, "mlflow": {"experiment": "e"}})
    assert trackers.tracker_targets(spec) == []
