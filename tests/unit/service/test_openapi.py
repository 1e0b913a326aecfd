"""The committed OpenAPI document is the one the app serves (regenerate with `make openapi`)."""

from __future__ import annotations

import json

from tests.harness import REPO
from tests.harness.inprocess import MakeClient

COMMITTED = REPO / "openapi" / "openapi.json"


def test_served_openapi_equals_committed(make_client: MakeClient) -> None:
    served = make_client().get("/openapi.json").json()
    assert served == json.loads(COMMITTED.read_text()), "openapi/openapi.json is stale: run `make openapi`"


def test_openapi_declares_both_spec_body_types_and_every_route(make_client: MakeClient) -> None:
    doc = make_client().get("/openapi.json").json()
    body = doc["paths"]["/jobs"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/yaml"}
    assert "JobSpec" in doc["components"]["schemas"]
    for path in [
        "/jobs",
        "/jobs/{job_id}",
        "/jobs/{job_id}/cancel",
        "/jobs/{job_id}/pause",
        "/jobs/{job_id}/resume",
        "/jobs/{job_id}/plan",
        "/jobs/{job_id}/logs",
        "/jobs/{job_id}/logs/stream",
        "/jobs/{job_id}/metrics",
        "/jobs/{job_id}/checkpoints",
        "/jobs/{job_id}/artifacts",
        "/jobs/{job_id}/artifacts/{path}",
        "/healthz",
        "/readyz",
    ]:
        assert path in doc["paths"], path
