"""Schemathesis against the API in process (through ASGI): every phase, with auth, no 500s, responses as
documented. The same app on a socket, with owners and limits, is attacked in tests/e2e/security."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.engine import events, from_schema

from tests.harness import config_only_model, text_dataset
from tests.harness.inprocess import migrate, use_settings

TOKEN = "fuzz-token-0123456789"
OTHER = "other-token-9876543210"
# A valid CPU spec on the config-only model and data the test puts under its local root.
SPEC = {
    "name": "fuzz",
    "model": {"name_or_path": "./model"},
    "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
    "training": {"max_steps": 2, "max_seq_len": 32, "logging_steps": 1, "mixed_precision": "no"},
    "resources": {"device": "cpu", "processes_per_node": 1},
}

# Checks that hold for this API. Left out: `positive_data_acceptance` (a schema-valid spec can still be
# refused: a hub model id that is not local, a path outside the roots) and `missing_required_header`
# and `ignored_auth`, which need an operation without auth to mean anything; auth is tested directly
# in test_owners.py. `use_after_free` and `ensure_resource_availability` make sense only with a delete.
ON = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "unsupported_method",
)
OFF = (
    "positive_data_acceptance",
    "missing_required_header",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
)
CHECKS = {name: {"enabled": name in ON} for name in ON + OFF}


def _config(max_examples: int) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": 20240607,
            "headers": {"Authorization": f"Bearer {TOKEN}"},
            "request-timeout": 20,
            "max-failures": 50,
            "generation": {
                "mode": "all",
                "max-examples": max_examples,
                "no-shrink": True,
                "database": "none",
            },
            "checks": CHECKS,
            "phases": {
                # The document has no examples of its own: build them from the schemas.
                "examples": {"enabled": True, "fill-missing": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": True, "max-steps": 10},
            },
            # A log stream follows a job until it ends; no worker runs here, so its jobs never end.
            "operations": [{"include-path-regex": "/logs/stream$", "request-timeout": 1.5}],
        }
    )


def _describe(failure_events: list[Any]) -> str:
    lines = []
    for ev in failure_events:
        for case_id, checks in ev.recorder.checks.items():
            for check in checks:
                if check.failure_info is None:
                    continue
                case = ev.recorder.cases[case_id].value
                interaction = ev.recorder.interactions.get(case_id)
                status = interaction.response.status_code if interaction and interaction.response else None
                body = interaction.response.content[:600] if interaction and interaction.response else b""
                lines.append(
                    f"[{ev.phase}] {ev.recorder.label}: {check.name}: {check.failure_info.failure.title}\n"
                    f"    {case.method} {case.formatted_path} query={case.query} headers="
                    f"{ {k: v for k, v in (case.headers or {}).items() if k.lower() != 'authorization'} }\n"
                    f"    body={str(case.body)[:300]}\n    -> {status} {body!r}"
                )
    return "\n".join(lines[:40])


def test_schemathesis_all_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In process through ASGI: twice the cases per second of a socket on this 2-core budget. The
    # real-process behaviour (auth, owners, limits) is what test_owners.py and test_limits.py check.
    from fastapi.testclient import TestClient

    from service.app import create_app

    (tmp_path / "data").mkdir()
    assets = tmp_path / "assets"
    config_only_model(assets / "model")
    text_dataset(assets / "data" / "train.jsonl")
    use_settings(
        monkeypatch,
        env="test",
        data_dir=tmp_path / "data",
        api_tokens=f"{TOKEN}:fuzzer,{OTHER}:other",
        local_roots=str(assets),
        post_rate_per_minute=1_000_000,
        max_active_jobs_per_owner=1_000_000,
    )
    migrate()
    app = create_app()

    # A job that belongs to someone else: fuzzing must never reach it (404, never 500).
    with TestClient(app) as other:
        r = other.post("/jobs", json=SPEC, headers={"Authorization": f"Bearer {OTHER}"})
        assert r.status_code == 201, r.text
        other_id = r.json()["id"]

    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=_config(max_examples=10))
    cases: Counter[str] = Counter()
    failures: list[Any] = []
    fatal: list[str] = []
    finished = None
    started: dict[str, float] = {}
    timing: dict[str, float] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, events.PhaseStarted):
            started[str(event.phase.name.value)] = event.timestamp
        elif isinstance(event, events.PhaseFinished):
            name = str(event.phase.name.value)
            timing[name] = round(event.timestamp - started.get(name, event.timestamp), 1)
        elif isinstance(event, events.ScenarioFinished):
            cases[str(event.phase.value)] += len(event.recorder.cases)
            if any(c.failure_info is not None for cs in event.recorder.checks.values() for c in cs):
                failures.append(event)
        elif isinstance(event, events.NonFatalError):
            fatal.append(f"{event.label}: {event.info.format()}"[:800])
        elif isinstance(event, events.FatalError):
            fatal.append(repr(event.exception))
        elif isinstance(event, events.EngineFinished):
            finished = event

    assert finished is not None
    assert not fatal, "\n".join(fatal)
    assert not failures, _describe(failures)
    total = sum(cases.values())
    print(f"schemathesis cases by phase: {dict(cases)}; total {total}; seconds by phase: {timing}")
    assert total >= 1000, dict(cases)
    for phase in ("examples", "coverage", "fuzzing"):
        assert cases[phase] > 0, dict(cases)
    # The other owner's job was never reached (its status would have changed on a cancel).
    with TestClient(app) as c:
        job = c.get(f"/jobs/{other_id}", headers={"Authorization": f"Bearer {OTHER}"}).json()
        assert job["status"] == "queued"
        mine = c.get("/jobs?limit=500", headers={"Authorization": f"Bearer {TOKEN}"}).json()["data"]
        assert other_id not in {j["id"] for j in mine}
