"""The SQLite engine's connections: WAL mode without losing a connection to another one's write."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sqlalchemy import text

from ftq.store.db import make_engine


def test_a_connection_that_finds_the_store_locked_waits_to_switch_it_to_wal(tmp_path: Path) -> None:
    # A store as migrations leave it (rollback journal), written by another connection when a new one
    # opens: SQLite refuses the switch to WAL at once while the write lock is held, so without a wait
    # the new connection failed with "database is locked" (seen as two uploads finishing together).
    path = tmp_path / "ftq.db"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE t (x INTEGER)")
    setup.close()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO t VALUES (1)")

    engine = make_engine(f"sqlite:///{path}")
    outcome: list[object] = []

    def read() -> None:
        try:
            with engine.connect() as conn:
                outcome.append(conn.execute(text("SELECT count(*) FROM t")).scalar())
        except Exception as err:  # said in the assertion, not lost with the thread
            outcome.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(0.5)
    assert reader.is_alive(), outcome  # waiting for the write lock, not failed
    writer.execute("COMMIT")
    writer.close()
    reader.join(30)
    assert outcome == [1]
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    engine.dispose()
