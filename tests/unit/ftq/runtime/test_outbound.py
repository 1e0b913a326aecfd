"""ftq.runtime.outbound: one total deadline per outbound request, however slowly the peer answers
(issue 28, finding 2: a receiver that trickles one header byte at a time held a delivery forever)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ftq.runtime import outbound


class Trickler:
    """A TCP server on 127.0.0.1 that answers each connection with a status line, then one byte of a
    header every `every` seconds, never ending the head (or, with `whole`, a complete answer)."""

    def __init__(self, every: float, whole: bytes | None = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.every = every
        self.whole = whole
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if self.whole is not None:
                    conn.sendall(self.whole)
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-A: ")
                while not self.stop.wait(self.every):
                    conn.sendall(b"a")
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    t = Trickler(every=0.3)
    yield t
    t.close()


def test_a_trickling_answer_ends_at_the_deadline(trickler: Trickler) -> None:
    # Each byte comes well within a read timeout; only a deadline on the whole request ends it.
    started = time.monotonic()
    with pytest.raises(outbound.OutboundError, match=r"no answer within 1\.5s"):
        outbound.request("POST", f"http://127.0.0.1:{trickler.port}/", deadline_seconds=1.5, content=b"{}")
    assert time.monotonic() - started < 30  # a generous liveness bound: without the deadline, never


def test_an_answer_within_the_deadline_is_returned() -> None:
    t = Trickler(every=1, whole=b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    try:
        answer = outbound.request("POST", f"http://127.0.0.1:{t.port}/", deadline_seconds=5, content=b"x")
        assert answer.status_code == 204
    finally:
        t.close()


def test_a_closed_port_is_an_outbound_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(outbound.OutboundError):
        outbound.request("GET", f"http://127.0.0.1:{port}/", deadline_seconds=5)
