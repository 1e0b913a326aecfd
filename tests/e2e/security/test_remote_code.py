"""Issue 18, item 1: `model.trust_remote_code` runs code from the model repo inside the launch, where it
can read whatever the launch can. It is refused (422 naming the field) unless the operator allows it
(FTQ_ALLOW_REMOTE_CODE: false | true | owners), and the trainer passes it to transformers only when the
plan rendered at submit (under that policy) says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.security.common import in_process_api, live_api, spec
from tests.harness import Deployment
from tests.harness.inprocess import MakeClient

TOKENS = {"alice": "alice-rc-token-1", "bob": "bob-rc-token-2"}
FLAG = ["--trust_remote_code", "True"]


def _tokens() -> str:
    return ",".join(f"{t}:{o}" for o, t in TOKENS.items())


def as_owner(live: Deployment, owner: str) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {TOKENS[owner]}"}, timeout=30)


@pytest.fixture(scope="module")
def alice_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with live_api(
        tmp_path_factory.mktemp("rc-alice"), api_tokens=_tokens(), allow_remote_code="alice"
    ) as live:
        yield live


def _has_flag(command: list[str]) -> bool:
    return any(command[i : i + 2] == FLAG for i in range(len(command) - 1))


def _assert_refused(resp: Any) -> None:
    """`resp`: an httpx response, from a live server or the in-process TestClient (starlette's own httpx)."""
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert detail[0]["loc"] == ["body", "model", "trust_remote_code"], detail
    assert "FTQ_ALLOW_REMOTE_CODE" in detail[0]["msg"]


@pytest.mark.parametrize("setting", [None, "false", "", "carol, dave"])
def test_remote_code_is_refused_unless_allowed(
    make_client: MakeClient, ftq_env: dict[str, str], setting: str | None
) -> None:
    # One setting decides the answer: the app in process, on live_api's assets and settings.
    settings = {"api_tokens": _tokens()}
    if setting is not None:
        settings["allow_remote_code"] = setting
    alice = in_process_api(make_client, Path(ftq_env["FTQ_DATA_DIR"]), **settings)
    alice.headers["Authorization"] = f"Bearer {TOKENS['alice']}"
    before = len(alice.get("/jobs").json()["data"])
    for params in ({}, {"dry_run": "true"}):
        _assert_refused(alice.post("/jobs", params=params, json=spec(trust_remote_code=True)))
    yaml_body = yaml.safe_dump(spec(trust_remote_code=True)).encode()
    _assert_refused(alice.post("/jobs", content=yaml_body, headers={"content-type": "application/yaml"}))
    assert len(alice.get("/jobs").json()["data"]) == before
    # Without the field nothing changes.
    assert alice.post("/jobs", params={"dry_run": "true"}, json=spec()).status_code == 200


def test_only_the_allowed_owner_may_run_remote_code(alice_only: Deployment) -> None:
    with as_owner(alice_only, "bob") as bob:
        _assert_refused(bob.post("/jobs", json=spec(trust_remote_code=True)))
        _assert_refused(bob.post("/jobs", params={"dry_run": "true"}, json=spec(trust_remote_code=True)))
    with as_owner(alice_only, "alice") as alice:
        plan = alice.post("/jobs", params={"dry_run": "true"}, json=spec(trust_remote_code=True))
        assert plan.status_code == 200, plan.text
        assert _has_flag(plan.json()["command"])
        created = alice.post("/jobs", json=spec(trust_remote_code=True))
        assert created.status_code == 201, created.text
        stored = alice.get(f"/jobs/{created.json()['id']}/plan").json()
        assert _has_flag(stored["command"]), stored["command"]
        # A job that does not ask for remote code is not launched with it, even for an allowed owner.
        plain = alice.post("/jobs", params={"dry_run": "true"}, json=spec()).json()
        assert not _has_flag(plain["command"])


def test_everyone_when_allowed_globally(make_client: MakeClient, ftq_env: dict[str, str]) -> None:
    data_dir = Path(ftq_env["FTQ_DATA_DIR"])
    bob = in_process_api(make_client, data_dir, api_tokens=_tokens(), allow_remote_code="true")
    bob.headers["Authorization"] = f"Bearer {TOKENS['bob']}"
    resp = bob.post("/jobs", params={"dry_run": "true"}, json=spec(trust_remote_code=True))
    assert resp.status_code == 200, resp.text
    assert _has_flag(resp.json()["command"])


def test_trainer_needs_the_launch_flag_as_well_as_the_spec(tmp_path: Path) -> None:
    """A spec.json that asks for remote code on its own (written by hand, or stored before the policy
    existed) loads the model without it; only the plan's flag, rendered under the policy, allows it."""
    from trainer.args import parse_args

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(trust_remote_code=True)))
    base = ["--spec", str(path), "--output_dir", str(tmp_path)]
    assert parse_args(base).spec.model.trust_remote_code is False
    assert parse_args([*base, "--trust_remote_code", "False"]).spec.model.trust_remote_code is False
    assert parse_args([*base, *FLAG]).spec.model.trust_remote_code is True
    path.write_text(json.dumps(spec()))
    assert parse_args([*base, *FLAG]).spec.model.trust_remote_code is False
