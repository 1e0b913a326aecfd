"""The CLI's follow loops keep following through a slow or restarting server: a timeout, a dropped
connection or a 503 is said once on stderr and polled through, up to the patience; a longer outage (or
any other failure) ends the command as before."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ftq.cli import client as client_cli
from ftq.client import ExportPublic, _core
from ftq.client.errors import ConnectionFailed, ServerTimeout, Unavailable

URL = "http://127.0.0.1:1"


def _export(status: str) -> ExportPublic:
    return ExportPublic.model_validate(
        {
            "id": "exp_1", "job_id": "job_1", "kind": "merged", "dtype": "bf16", "max_shard_size": "5GB",
            "push_to_hub": None, "status": status, "error": None, "path": "exports/exp_1",
            "created_at": datetime.now(UTC), "started_at": None, "finished_at": None,
        }
    )  # fmt: skip


class Jobs:
    """`client.jobs` whose get_export answers from a script: an export, or an error to raise."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def get_export(self, job_id: str, export_id: str) -> ExportPublic:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


class FakeClient:
    def __init__(self, answers: list[Any]) -> None:
        self.jobs = Jobs(answers)


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_cli, "POLL_SECONDS", 0.0)


def test_a_followed_export_is_polled_through_timeouts_and_503s(capsys: pytest.CaptureFixture[str]) -> None:
    answers: list[Any] = [
        ServerTimeout(URL),
        Unavailable(503, "unavailable", "the store is restarting"),
        _export("running"),
        ServerTimeout(URL),
        _export("succeeded"),
    ]
    ended = client_cli.follow_export(FakeClient(answers), "job_1", _export("queued"))  # type: ignore[arg-type]
    assert ended.status == "succeeded" and answers == []
    err = capsys.readouterr().err
    # Said once per outage, and that it is over: not a line per failed poll.
    assert err.count("still following") == 2 and err.count("answers again") == 2


def test_an_outage_longer_than_the_patience_ends_the_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(0, 10_000, 100))
    monkeypatch.setattr(_core.time, "monotonic", lambda: next(clock))
    answers: list[Any] = [ServerTimeout(URL) for _ in range(10)]
    with pytest.raises(ServerTimeout):
        client_cli.follow_export(FakeClient(answers), "job_1", _export("running"))  # type: ignore[arg-type]
    assert len(answers) == 10 - 5  # 0, 100, 200, 300 s within OUTAGE_PATIENCE_SECONDS; raised at 400 s


def test_a_followed_export_rides_out_refused_connections_while_the_server_restarts() -> None:
    # The export was just made, so the server was there: refused now means it is restarting.
    answers: list[Any] = [ConnectionFailed(URL, "connection refused"), _export("succeeded")]
    ended = client_cli.follow_export(FakeClient(answers), "job_1", _export("running"))  # type: ignore[arg-type]
    assert ended.status == "succeeded" and answers == []
