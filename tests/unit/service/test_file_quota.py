"""An owner's file quota when uploads finish together: the check of what is in use and the new file's
row are one step under the owner's quota lock, so room for one upload is not taken by two. Runs on
SQLite here and on PostgreSQL in tests/integration/store/test_file_quota_on_postgres.py."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftq.runtime import files
from ftq.runtime.settings import get_settings
from ftq.store.db import session_scope
from ftq.store.files_repository import FileRepository
from tests.harness.disk import small_tmpfs
from tests.harness.inprocess import migrate, reset_caches, use_settings

OWNER = "ann"


def test_two_uploads_finishing_together_cannot_both_take_the_last_room(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.errors import TooManyRequests
    from service.files import service as file_service

    use_settings(monkeypatch, data_dir=tmp_path / "data", database_url=store_url, file_quota_bytes=1500)
    migrate()
    settings = get_settings()
    # Each upload reads what is in use, then takes its time: without the lock both read 0 and both fit.
    read_used = FileRepository.bytes_used

    def slow_read(self: FileRepository) -> int:
        used = read_used(self)
        time.sleep(0.5)
        return used

    monkeypatch.setattr(FileRepository, "bytes_used", slow_read)
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def upload() -> None:
        file_id = files.new_file_id()
        part = file_service.new_upload_path(settings, OWNER, file_id)
        part.write_bytes(b"x" * 1000)
        start.wait()
        try:
            with session_scope() as session:
                file_service.record(
                    session,
                    FileRepository(session, OWNER),
                    settings,
                    file_id=file_id,
                    part=part,
                    filename="a.jsonl",
                    size=1000,
                    sha256="0" * 64,
                )
            outcomes.append("stored")
        except TooManyRequests:
            outcomes.append("refused")
        except Exception as err:  # said in the assertion, not lost with the thread
            outcomes.append(repr(err))

    threads = [threading.Thread(target=upload) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)  # a loaded machine: SQLite's lock wait, not a hang
    assert sorted(outcomes) == ["refused", "stored"]
    with session_scope() as session:
        assert read_used(FileRepository(session, OWNER)) == 1000
    # The refused upload's bytes are gone too: one file in the owner's folder, no partial left.
    assert len(list(files.owner_dir(settings.data_path, OWNER).iterdir())) == 1
    reset_caches()


@pytest.fixture
def tiny_disk(ftq_env: dict[str, str]) -> Iterator[Path]:
    """The test's data dir on a 2 MiB tmpfs of its own (the test runs as root), unmounted at the end."""
    with small_tmpfs(Path(ftq_env["FTQ_DATA_DIR"]), "2m") as data:
        yield data


def test_a_full_disk_is_a_507_for_uploads_and_a_refusal_in_sensible_units(
    tiny_disk: Path, make_client: Any, store_url: str, tiny_job: dict[str, Any]
) -> None:
    """Issue 28, finding 9: POST /files on a full disk was a 500 (ENOSPC); the disk refusal of a job read
    "need about 0.0 GiB but 0.0 GiB is free"."""
    client = make_client(store_url, api_tokens="tok:ann")
    auth = {"Authorization": "Bearer tok", "Content-Type": "application/jsonl"}
    row = b'{"text": "' + b"x" * 200 + b'"}\n'
    r = client.post("/files", content=row * 15_000, headers=auth)  # 3 MiB on a 2 MiB disk
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "insufficient_storage" and "no room" in r.json()["detail"]
    assert not list(tiny_disk.rglob("*.part")), "the partial upload is removed"
    assert client.post("/files", content=row * 10, headers=auth).status_code == 201  # room again

    # A job whose checkpoints need more than is left: the sizes in KiB/MiB, not "0.0 GiB".
    free = shutil.disk_usage(tiny_disk).free
    (tiny_disk / "filler").write_bytes(b"\0" * (free - 64 * 1024))
    r = client.post("/jobs", json=tiny_job, headers={"Authorization": "Bearer tok"})
    assert r.status_code == 422, r.text
    [msg] = [e["msg"] for e in r.json()["detail"] if e["loc"] == ["body", "training", "save_steps"]]
    assert "0.0 GiB" not in msg and "KiB is free" in msg, msg


def test_a_full_disk_under_the_sqlite_store_is_a_507(
    tiny_disk: Path, make_client: Any, tiny_job: dict[str, Any]
) -> None:
    """`make up`'s store is a SQLite file in the data dir: with the disk full, a submit that cannot write
    it is a 507 saying so, not a 500 nor a 503 "store unavailable"."""
    # The store in the data dir, on the 2 MiB tmpfs; the operator lets a job skip the disk check.
    client = make_client(api_tokens="tok:ann", allow_oversubscribe="true")
    auth = {"Authorization": "Bearer tok"}
    assert client.get("/jobs", headers=auth).status_code == 200
    with (tiny_disk / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    r = client.post("/jobs", json={**tiny_job, "allow_oversubscribe": True}, headers=auth)
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "insufficient_storage"
