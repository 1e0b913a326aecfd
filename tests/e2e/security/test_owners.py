"""Owners kept apart, against a real `ftq api` with tokens: 401 without a valid token on every route,
404 for another owner's job on every route (the same answer as for a job that does not exist), and no
open listener without auth."""

from __future__ import annotations

import inspect
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftq.runtime.settings import Settings
from tests.e2e.security.common import TOKENS, base_spec
from tests.harness import FTQ, REPO, Deployment, clean_env, free_port

ALICE, BOB = TOKENS["alice"], TOKENS["bob"]

# Every route of the jobs API: (method, path template).
JOB_ROUTES = [
    ("GET", "/jobs/{id}"),
    ("GET", "/jobs/{id}/plan"),
    ("GET", "/jobs/{id}/logs"),
    ("GET", "/jobs/{id}/logs/stream"),
    ("GET", "/jobs/{id}/metrics"),
    ("GET", "/jobs/{id}/checkpoints"),
    ("GET", "/jobs/{id}/exports"),
    ("GET", "/jobs/{id}/samples"),
    ("GET", "/jobs/{id}/artifacts"),
    ("GET", "/jobs/{id}/artifacts/train.log"),
    ("GET", "/jobs/{id}/artifacts/checkpoints/checkpoint-1.tar"),
    ("POST", "/jobs/{id}/cancel"),
]
ALL_ROUTES = [("GET", "/jobs"), ("POST", "/jobs"), ("POST", "/jobs?dry_run=true"), *JOB_ROUTES]

BAD_AUTH: dict[str, str | bytes | None] = {
    "none": None,
    "wrong": f"Bearer {ALICE[:-1]}X",
    "prefix": f"Bearer {ALICE[:-4]}",
    "longer": f"Bearer {ALICE}0",
    "case": f"Bearer {ALICE.upper()}",
    "quoted-empty": 'Bearer ""',
    "scheme-only": "Bearer",
    "basic": "Basic YWxpY2U6c2VjcmV0",
    "token-without-scheme": ALICE,
    "owner-name": "Bearer alice",
    "pair": f"Bearer {ALICE}:alice",
    "two-tokens": f"Bearer {BOB},{ALICE}",
    "non-ascii": "Bearer t\u00f6ken".encode(),
}


@pytest.fixture(scope="module")
def server(shared: Deployment) -> Deployment:
    return shared


@pytest.fixture(scope="module")
def alice_job(server: Deployment) -> dict[str, Any]:
    with server.client(ALICE) as c:
        r = c.post("/jobs", json=base_spec())
        assert r.status_code == 201, r.text
        job: dict[str, Any] = r.json()
    run = server.data_dir / "runs" / job["id"]
    run.mkdir(parents=True, exist_ok=True)
    (run / "train.log").write_text("alice's private log line\n")
    (run / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    return job


def _call(client: httpx.Client, method: str, path: str, headers: dict[str, Any]) -> httpx.Response:
    if method == "POST" and path.startswith("/jobs") and path.split("?")[0] == "/jobs":
        return client.request(method, path, json=base_spec(), headers=headers)
    if path.endswith("/stream"):
        # A stream answers its status before any event: read the head only.
        with client.stream(method, path, headers=headers) as r:
            r.read() if r.status_code != 200 else None
            return r
    return client.request(method, path, headers=headers)


@pytest.mark.parametrize("auth", list(BAD_AUTH), ids=list(BAD_AUTH))
def test_every_route_needs_a_valid_token(server: Deployment, alice_job: dict[str, Any], auth: str) -> None:
    value = BAD_AUTH[auth]
    headers: dict[str, Any] = {"Authorization": value} if value is not None else {}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for method, template in ALL_ROUTES:
            path = template.format(id=alice_job["id"])
            r = _call(c, method, path, headers)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
            assert r.json()["code"] == "unauthorized"
            assert "alice" not in r.text
        # Liveness, readiness and the API description stay open.
        for path in ("/healthz", "/readyz", "/openapi.json"):
            assert c.get(path, headers=headers).status_code == 200, path
    with server.client(ALICE) as c:
        assert c.get(f"/jobs/{alice_job['id']}").json()["status"] == "queued"
        assert len(c.get("/jobs").json()["data"]) >= 1


def test_another_owners_job_is_404_on_every_route(server: Deployment, alice_job: dict[str, Any]) -> None:
    missing = "job_" + "0" * 16
    with server.client(BOB) as bob, server.client(ALICE) as alice:
        for method, template in JOB_ROUTES:
            theirs = _call(bob, method, template.format(id=alice_job["id"]), {})
            nobody = _call(bob, method, template.format(id=missing), {})
            assert theirs.status_code == 404, (method, template, theirs.status_code, theirs.text)
            # The same answer as for a job that does not exist: nothing tells bob it is there.
            expected = {
                k: (v.replace(missing, alice_job["id"]) if isinstance(v, str) else v)
                for k, v in nobody.json().items()
            }
            assert theirs.json() == expected
            assert "alice" not in theirs.text
            mine = _call(alice, method, template.format(id=alice_job["id"]), {})
            assert mine.status_code in (200, 202), (method, template, mine.status_code, mine.text)
            if method == "POST":
                break  # the cancel is last: alice's own cancel is the only one that counted
        # Bob's cancel changed nothing; alice's did.
        assert alice.get(f"/jobs/{alice_job['id']}").json()["status"] == "cancelled"
        # Bob's list never shows it, whatever the filters and pages.
        filters: list[dict[str, Any]] = [
            {},
            {"status": "queued,cancelled"},
            {"limit": 500},
            {"status": "cancelled", "limit": 1},
        ]
        for params in filters:
            ids = [j["id"] for j in bob.get("/jobs", params=params).json()["data"]]
            assert alice_job["id"] not in ids, params
        assert alice_job["id"] in [j["id"] for j in alice.get("/jobs", params={"limit": 500}).json()["data"]]
        # Nor can bob resume from it, or find it by its run directory.
        spec = base_spec()
        spec["resume_from"] = {"job_id": alice_job["id"]}
        r = bob.post("/jobs", params={"dry_run": "true"}, json=spec)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "resume_from", "job_id"], r.text
        spec["resume_from"] = {"job_id": missing}
        assert bob.post("/jobs", params={"dry_run": "true"}, json=spec).json() == r.json()


def test_jobs_are_created_for_the_tokens_owner(server: Deployment) -> None:
    with server.client(BOB) as bob, server.client(ALICE) as alice:
        job = bob.post("/jobs", json=base_spec()).json()
        assert job["owner"] == "bob"
        assert alice.get(f"/jobs/{job['id']}").status_code == 404
        # An owner field in the body cannot choose another owner: unknown fields are refused.
        assert bob.post("/jobs", json={**base_spec(), "owner": "alice"}).status_code == 422


def test_tokens_are_compared_in_constant_time() -> None:
    """Code review, made executable: every configured token is compared with hmac.compare_digest and
    the loop never returns early, so the time taken says nothing about near misses or which token."""
    source = inspect.getsource(Settings.owner_for_token)
    assert "hmac.compare_digest" in source
    assert "return owner" not in source and "break" not in source
    s = Settings(api_tokens=f"{ALICE}:alice,{BOB}:bob")
    assert s.owner_for_token(ALICE) == "alice" and s.owner_for_token(BOB) == "bob"
    assert s.owner_for_token(ALICE[:-1]) is None and s.owner_for_token("") is None
    assert s.owner_for_token(ALICE + ALICE) is None


@pytest.mark.parametrize(
    ("command", "host", "via_env"),
    [("api", "0.0.0.0", False), ("api", "::", True), ("up", "192.0.2.10", False), ("up", "0.0.0.0", True)],
)
def test_no_tokens_no_open_listener(tmp_path: Path, command: str, host: str, via_env: bool) -> None:
    env = clean_env(FTQ_DATA_DIR=str(tmp_path / "data"))
    argv = [FTQ, command, "--port", str(free_port())]
    if via_env:
        env["FTQ_HOST"] = host
    else:
        argv += ["--host", host]
    p = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, (argv, p.stdout, p.stderr)
    assert "FTQ_API_TOKENS" in p.stderr and host in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    # Nothing was started: no store was even created.
    assert not (tmp_path / "data" / "ftq.db").exists()
