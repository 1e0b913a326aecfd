"""`client.files`: the /files routes (uploaded dataset files) for the blocking client."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from ftq.client.errors import WaitTimeout
from ftq.schemas import FileList, FilePublic

if TYPE_CHECKING:
    from ftq.client._async import AsyncClient
    from ftq.client._sync import Client

# What one read of the local file sends: the file is streamed, never read whole.
UPLOAD_CHUNK = 1024 * 1024

Progress = Callable[[int, int], None]


def file_path(file_id: str, *rest: str) -> str:
    if not file_id:
        raise ValueError("file_id is empty")
    return "/".join(["/files", quote(file_id, safe=""), *rest])


def read_chunks(path: Path, progress: Progress | None) -> Iterator[bytes]:
    total = os.stat(path).st_size
    sent = 0
    with open(path, "rb") as f:
        while chunk := f.read(UPLOAD_CHUNK):
            sent += len(chunk)
            yield chunk
            if progress is not None:
                progress(sent, total)


class Files:
    """The /files routes; reached as `client.files`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def upload(
        self, path: str | os.PathLike[str], *, filename: str | None = None, progress: Progress | None = None
    ) -> FilePublic:
        """Upload a JSON Lines file (streamed from disk as the raw body, never read whole). The file
        comes back `validating`; `wait(id)` returns it once `ready` or `invalid`. progress(sent, total)
        is called as bytes go out."""
        local = Path(path)
        size = os.stat(local).st_size
        headers = {"Content-Type": "application/jsonl", "Content-Length": str(size)}
        return self._client._call(
            "POST",
            "/files",
            FilePublic,
            params={"filename": filename or local.name},
            content=read_chunks(local, progress),
            headers=headers,
        )

    def list_page(self, *, limit: int = 50, cursor: str | None = None) -> FileList:
        return self._client._call("GET", "/files", FileList, params={"limit": limit, "cursor": cursor})

    def list(self, *, limit: int = 50) -> Iterator[FilePublic]:
        """Every file of yours, newest first."""
        cursor: str | None = None
        while True:
            page = self.list_page(limit=limit, cursor=cursor)
            yield from page.data
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def get(self, file_id: str) -> FilePublic:
        return self._client._call("GET", file_path(file_id), FilePublic)

    def content(self, file_id: str) -> bytes:
        """The file's bytes (for a large file, `download` writes them to disk as they come)."""
        return self._client._send("GET", file_path(file_id, "content")).content

    def download(self, file_id: str, dest: str | os.PathLike[str]) -> Path:
        out = Path(dest)
        with self._client._stream_get(file_path(file_id, "content")) as resp, open(out, "wb") as f:
            for chunk in resp.iter_bytes(UPLOAD_CHUNK):
                f.write(chunk)
        return out

    def delete(self, file_id: str) -> None:
        """Delete the file and its bytes; a Conflict (409) while a queued or running job uses it."""
        self._client._send("DELETE", file_path(file_id))

    def wait(self, file_id: str, *, timeout: float | None = None, poll: float = 0.5) -> FilePublic:
        """The file once validated (`ready` or `invalid`); WaitTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self.get(file_id)
            if found.status != "validating":
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(found, timeout or 0.0)  # type: ignore[arg-type]
            time.sleep(poll)


async def _aread_chunks(path: Path, progress: Progress | None) -> AsyncIterator[bytes]:
    import anyio

    total = os.stat(path).st_size
    sent = 0
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(UPLOAD_CHUNK):
            sent += len(chunk)
            yield chunk
            if progress is not None:
                progress(sent, total)


class AsyncFiles:
    """The /files routes for `AsyncClient`; reached as `client.files`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def upload(
        self, path: str | os.PathLike[str], *, filename: str | None = None, progress: Progress | None = None
    ) -> FilePublic:
        """As `Files.upload`: the file streamed from disk as the raw body."""
        local = Path(path)
        headers = {"Content-Type": "application/jsonl", "Content-Length": str(os.stat(local).st_size)}
        return await self._client._call(
            "POST",
            "/files",
            FilePublic,
            params={"filename": filename or local.name},
            content=_aread_chunks(local, progress),
            headers=headers,
        )

    async def list_page(self, *, limit: int = 50, cursor: str | None = None) -> FileList:
        return await self._client._call("GET", "/files", FileList, params={"limit": limit, "cursor": cursor})

    async def list(self, *, limit: int = 50) -> AsyncIterator[FilePublic]:
        cursor: str | None = None
        while True:
            page = await self.list_page(limit=limit, cursor=cursor)
            for item in page.data:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def get(self, file_id: str) -> FilePublic:
        return await self._client._call("GET", file_path(file_id), FilePublic)

    async def content(self, file_id: str) -> bytes:
        return (await self._client._send("GET", file_path(file_id, "content"))).content

    async def delete(self, file_id: str) -> None:
        await self._client._send("DELETE", file_path(file_id))

    async def wait(self, file_id: str, *, timeout: float | None = None, poll: float = 0.5) -> FilePublic:
        import anyio

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = await self.get(file_id)
            if found.status != "validating":
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(found, timeout or 0.0)  # type: ignore[arg-type]
            await anyio.sleep(poll)
