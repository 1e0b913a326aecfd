"""The artifact service's rules without a server: ranges, validators, masked reads of train.log, the tar
stream (byte for byte what tarfile reads back) and the sha256 cache (computed once, big files off the
request)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ftq.contract import runs
from ftq.runtime import redact
from ftq.runtime.settings import Settings, get_settings
from service.artifacts import hashes
from service.artifacts import service as artifacts


@pytest.mark.parametrize(
    ("header", "size", "want"),
    [
        (None, 10, None),
        ("bytes=0-4", 10, (0, 4)),
        ("bytes=5-", 10, (5, 9)),
        ("bytes=-3", 10, (7, 9)),
        ("bytes=-30", 10, (0, 9)),
        ("bytes=2-100", 10, (2, 9)),
        (" bytes = 1-2 ", 10, (1, 2)),
        ("bytes=0-1,4-5", 10, None),
        ("bytes=4-2", 10, None),
        ("items=0-1", 10, None),
        ("bytes=a-b", 10, None),
        ("bytes=-", 10, None),
        ("bytes=5", 10, None),
        ("bytes=\u0661-\u0662", 10, None),  # non-ASCII digits
    ],
)
def test_parse_range(header: str | None, size: int, want: tuple[int, int] | None) -> None:
    assert artifacts.parse_range(header, size) == want


@pytest.mark.parametrize(
    ("header", "size"), [("bytes=10-", 10), ("bytes=10-20", 10), ("bytes=-0", 10), ("bytes=0-", 0)]
)
def test_unsatisfiable_ranges(header: str, size: int) -> None:
    with pytest.raises(artifacts.Unsatisfiable):
        artifacts.parse_range(header, size)


def test_validators() -> None:
    tag = '"1-2-3"'
    assert artifacts.etag_matches(tag, tag)
    assert artifacts.etag_matches(f'"x", W/{tag}', tag)
    assert artifacts.etag_matches("*", tag)
    assert not artifacts.etag_matches('"1-2-4"', tag) and not artifacts.etag_matches(None, tag)
    date = "Tue, 01 Dec 2026 10:00:00 GMT"
    assert artifacts.if_range_holds(None, tag, date)
    assert artifacts.if_range_holds(tag, tag, date) and artifacts.if_range_holds(date, tag, date)
    assert not artifacts.if_range_holds(f"W/{tag}", tag, date)  # If-Range compares strongly
    assert not artifacts.if_range_holds('"old"', tag, date)


SECRET = "hf_abcdefghijklmnop"


def test_masked_reads_keep_the_size_and_mask_every_cut(tmp_path: Path) -> None:
    text = f"start {SECRET} middle {SECRET}{SECRET} end {SECRET}".encode()
    path = tmp_path / "train.log"
    path.write_bytes(text)
    want = text.replace(SECRET.encode(), b"*" * len(SECRET))
    read = redact.masked_reader([SECRET, ""])
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read(fd, 0, len(text)) == want
        for start in range(len(text)):
            for length in (1, 3, 7, 40):
                got = read(fd, start, length)
                assert got == want[start : start + length], (start, length)
    finally:
        os.close(fd)
    assert redact.masked_reader([]) is redact.plain_read


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


def _job(settings: Settings, job_id: str = "job_0000000000000001") -> Any:
    run = runs.run_dir(settings.runs_dir, job_id)
    run.mkdir(parents=True)
    return SimpleNamespace(id=job_id), run


def test_the_tar_stream_is_what_tarfile_reads(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    job, run = _job(settings)
    files = {
        "final/adapter_model.safetensors": os.urandom(3000),
        "final/empty.txt": b"",
        "final/exact.bin": b"a" * 1024,
        "final/sub/ünïcode name with spaces and a rather long name " + "x" * 120 + ".json": b"{}",
    }
    for path, data in files.items():
        (run / path).parent.mkdir(parents=True, exist_ok=True)
        (run / path).write_bytes(data)
    plan = artifacts.plan_tar(job, "final", settings)
    assert plan is not None and plan.name == "final.tar"

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in artifacts.tar_chunks(job.id, plan, settings)])

    body = asyncio.run(collect())
    assert len(body) == plan.size
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == files
    assert artifacts.plan_tar(job, "spec", settings) is None
    assert artifacts.plan_tar(job, "final/adapter_model.safetensors", settings) is None
    assert artifacts.tar_folder_of("final.tar") == "final" and artifacts.tar_folder_of(".tar") is None


def test_a_file_that_shrinks_ends_the_tar_short(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    job, run = _job(settings)
    (run / "final").mkdir()
    (run / "final" / "a.bin").write_bytes(b"x" * 5000)
    plan = artifacts.plan_tar(job, "final", settings)
    assert plan is not None
    (run / "final" / "a.bin").write_bytes(b"x" * 10)

    async def collect() -> None:
        async for _ in artifacts.tar_chunks(job.id, plan, settings):
            pass

    with pytest.raises(OSError, match="shrank"):
        asyncio.run(collect())


def test_sha256_is_computed_once_and_big_files_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    job, run = _job(settings)
    (run / "final").mkdir()
    small = os.urandom(1000)
    big = os.urandom(5000)
    (run / "final" / "small.bin").write_bytes(small)
    (run / "final" / "big.bin").write_bytes(big)
    monkeypatch.setattr(hashes, "INLINE_BUDGET", 2000)
    opened: list[str] = []
    real_open = runs.open_artifact
    gate = threading.Event()

    def counting_open(run_dir: Path, path: str) -> Any:
        opened.append(path)
        if path.endswith("big.bin"):
            assert gate.wait(10)  # the big file's hash waits: the list must answer meanwhile
        return real_open(run_dir, path)

    monkeypatch.setattr(runs, "open_artifact", counting_open)
    cache = hashes.HashCache(tmp_path / "cache", artifacts.reader_for)
    files = runs.list_artifacts(run)
    first = cache.lookup(job.id, run, files)
    assert first == {"final/small.bin": hashlib.sha256(small).hexdigest(), "final/big.bin": None}
    assert cache.lookup(job.id, run, files)["final/big.bin"] is None  # still pending, not queued twice
    gate.set()
    deadline = time.monotonic() + 10
    while cache.pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    done = cache.lookup(job.id, run, files)
    assert done["final/big.bin"] == hashlib.sha256(big).hexdigest()
    assert opened.count("final/big.bin") == 1 and opened.count("final/small.bin") == 1
    # A new version of a file is hashed again; the others are not.
    (run / "final" / "small.bin").write_bytes(b"changed")
    again = cache.lookup(job.id, run, runs.list_artifacts(run))
    assert again["final/small.bin"] == hashlib.sha256(b"changed").hexdigest()
    assert opened.count("final/small.bin") == 2 and opened.count("final/big.bin") == 1
    # Another process (a restarted API) reads the cache file instead of hashing.
    other = hashes.HashCache(tmp_path / "cache", artifacts.reader_for)
    assert other.lookup(job.id, run, runs.list_artifacts(run)) == again
    assert opened.count("final/big.bin") == 1


def test_every_log_served_is_masked_and_downloads_answer_head(
    make_client: Any, store_url: str, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, findings 8 and 11, through the API in process: a secret in any log of the run (train.log,
    an export's train.log, a log inside a folder tar) is served masked, and HEAD answers what GET would
    (status and headers, no body) for an artifact, a folder's tar and an uploaded file's content."""
    monkeypatch.setenv("FTQ_TEST_SECRET", SECRET)
    hub = "hf_operators_push_token_0123456789"  # in an export's environment when it pushes
    client = make_client(store_url, api_tokens="tok:alice", pass_env="FTQ_TEST_SECRET", hub_token=hub)
    auth = {"Authorization": "Bearer tok"}
    job_id = client.post("/jobs", json=tiny_job, headers=auth).json()["id"]
    run = runs.run_dir(get_settings().runs_dir, job_id)
    export = run / "exports" / "exp_0000000000000001"
    export.mkdir(parents=True)
    line = f"token={SECRET} done\n".encode()
    masked = line.replace(SECRET.encode(), b"*" * len(SECRET))
    (run / "train.log").write_bytes(line)
    (export / "train.log").write_bytes(line)
    (export / "push.log").write_bytes(f"pushing with {hub}\n".encode())
    (export / "adapter_model.safetensors").write_bytes(b"\0" * 100)
    base = f"/jobs/{job_id}/artifacts"
    for path in ("train.log", "exports/exp_0000000000000001/train.log"):
        got = client.get(f"{base}/{path}", headers=auth)
        assert got.status_code == 200 and got.content == masked, (path, got.content)
    pushed = client.get(f"{base}/exports/exp_0000000000000001/push.log", headers=auth)
    assert pushed.status_code == 200 and hub.encode() not in pushed.content, pushed.content
    tar = client.get(f"{base}/exports/exp_0000000000000001.tar", headers=auth)
    assert tar.status_code == 200 and SECRET.encode() not in tar.content and hub.encode() not in tar.content
    with tarfile.open(fileobj=io.BytesIO(tar.content)) as opened:
        log = opened.extractfile("exp_0000000000000001/train.log")
        assert log is not None and log.read() == masked

    # HEAD: GET's status and headers, no body (a 405 before).
    for path, gets in (
        ("exports/exp_0000000000000001/train.log", got),
        ("exports/exp_0000000000000001.tar", tar),
    ):
        head = client.head(f"{base}/{path}", headers=auth)
        assert head.status_code == 200, (path, head.status_code)
        assert head.content == b""
        for name in ("content-length", "content-type", "content-disposition"):
            assert head.headers[name] == gets.headers[name], (path, name)
    ranged = client.head(f"{base}/train.log", headers={**auth, "Range": "bytes=0-3"})
    assert ranged.status_code == 206 and ranged.headers["content-range"] == f"bytes 0-3/{len(line)}"
    assert client.head(f"{base}/nothing.bin", headers=auth).status_code == 404
    upload = client.post(
        "/files", content=b'{"text": "hello"}\n', headers={**auth, "Content-Type": "application/jsonl"}
    )
    assert upload.status_code == 201, upload.text
    content = f"/files/{upload.json()['id']}/content"
    head = client.head(content, headers=auth)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(b'{"text": "hello"}\n'))
