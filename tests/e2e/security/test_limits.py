"""Limits on a real `ftq api`: body size (413, with or without Content-Length), active jobs per owner
(429), submissions per minute per owner (429 + Retry-After); one owner's limits never block another."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.e2e.security.common import LIMIT_TOKENS, LIMITS, base_spec
from tests.harness import Deployment

MAX_BODY = int(LIMITS["max_body_bytes"])
MAX_ACTIVE = int(LIMITS["max_active"])
RATE = int(LIMITS["rate"])
TOKENS = LIMIT_TOKENS


@pytest.fixture(scope="module")
def server(limited: Deployment) -> Deployment:
    return limited


def _padded_spec(size: int) -> bytes:
    spec = base_spec()
    body = json.dumps(spec).encode()
    # Whitespace keeps it a valid spec: only its size is wrong.
    return body[:-1] + b" " * (size - len(body)) + b"}"


def test_body_size_cap(server: Deployment) -> None:
    with server.client(TOKENS["big"]) as c:
        headers = {"content-type": "application/json"}
        ok = c.post("/jobs", params={"dry_run": "true"}, content=_padded_spec(MAX_BODY - 10), headers=headers)
        assert ok.status_code == 200, ok.text
        r = c.post("/jobs", content=_padded_spec(MAX_BODY + 1), headers=headers)
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large", r.text

        # Without a Content-Length (chunked), the cap holds while the body streams in.
        def chunks() -> Iterator[bytes]:
            body = _padded_spec(MAX_BODY * 50)
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        r = c.post("/jobs", content=chunks(), headers=headers)
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large", r.text
        assert c.get("/jobs").json()["data"] == []
    # A huge announced length is refused from the header alone, before any body is read.
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKENS['big']}\r\nContent-Length: {10**12}\r\n\r\n{{".encode()
        )
        head = sock.recv(4096).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head


def test_active_jobs_cap_per_owner(server: Deployment) -> None:
    with server.client(TOKENS["cap"]) as c, server.client(TOKENS["other"]) as other:
        ids = []
        for _ in range(MAX_ACTIVE):
            r = c.post("/jobs", json=base_spec())
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        r = c.post("/jobs", json=base_spec())
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "rate_limited" and "queued or running" in r.json()["detail"]
        assert int(r.headers["Retry-After"]) > 0
        # Another owner is not held back by this one's jobs.
        assert other.post("/jobs", json=base_spec()).status_code == 201
        # A finished (here: cancelled) job frees its place.
        assert c.post(f"/jobs/{ids[0]}/cancel").status_code == 202
        assert c.post("/jobs", json=base_spec()).status_code == 201


def test_submission_rate_per_owner(server: Deployment) -> None:
    with server.client(TOKENS["rate"]) as c, server.client(TOKENS["big"]) as other:
        for _ in range(RATE):
            r = c.post("/jobs", json=base_spec())
            assert r.status_code == 201, r.text
            # Cancel at once: the active-jobs cap must not be what stops the next one.
            assert c.post(f"/jobs/{r.json()['id']}/cancel").status_code == 202
        r = c.post("/jobs", json=base_spec())
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "rate_limited" and "in a minute" in r.json()["detail"]
        assert 0 < int(r.headers["Retry-After"]) <= 61
        # Dry runs store and launch nothing, so they are not rate limited; nor is another owner.
        assert c.post("/jobs", params={"dry_run": "true"}, json=base_spec()).status_code == 200
        assert other.post("/jobs", json=base_spec()).status_code == 201
