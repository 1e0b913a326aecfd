"""service/files/upload.py `declared_length` and `receive_request`, which both upload routes (`/files` and
`/v1/files`, `/v1/uploads/{id}/parts`) take a body through: the length refused before a byte is read, and
a body that is too slow, too large or cut short answered as such with nothing kept."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.requests import Request

from service.errors import BadRequest, PayloadTooLarge, RequestTimeout
from service.files import upload

Message = dict[str, Any]


def request(
    chunks: list[bytes | None],
    *,
    content_type: str = "application/jsonl",
    length: int | None = None,
    ends: bool = False,
) -> Request:
    """A POST whose body arrives as `chunks`, the last one saying so where `ends`, else the body hangs
    after it (a client that stopped sending); None is the client going away."""
    headers = [(b"content-type", content_type.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    pending = list(chunks)

    async def receive() -> Message:
        if not pending:
            await anyio.sleep_forever()
        chunk = pending.pop(0)
        if chunk is None:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunk, "more_body": bool(pending) or not ends}

    scope = {"type": "http", "method": "POST", "path": "/files", "headers": headers, "query_string": b""}
    return Request(scope, receive)


async def no_quota(_: int) -> None:
    return None


def receive(
    req: Request, path: Path, max_bytes: int, deadline: float
) -> Callable[[], Awaitable[upload.Received]]:
    limits = upload.Limits(max_bytes, no_quota, declared=upload.declared_length(req, max_bytes))
    return lambda: upload.receive_request(req, path, limits, deadline=deadline)


@pytest.mark.timeout(30)  # without the deadline the body would hang for ever
def test_a_body_slower_than_the_deadline_is_a_408_with_nothing_kept(tmp_path: Path) -> None:
    part = tmp_path / "a.part"
    with pytest.raises(RequestTimeout) as err:
        anyio.run(receive(request([b'{"text": "a"}\n']), part, 1000, deadline=0.3))
    assert err.value.status_code == 408 and "FTQ_UPLOAD_DEADLINE_SECONDS" in str(err.value)
    assert not part.exists()


def test_a_body_over_the_cap_midway_is_a_413_that_closes_the_connection(tmp_path: Path) -> None:
    # Chunked: no length to refuse it by before it streams.
    part = tmp_path / "a.part"
    with pytest.raises(PayloadTooLarge) as err:
        anyio.run(receive(request([b'{"text": "aaaa"}\n'] * 20), part, 100, deadline=10))
    assert err.value.headers.get("Connection") == "close"
    assert not part.exists()


def test_a_client_gone_midway_is_a_400_with_nothing_kept(tmp_path: Path) -> None:
    part = tmp_path / "a.part"
    with pytest.raises(BadRequest, match="cut short"):
        anyio.run(receive(request([b'{"text": "a"}\n', None]), part, 1000, deadline=10))
    assert not part.exists()


def test_a_declared_length_over_the_cap_is_refused_before_a_byte_is_read() -> None:
    assert upload.declared_length(request([], length=100), 100) == 100
    assert upload.declared_length(request([]), 100) is None  # chunked: checked as it streams
    with pytest.raises(PayloadTooLarge):
        upload.declared_length(request([], length=101), 100)
    # A multipart body carries its framing besides the file.
    multipart = "multipart/form-data; boundary=x"
    assert upload.declared_length(request([], content_type=multipart, length=101), 100) == 101
    with pytest.raises(PayloadTooLarge):
        upload.declared_length(
            request([], content_type=multipart, length=100 + upload.MULTIPART_SLACK + 1), 100
        )


def test_a_whole_body_is_written_and_hashed(tmp_path: Path) -> None:
    import hashlib

    body = b'{"text": "a"}\n{"text": "b"}\n'
    part = tmp_path / "a.part"
    req = request([body[:10], body[10:]], length=len(body), ends=True)
    got = anyio.run(receive(req, part, 1000, deadline=10))
    assert got.size == len(body) and got.sha256 == hashlib.sha256(body).hexdigest()
    assert part.read_bytes() == body


def test_a_deadline_while_the_file_is_created_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file is created in a worker thread, and the deadline passes while it runs. The wait for that
    # thread is not abandoned (anyio's default), so the cancel lands where the partial file is removed.
    import time

    class SlowSink(upload._Sink):
        def __init__(self, path: Path):
            time.sleep(0.3)
            super().__init__(path)

    monkeypatch.setattr(upload, "_Sink", SlowSink)
    part = tmp_path / "a.part"
    with pytest.raises(RequestTimeout):
        anyio.run(receive(request([b'{"text": "a"}\n']), part, 1000, deadline=0.05))
    time.sleep(0.5)  # a thread left running would have created it by now
    assert not part.exists()
