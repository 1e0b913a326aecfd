"""POST /files and friends through HTTP on a real `ftq up`: uploads (multipart and raw) streamed to disk
and validated by the worker, a broken line named by its number, the size cap (413) and the per-owner
quota (429) enforced while streaming, owners kept apart (404/422), and a file in use not deleted (409)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.e2e.files.conftest import ALICE, BOB, CAROL, DAVE, MAX_FILE_BYTES, QUOTA_BYTES
from tests.e2e.files.helpers import owner_files, upload_form, upload_raw, wait_validated
from tests.harness import Deployment, tiny_spec

TEXT_ROWS = b"".join(json.dumps({"text": f"row {i} says hello"}).encode() + b"\n" for i in range(12))
CHAT_ROWS = b"".join(
    json.dumps(
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "ok"}]}
    ).encode()
    + b"\n"
    for i in range(5)
)


def _spec_on(tiny: Path, file_id: str, **training: object) -> dict[str, object]:
    spec = tiny_spec(tiny, **training)  # type: ignore[arg-type]
    spec["dataset"] = {"file_id": file_id, "text_field": "text"}
    return spec


def test_raw_upload_is_stored_hashed_and_validated_ready(files_server: Deployment) -> None:
    r = upload_raw(files_server, ALICE, TEXT_ROWS, filename="../../etc/passwd.jsonl")
    assert r.status_code == 201, r.text
    f = r.json()
    assert f["bytes"] == len(TEXT_ROWS)
    assert f["sha256"] == hashlib.sha256(TEXT_ROWS).hexdigest()
    assert f["filename"] == "passwd.jsonl"  # shown only, and never a path
    assert r.headers["location"] == f"/files/{f['id']}"
    done = wait_validated(files_server, ALICE, f["id"])
    assert done["status"] == "ready", done
    assert done["rows"] == 12
    assert done["columns"] == ["text"]
    assert done["formats"] == ["text"]
    assert "sft" in done["methods"]
    assert done["errors"] == []
    # The bytes are where the server chose, under the owner's hashed folder, named by the id.
    stored = [p for p in (files_server.data_dir / "files").rglob(f"{f['id']}*")]
    assert len(stored) == 1 and stored[0].read_bytes() == TEXT_ROWS
    assert "alice" not in str(stored[0])
    with files_server.client(ALICE) as c:
        got = c.get(f"/files/{f['id']}/content")
    assert got.status_code == 200 and got.content == TEXT_ROWS


def test_multipart_upload_reads_the_file_field_only(files_server: Deployment) -> None:
    r = upload_form(files_server, ALICE, CHAT_ROWS, filename="chat.jsonl")
    assert r.status_code == 201, r.text
    f = wait_validated(files_server, ALICE, r.json()["id"])
    assert f["filename"] == "chat.jsonl"
    assert f["bytes"] == len(CHAT_ROWS)
    assert f["sha256"] == hashlib.sha256(CHAT_ROWS).hexdigest()
    assert f["status"] == "ready" and f["rows"] == 5
    assert f["formats"] == ["messages"]


def test_a_broken_line_makes_the_file_invalid_with_its_line_number(files_server: Deployment) -> None:
    lines = [
        json.dumps({"text": "fine"}),
        json.dumps({"text": "also fine"}),
        '{"text": "cut short',
        json.dumps(["not", "an", "object"]),
        json.dumps({"body": "no known field"}),
        json.dumps({"text": "   "}),
        json.dumps({"text": "fine again"}),
    ]
    r = upload_raw(files_server, ALICE, ("\n".join(lines) + "\n").encode(), filename="broken.jsonl")
    assert r.status_code == 201, r.text
    f = wait_validated(files_server, ALICE, r.json()["id"])
    assert f["status"] == "invalid"
    by_line = {e["line"]: e["message"] for e in f["errors"]}
    assert sorted(by_line) == [3, 4, 5, 6], f["errors"]
    assert "not valid JSON" in by_line[3]
    assert "not an object" in by_line[4]
    assert "missing fields" in by_line[5] and "body" in by_line[5]
    assert "empty" in by_line[6]
    assert f["rows"] == 3


def test_a_job_on_an_invalid_file_is_refused_with_its_status(files_server: Deployment, tiny: Path) -> None:
    r = upload_raw(files_server, ALICE, b'{"text": "ok"}\nnot json\n')
    f = wait_validated(files_server, ALICE, r.json()["id"])
    assert f["status"] == "invalid"
    with files_server.client(ALICE) as c:
        resp = c.post("/jobs", json=_spec_on(tiny, f["id"]))
    assert resp.status_code == 422, resp.text
    err = resp.json()["detail"][0]
    assert err["loc"] == ["body", "dataset", "file_id"]
    assert "invalid" in err["msg"] and "line 2" in err["msg"]


def _chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    line = b'{"text": "' + b"x" * 1000 + b'"}\n'
    block = line * (size // len(line))
    sent = 0
    while sent < total:
        piece = block[: total - sent]
        sent += len(piece)
        yield piece


def test_over_the_size_cap_is_a_413_and_leaves_nothing(files_server: Deployment) -> None:
    before = owner_files(files_server)
    with files_server.client(BOB) as c:
        # Declared too large: refused before a byte is read.
        r = c.post(
            "/files",
            content=_chunks(MAX_FILE_BYTES + 4096),
            headers={"Content-Type": "application/jsonl", "Content-Length": str(MAX_FILE_BYTES + 4096)},
        )
        assert r.status_code == 413, r.text
        assert "FTQ_MAX_FILE_BYTES" in r.json()["detail"]
    with files_server.client(BOB) as c:
        # Chunked (no length): stopped while streaming, once past the cap.
        r = c.post(
            "/files", content=_chunks(MAX_FILE_BYTES + 600_000), headers={"Content-Type": "application/jsonl"}
        )
        assert r.status_code == 413, r.text
    with files_server.client(BOB) as c:
        # A multipart form whose file part is past the cap.
        r = c.post("/files", files={"file": ("big.jsonl", b"".join(_chunks(MAX_FILE_BYTES + 10)))})
        assert r.status_code == 413, r.text
    assert owner_files(files_server) == before  # no partial file left behind
    with files_server.client(BOB) as c:
        assert c.get("/files").json()["data"] == []


def test_past_the_owner_quota_is_a_429_until_files_are_deleted(files_server: Deployment) -> None:
    size = MAX_FILE_BYTES - 100_000
    ids = []
    for _ in range(QUOTA_BYTES // size):
        r = upload_raw(files_server, CAROL, b"".join(_chunks(size)))
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    before = owner_files(files_server)
    with files_server.client(CAROL) as c:
        r = c.post("/files", content=_chunks(size), headers={"Content-Type": "application/jsonl"})
    assert r.status_code == 429, r.text
    assert "FTQ_FILE_QUOTA_BYTES" in r.json()["detail"]
    assert owner_files(files_server) == before
    # Another owner's quota is their own.
    assert upload_raw(files_server, BOB, TEXT_ROWS).status_code == 201
    with files_server.client(CAROL) as c:
        assert c.delete(f"/files/{ids[0]}").status_code == 204
    assert upload_raw(files_server, CAROL, b"".join(_chunks(size))).status_code == 201


def test_another_owner_cannot_see_read_delete_or_train_on_my_file(
    files_server: Deployment, tiny: Path
) -> None:
    mine = upload_raw(files_server, ALICE, TEXT_ROWS).json()
    assert wait_validated(files_server, ALICE, mine["id"])["status"] == "ready"
    unknown = "file_" + "0" * 24
    with files_server.client(BOB) as c:
        listed = c.get("/files").json()["data"]
        assert mine["id"] not in [f["id"] for f in listed]
        for method, path in (
            ("GET", "/files/{}"),
            ("GET", "/files/{}/content"),
            ("DELETE", "/files/{}"),
        ):
            theirs = c.request(method, path.format(mine["id"]))
            missing = c.request(method, path.format(unknown))
            assert theirs.status_code == missing.status_code == 404, (method, path, theirs.text)
            assert theirs.json()["detail"].replace(mine["id"], "X") == missing.json()["detail"].replace(
                unknown, "X"
            )
        # Training on it reads exactly as training on a file that does not exist.
        on_theirs = c.post("/jobs", json=_spec_on(tiny, mine["id"]))
        on_missing = c.post("/jobs", json=_spec_on(tiny, unknown))
        for r in (on_theirs, on_missing):
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"] == ["body", "dataset", "file_id"]
        msg = on_theirs.json()["detail"][0]["msg"].replace(mine["id"], "X")
        assert msg == on_missing.json()["detail"][0]["msg"].replace(unknown, "X")
        dry = c.post("/jobs", params={"dry_run": "true"}, json=_spec_on(tiny, mine["id"]))
        assert dry.status_code == 422
    with files_server.client(ALICE) as c:
        assert c.get(f"/files/{mine['id']}").status_code == 200


def test_without_a_token_every_files_route_is_a_401(files_server: Deployment) -> None:
    with files_server.client(None) as c:
        for method, path in (
            ("GET", "/files"),
            ("POST", "/files"),
            ("GET", "/files/x"),
            ("DELETE", "/files/x"),
        ):
            assert c.request(method, path).status_code == 401


def test_spec_names_a_file_or_a_path_not_both(files_server: Deployment, tiny: Path) -> None:
    spec = tiny_spec(tiny)
    spec["dataset"]["file_id"] = "file_" + "1" * 24
    with files_server.client(ALICE) as c:
        r = c.post("/jobs", json=spec)
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "dataset", "file_id"]
        spec["dataset"] = {"text_field": "text"}
        r = c.post("/jobs", json=spec)
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "dataset", "file_id"]
        assert c.post("/files", content=b"{}", headers={"Content-Type": "text/plain"}).status_code == 415


def test_a_tiny_job_trains_on_an_upload_and_the_file_cannot_go_while_it_runs(
    files_server: Deployment, tiny: Path
) -> None:
    data = (tiny / "data" / "train.jsonl").read_bytes()
    f = wait_validated(files_server, ALICE, upload_raw(files_server, ALICE, data, "train.jsonl").json()["id"])
    assert f["status"] == "ready", f
    with files_server.client(ALICE) as c:
        r = c.post("/jobs", json=_spec_on(tiny, f["id"], max_steps=3))
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["spec"]["dataset"]["file_id"] == f["id"]
        busy = c.delete(f"/files/{f['id']}")
        assert busy.status_code == 409, busy.text
        assert job["id"] in busy.json()["detail"]
    done = files_server.api.wait_terminal(job["id"], timeout=300)
    assert done["status"] == "succeeded", files_server.report(job["id"])
    # The trainer read the uploaded bytes from the run's own copy (what a run user may read).
    run_dir = files_server.run_dir(job["id"])
    spec_json = json.loads((run_dir / "spec.json").read_text())
    assert spec_json["dataset"]["name_or_path"] == str(run_dir / "dataset" / "train.jsonl")
    assert (run_dir / "dataset" / "train.jsonl").read_bytes() == data
    assert "file_id" not in spec_json["dataset"]
    with files_server.client(ALICE) as c:
        assert c.delete(f"/files/{f['id']}").status_code == 204
        assert c.get(f"/files/{f['id']}").status_code == 404
    assert not [p for p in (files_server.data_dir / "files").rglob(f"{f['id']}*")]


def test_listing_is_paginated_newest_first(files_server: Deployment) -> None:
    ids = [upload_raw(files_server, BOB, TEXT_ROWS).json()["id"] for _ in range(3)]
    with files_server.client(BOB) as c:
        seen: list[str] = []
        cursor = None
        while True:
            page = c.get("/files", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
            seen += [f["id"] for f in page["data"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
    assert seen[:3] == ids[::-1]


def test_a_client_that_goes_away_mid_upload_leaves_no_partial_file(files_server: Deployment) -> None:
    import socket
    import time

    before = owner_files(files_server)
    port = int(files_server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = (
            f"POST /files HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {BOB}\r\n"
            "Content-Type: application/jsonl\r\nContent-Length: 1000000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"text": "x"}\n' * 10_000)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(n.endswith(".part") for n in owner_files(files_server)):
            time.sleep(0.05)
        assert any(n.endswith(".part") for n in owner_files(files_server)), "the upload never started"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and owner_files(files_server) != before:
        time.sleep(0.1)
    assert owner_files(files_server) == before
    with files_server.client(BOB) as c:
        assert c.get("/files").status_code == 200


def test_parallel_uploads_never_hold_more_than_the_quota_in_part_files(files_server: Deployment) -> None:
    """Issue 28, finding 5: ten parallel uploads, each within the size cap, together three times the
    quota, sent chunked (no Content-Length to check first) and slowly, so they are all in flight at once.
    Polled from outside, the owner's `.part` files never hold more than the quota; what is stored fits
    in it, the rest are 429s naming it, and no `.part` file is left."""
    import hashlib
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    size = int(QUOTA_BYTES * 0.3)
    folder = files_server.data_dir / "files" / hashlib.sha256(b"dave").hexdigest()[:32]
    peak, stop = [0], threading.Event()

    def scan() -> dict[str, int]:
        sizes = {}
        for p in folder.glob(".*.part") if folder.exists() else []:
            try:
                sizes[p.name] = p.stat().st_size
            except FileNotFoundError:
                continue
        return sizes

    def poll() -> None:
        # A scan stats one file after another: on a loaded machine an upload can finish (its room freed)
        # and another reserve that room between two stats, and the sum would count both. Only a state
        # that two scans in a row see alike is counted (a reservation is held for as long as its upload
        # writes, many scans).
        last = scan()
        while not stop.is_set():
            now = scan()
            if now == last:
                peak[0] = max(peak[0], sum(now.values()))
            last = now
            time.sleep(0.005)

    def slowly() -> Iterator[bytes]:
        for piece in _chunks(size, 64 * 1024):
            time.sleep(0.02)
            yield piece

    def one(_: int) -> httpx.Response:
        with files_server.client(DAVE) as c:
            return c.post("/files", content=slowly(), headers={"Content-Type": "application/jsonl"})

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(one, range(10)))
    finally:
        stop.set()
        watcher.join()
    codes = sorted(r.status_code for r in answers)
    assert set(codes) == {201, 429} and codes.count(201) <= QUOTA_BYTES // size, codes
    assert all("FTQ_FILE_QUOTA_BYTES" in r.json()["detail"] for r in answers if r.status_code == 429)
    assert 0 < peak[0] <= QUOTA_BYTES, f"the .part files held {peak[0]} bytes at the peak"
    assert not any(n.endswith(".part") for n in owner_files(files_server))
