"""An owner's file quota when uploads finish together: the check of what is in use and the new file's
row are one step under the owner's quota lock, so room for one upload is not taken by two. Runs on
SQLite here and on PostgreSQL in tests/integration/store/test_file_quota_on_postgres.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ftq.runtime import files
from ftq.runtime.settings import get_settings
from ftq.store.db import session_scope
from ftq.store.files_repository import FileRepository
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

    threads = [threading.Thread(target=upload) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["refused", "stored"]
    with session_scope() as session:
        assert read_used(FileRepository(session, OWNER)) == 1000
    # The refused upload's bytes are gone too: one file in the owner's folder, no partial left.
    assert len(list(files.owner_dir(settings.data_path, OWNER).iterdir())) == 1
    reset_caches()
