"""The embedded broker under a concurrent producer: every message arrives whole, none stops the consumer.

kombu's own filesystem transport creates a message file and then writes it; a consumer that lists the
folder in between takes the empty file and the Celery worker dies on a JSONDecodeError. ftq's transport
(ftq/runtime/fsbroker.py) renames whole files into place.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from kombu import Connection

from ftq.runtime.fsbroker import Transport

MESSAGES = 1000


def _connection(folder: Path) -> Connection:
    return Connection(
        transport=Transport,
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "processed_folder": str(folder.parent / "processed"),
            "store_processed": False,
        },
    )


def test_concurrent_puts_are_never_read_half_written(tmp_path: Path) -> None:
    folder = tmp_path / "queue"
    folder.mkdir()
    (tmp_path / "processed").mkdir()
    # A big body widens the window between creating a file and finishing it.
    body = {"pad": "x" * 20_000}

    def produce() -> None:
        with _connection(folder) as conn:
            channel = conn.default_channel
            for i in range(MESSAGES):
                channel._put("q", {**body, "i": i})

    producer = threading.Thread(target=produce)
    producer.start()
    seen: list[int] = []
    with _connection(folder) as conn:
        channel = conn.default_channel
        while producer.is_alive() or len(seen) < MESSAGES:
            try:
                seen.append(channel._get("q")["i"])
            except queue.Empty:
                if not producer.is_alive() and len(seen) < MESSAGES and not any(folder.glob("*.msg")):
                    break
    producer.join()
    assert sorted(seen) == list(range(MESSAGES))


def test_an_unreadable_file_is_dropped_not_fatal(tmp_path: Path) -> None:
    folder = tmp_path / "queue"
    folder.mkdir()
    (tmp_path / "processed").mkdir()
    # What a producer killed mid-write under kombu's scheme leaves behind: an empty message file, named
    # to be taken before any message put now (names start with a zero-padded clock).
    (folder / f"{0:016d}_dead.q.msg").write_bytes(b"")
    with _connection(folder) as conn:
        channel = conn.default_channel
        channel._put("q", {"i": 7})
        assert channel._get("q") == {"i": 7}
    assert not list(folder.glob("*.msg"))
