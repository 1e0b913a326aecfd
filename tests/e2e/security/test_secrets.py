"""Secrets: a hub token reaches the run through the environment only, and the API never shows it.

The operator sets HF_TOKEN (named by FTQ_PASS_ENV) for the service. A spec has no field that could
carry one (unknown fields are refused); plans, jobs, the OpenAPI document and the store never hold it;
train.log may (a library prints it), and the logs API serves it as `***`, however the log is cut into
chunks, as does the event stream and a job's error message.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from tests.e2e.security.common import HF_TOKEN, TOKENS, WANDB_KEY, base_spec
from tests.harness import Deployment

TOKEN = TOKENS["sec"]
HF, WANDB = HF_TOKEN, WANDB_KEY


def _leaks(text: str, value: str = HF) -> list[str]:
    """The secret, or any 8-character piece of it, found in text."""
    return [value[i : i + 8] for i in range(len(value) - 7) if value[i : i + 8] in text]


@pytest.fixture(scope="module")
def server(shared: Deployment) -> Deployment:
    return shared


def _job_with_log(server: Deployment, text: str) -> str:
    with server.client(TOKEN) as c:
        r = c.post("/jobs", json=base_spec())
        assert r.status_code == 201, r.text
        job_id = str(r.json()["id"])
        # Cancel the queued job (no worker here): a terminal job's log stream ends.
        assert c.post(f"/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    run = server.data_dir / "runs" / job_id
    run.mkdir(parents=True, exist_ok=True)
    (run / "train.log").write_text(text, encoding="utf-8")
    return job_id


def _log_text(n: int = 300) -> str:
    lines = [f"step {i} loss 1.{i:03d} ✓\n" for i in range(n)]
    lines[1] = f"Authorization: Bearer {HF}\n"
    lines[n // 2] = f"HF_TOKEN={HF} WANDB_API_KEY={WANDB} again {HF}{HF}\n"
    lines[n - 1] = f"token at the very end {HF}"
    return "".join(lines)


@pytest.mark.parametrize("limit", [1, 5, 17, 40, 333, 4096, 1_048_576])
def test_logs_are_redacted_however_they_are_cut(server: Deployment, limit: int) -> None:
    # Small chunks read a short log (one request per chunk); large ones a long one.
    text = f"step 0 loss 1.000 ✓\nBearer {HF}\n{WANDB}{HF} tail" if limit < 1000 else _log_text()
    job_id = _job_with_log(server, text)
    parts, offset = [], 0
    with server.client(TOKEN) as c:
        for _ in range(20_000):
            chunk = c.get(f"/jobs/{job_id}/logs", params={"offset": offset, "limit": limit}).json()
            parts.append(chunk["text"])
            if chunk["next_offset"] == offset:
                break
            offset = chunk["next_offset"]
    whole = "".join(parts)
    assert offset == len(text.encode())
    assert chunk["complete"] is True
    assert not _leaks(whole), _leaks(whole)
    assert not _leaks(whole, WANDB)
    assert "***" in whole
    # Everything else arrives intact.
    assert whole.replace("***", "") == text.replace(HF, "").replace(WANDB, "")
    assert "step 0 loss 1.000 ✓" in whole


@pytest.mark.parametrize("limit", [1, 5, 10_000])
def test_log_read_from_inside_a_secret_is_redacted(server: Deployment, limit: int) -> None:
    text = f"{HF} tail"
    job_id = _job_with_log(server, text)
    with server.client(TOKEN) as c:
        for offset in range(len(HF)):
            got = c.get(f"/jobs/{job_id}/logs", params={"offset": offset, "limit": limit}).json()
            # Even the last characters of the secret, alone in a chunk, come back masked.
            assert got["text"].startswith("***"), (offset, got)
            assert not _leaks(got["text"]), (offset, got)


def test_log_stream_is_redacted(server: Deployment) -> None:
    text = _log_text()
    job_id = _job_with_log(server, text)
    with server.client(TOKEN) as c, c.stream("GET", f"/jobs/{job_id}/logs/stream") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    assert "event: end" in body
    data = "".join(
        json.loads(line[len("data: ") :])["text"]
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: {}"
    )
    assert not _leaks(body) and not _leaks(data)
    assert "step 298 loss 1.298 ✓" in data


def test_train_log_as_an_artifact_is_masked_and_keeps_its_size(server: Deployment) -> None:
    text = _log_text().encode()
    job_id = _job_with_log(server, text.decode())
    masked = text.replace(HF.encode(), b"*" * len(HF)).replace(WANDB.encode(), b"*" * len(WANDB))
    with server.client(TOKEN) as c:
        listed = {a["path"]: a for a in c.get(f"/jobs/{job_id}/artifacts").json()["data"]}
        body = c.get(f"/jobs/{job_id}/artifacts/train.log").content
        assert body == masked
        assert listed["train.log"]["size"] == len(text)
        assert listed["train.log"]["sha256"] == hashlib.sha256(masked).hexdigest()
        # A range that starts or ends inside a secret is masked too.
        first = text.index(HF.encode())
        for offset in range(first - 2, first + len(HF)):
            r = c.get(
                f"/jobs/{job_id}/artifacts/train.log", headers={"Range": f"bytes={offset}-{offset + 4}"}
            )
            assert r.status_code == 206 and r.content == masked[offset : offset + 5], offset
            assert not _leaks(r.text)


UNKNOWN_FIELDS = [
    ("hf_token",),
    ("token",),
    ("env",),
    ("secrets",),
    ("model", "token"),
    ("model", "use_auth_token"),
    ("dataset", "token"),
    ("training", "report_to"),
    ("training", "hub_token"),
    ("resources", "env"),
    ("resources", "slurm", "export"),
]


@pytest.mark.parametrize("where", UNKNOWN_FIELDS, ids=lambda w: ".".join(w))
def test_no_spec_field_carries_a_token(server: Deployment, where: tuple[str, ...]) -> None:
    spec = base_spec()
    node = spec
    for part in where[:-1]:
        node = node.setdefault(part, {})
    value = "hf_in_spec_abcdef"
    node[where[-1]] = {"HF_TOKEN": value} if where[-1] in ("env", "secrets") else value
    with server.client(TOKEN) as c:
        for dry in (True, False):
            r = c.post("/jobs", params={"dry_run": str(dry).lower()}, json=spec)
            assert r.status_code == 422, r.text
            assert any(e["loc"][-1] == where[-1] for e in r.json()["detail"]), r.text
            # The refusal does not echo the value back.
            assert "hf_in_spec_abcdef" not in r.text


def test_plan_job_list_and_openapi_never_hold_the_secret(server: Deployment) -> None:
    with server.client(TOKEN) as c:
        job = c.post("/jobs", json=base_spec()).json()
        bodies = [
            c.post("/jobs", params={"dry_run": "true"}, json=base_spec()).text,
            c.get(f"/jobs/{job['id']}").text,
            c.get(f"/jobs/{job['id']}/plan").text,
            c.get("/jobs").text,
            c.get("/openapi.json").text,
            c.get("/docs").text,
            c.get("/readyz").text,
        ]
    for body in bodies:
        assert not _leaks(body) and not _leaks(body, WANDB)
    # Nor the store (SQLite file, with its write-ahead log).
    for f in server.data_dir.glob("ftq.db*"):
        raw = f.read_bytes()
        assert HF.encode() not in raw and WANDB.encode() not in raw


@pytest.mark.slow
def test_a_real_run_gets_the_secret_and_the_api_never_shows_it(shared_up: Deployment) -> None:
    leaky_server = shared_up
    spec = base_spec()
    spec["name"] = "leaky"  # the stand-in interpreter prints the secret for this job
    with leaky_server.client(TOKEN) as c:
        r = c.post("/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            job = c.get(f"/jobs/{job_id}").json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        assert job["status"] == "failed", (job, leaky_server.log()[-3000:])
        run = leaky_server.data_dir / "runs" / job_id
        # The launch received the operator's value through its environment.
        assert (run / "received.sha256").read_text() == hashlib.sha256(HF.encode()).hexdigest()
        log = (run / "train.log").read_text()
        assert HF in log  # the leaky stand-in printed it; the API must not pass it on
        served = c.get(f"/jobs/{job_id}/logs").json()["text"]
        assert "***" in served and not _leaks(served)
        assert job["error"]["code"] == "model_error"
        assert not _leaks(json.dumps(job)), job["error"]
        assert "***" in job["error"]["message"]
        for path in ("", "/plan"):
            assert not _leaks(c.get(f"/jobs/{job_id}{path}").text)
        assert not _leaks(c.get("/jobs").text)
    # Nothing the service wrote holds it: the scripts, the spec, the accelerate config, the store.
    for f in run.iterdir():
        if f.is_file() and f.name != "train.log":
            assert HF.encode() not in f.read_bytes(), f.name
    for f in leaky_server.data_dir.glob("ftq.db*"):
        assert HF.encode() not in f.read_bytes()
