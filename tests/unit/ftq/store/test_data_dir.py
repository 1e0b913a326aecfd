"""Issue 18, item 2: the data dir, runs/ and the SQLite store are the service's user's alone."""

from __future__ import annotations

import stat
from pathlib import Path

from ftq.runtime.settings import Settings
from ftq.store.db import ensure_data_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_data_dir_and_store_are_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ensure_data_dir(Settings(data_dir=data))
    assert (_mode(data), _mode(data / "runs"), _mode(data / "ftq.db")) == (0o700, 0o700, 0o600)


def test_an_older_world_readable_one_is_taken_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "runs").mkdir(parents=True)
    for path in (data, data / "runs"):
        path.chmod(0o755)
    for name in ("ftq.db", "ftq.db-wal", "ftq.db-shm"):
        (data / name).write_bytes(b"")
        (data / name).chmod(0o644)
    ensure_data_dir(Settings(data_dir=data))
    # Search stays (a worker with run users may share this dir with this process); nothing is listable.
    assert (_mode(data), _mode(data / "runs")) == (0o711, 0o711)
    assert {_mode(data / n) for n in ("ftq.db", "ftq.db-wal", "ftq.db-shm")} == {0o600}


def test_with_run_users_a_run_may_reach_its_directory_but_list_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ensure_data_dir(Settings(data_dir=data, run_as_user="ftq-run"))
    assert (_mode(data), _mode(data / "runs"), _mode(data / "ftq.db")) == (0o711, 0o711, 0o600)
