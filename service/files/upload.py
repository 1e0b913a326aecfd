"""Receiving an upload in bounded memory: the body is read as a stream, written to a file the server
names as it arrives (hashed on the way), and stopped the moment it passes the size cap or the owner's
quota, with the partial file removed.

Uploads in flight count against the quota: before any bytes are written, the room for them is reserved
under the owner's quota lock (`Limits.room_for`: the declared length at once, then a step at a time
while a chunked body streams), so ten parallel uploads never hold more than the quota between them.

Two bodies are taken: `multipart/form-data` (the file in field `file`; other fields are read past), parsed
incrementally by python-multipart's push parser, and a raw JSON Lines body (`application/jsonl`).
Writes leave the event loop in batches of about a megabyte.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from ftq.runtime import files
from service.errors import BadRequest, FtqError, PayloadTooLarge, RequestTimeout, SpecError, TooManyRequests

RAW_TYPES = ("application/jsonl", "application/x-ndjson", "application/jsonlines", "application/json-lines")
# Bytes gathered before one write in a worker thread.
_BATCH = 1024 * 1024
# Room reserved beyond the bytes received when an upload needs more (a chunked body).
RESERVE_STEP = 1024 * 1024
# Multipart framing (boundaries, part headers) a body may carry beyond the file's own bytes.
MULTIPART_SLACK = 64 * 1024


class Limits:
    """The size cap, checked as bytes arrive (`check`), and the room reserved in the owner's quota for
    them (`room_for`, through `reserve(bytes)`, which raises TooManyRequests when it does not fit)."""

    def __init__(
        self,
        max_bytes: int,
        reserve: Callable[[int], Awaitable[None]],
        *,
        declared: int | None = None,
        too_large: str | None = None,
    ):
        self.max_bytes = max_bytes
        self._reserve = reserve
        self.declared = declared
        self.reserved = 0
        # What a 413 says when `max_bytes` is another cap than FTQ_MAX_FILE_BYTES (an upload part's room).
        self.too_large = too_large

    def check(self, total: int) -> None:
        if total > self.max_bytes:
            raise PayloadTooLarge(
                self.too_large
                or f"the file is over the {self.max_bytes} bytes a file may have (FTQ_MAX_FILE_BYTES); "
                "split it, or ask the operator"
            )

    async def room_for(self, total: int) -> None:
        """Make sure `total` bytes are reserved, reserving a step more than needed at a time (or exactly
        what is needed where a step more does not fit)."""
        self.check(total)
        if total <= self.reserved:
            return
        want = min(self.max_bytes, total + RESERVE_STEP)
        try:
            await self._reserve(want)
        except TooManyRequests:
            if want == total:
                raise
            want = total
            await self._reserve(want)
        self.reserved = want


class _Sink:
    """The file being written: owner-only, created new, hashed as written."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        # Held while this process lives: a `.part` file without it is a dead upload's, which reserves
        # nothing in the owner's quota and is swept.
        files.lock_part(self.fd)
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.hash.update(chunk)
            view = memoryview(chunk)
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
            self.size += len(chunk)

    def finish(self) -> None:
        """The file as long as what was written (it was as long as the room reserved), on disk."""
        os.ftruncate(self.fd, self.size)
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Received:
    def __init__(self, size: int, sha256: str, filename: str | None, fields: dict[str, str] | None = None):
        self.size = size
        self.sha256 = sha256
        self.filename = filename
        # The form's other small fields (`purpose` of an OpenAI upload), by name.
        self.fields = fields or {}


def _boundary(content_type: str) -> bytes:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.strip().lower() == "boundary" and value.strip():
            return value.strip().strip('"').encode("latin-1")
    raise BadRequest("multipart/form-data without a boundary")


def _disposition(value: bytes) -> dict[str, str]:
    """The parameters of a Content-Disposition header (`form-data; name="file"; filename="a.jsonl"`)."""
    from python_multipart.multipart import parse_options_header

    _, params = parse_options_header(value)
    return {k.decode("latin-1").lower(): v.decode("utf-8", "replace") for k, v in params.items()}


async def receive(
    stream: AsyncIterator[bytes], content_type: str, path: Path, limits: Limits, *, field: str = "file"
) -> Received:
    """Write the upload's file bytes to `path` (new); on any failure the partial file is removed. A
    multipart body's file is its field `field`; its other fields up to 1 KiB each are kept as text."""
    ctype = content_type.split(";")[0].strip().lower()
    sink = await anyio.to_thread.run_sync(_Sink, path)
    try:
        fields: dict[str, str] = {}
        if limits.declared:
            # Said up front: all of it reserved before a byte is read (or refused at once).
            await limits.room_for(min(limits.declared, limits.max_bytes))
        if ctype == "multipart/form-data":
            filename = await _receive_multipart(stream, _boundary(content_type), sink, limits, field, fields)
        else:
            filename = None
            await _receive_raw(stream, sink, limits)
        await anyio.to_thread.run_sync(sink.finish)
        return Received(sink.size, sink.hash.hexdigest(), filename, fields)
    except BaseException:
        sink.close()
        path.unlink(missing_ok=True)
        raise
    finally:
        sink.close()


def declared_length(request: Request, max_bytes: int, too_large: str | None = None) -> int | None:
    """The body's Content-Length, if it says one; refused before a byte is read when the file in it would
    be over `max_bytes` (with `too_large` as the message, where the cap is not FTQ_MAX_FILE_BYTES)."""
    declared = request.headers.get("content-length", "")
    if not declared.isdigit():
        return None
    multipart = request.headers.get("content-type", "").split(";")[0].strip().lower() == "multipart/form-data"
    if int(declared) > max_bytes + (MULTIPART_SLACK if multipart else 0):
        raise PayloadTooLarge(
            too_large or f"the file is over the {max_bytes} bytes a file may have (FTQ_MAX_FILE_BYTES)"
        )
    return int(declared)


async def receive_request(
    request: Request, path: Path, limits: Limits, *, deadline: float, field: str = "file"
) -> Received:
    """`receive` of a request's body, under one deadline for all of it: a client cannot hold its
    reservation (and a connection) as long as it likes by sending slowly. A refusal of its size or of the
    owner's quota closes the connection (the client is told at once, the rest is not read); a body slower
    than the deadline is a 408 and one cut short a 400, with nothing kept either way."""
    try:
        with anyio.fail_after(deadline):
            content_type = request.headers.get("content-type", "")
            return await receive(request.stream(), content_type, path, limits, field=field)
    except (PayloadTooLarge, TooManyRequests) as exc:
        exc.headers = {**exc.headers, "Connection": "close"}
        raise
    except TimeoutError:
        raise RequestTimeout(
            f"the upload took longer than the {deadline:g} s an upload may take "
            "(FTQ_UPLOAD_DEADLINE_SECONDS); nothing was kept"
        ) from None
    except ClientDisconnect:
        raise BadRequest("the upload was cut short") from None


async def _flush(sink: _Sink, pending: list[bytes], limits: Limits) -> None:
    if pending:
        await limits.room_for(sink.size + sum(len(p) for p in pending))
        batch = pending.copy()
        pending.clear()
        await anyio.to_thread.run_sync(sink.write, batch)


async def _receive_raw(stream: AsyncIterator[bytes], sink: _Sink, limits: Limits) -> None:
    total, pending, held = 0, [], 0
    async for chunk in stream:
        if not chunk:
            continue
        total += len(chunk)
        limits.check(total)
        pending.append(chunk)
        held += len(chunk)
        if held >= _BATCH:
            await _flush(sink, pending, limits)
            held = 0
    await _flush(sink, pending, limits)


_SMALL_FIELD = 1024
_SMALL_FIELDS = 16


async def _receive_multipart(
    stream: AsyncIterator[bytes],
    boundary: bytes,
    sink: _Sink,
    limits: Limits,
    field: str = "file",
    fields: dict[str, str] | None = None,
) -> str | None:
    from python_multipart.multipart import MultipartParser

    state: dict[str, Any] = {"headers": {}, "field": b"", "value": b"", "in_file": False, "found": False}
    pending: list[bytes] = []
    total = 0
    problem: list[FtqError] = []

    small: dict[str, bytearray] = {}

    def on_part_begin() -> None:
        state["headers"] = {}
        state["in_file"] = False
        state["small"] = None

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        if len(state["headers"]) < 16 and len(state["value"]) < 4096:
            state["headers"][state["field"].decode("latin-1").lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_headers_finished() -> None:
        params = _disposition(state["headers"].get("content-disposition", b""))
        name = params.get("name")
        if name == field and not state["found"]:
            state["in_file"] = True
            state["found"] = True
            state["filename"] = params.get("filename")
        elif name and "filename" not in params and len(small) < _SMALL_FIELDS:
            state["small"] = small.setdefault(name, bytearray())

    def on_part_data(data: bytes, start: int, end: int) -> None:
        nonlocal total
        if state.get("small") is not None and len(state["small"]) < _SMALL_FIELD:
            state["small"].extend(data[start:end][: _SMALL_FIELD - len(state["small"])])
        if not state["in_file"] or problem:
            return
        total += end - start
        try:
            limits.check(total)
        except FtqError as exc:
            problem.append(exc)
            return
        pending.append(bytes(data[start:end]))

    def on_part_end() -> None:
        state["in_file"] = False
        state["small"] = None

    callbacks: dict[str, Callable[..., None]] = {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    }
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    held = 0
    async for chunk in stream:
        if not chunk:
            continue
        try:
            parser.write(chunk)
        except Exception as exc:  # python-multipart's MultipartParseError and friends
            raise BadRequest(f"the multipart body does not parse: {exc}") from None
        if problem:
            raise problem[0]
        held = sum(len(p) for p in pending)
        if held >= _BATCH:
            await _flush(sink, pending, limits)
    try:
        parser.finalize()
    except Exception as exc:
        raise BadRequest(f"the multipart body does not parse: {exc}") from None
    await _flush(sink, pending, limits)
    if not state["found"]:
        raise SpecError(
            [{"loc": ["body", field], "msg": f"the multipart body has no field `{field}`", "type": "missing"}]
        )
    if fields is not None:
        fields.update({k: v.decode("utf-8", "replace") for k, v in small.items()})
    return state.get("filename")
