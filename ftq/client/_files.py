"""`client.files`: the /files routes (uploaded dataset files), for `Client` and `AsyncClient`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Never, Protocol

from ftq.client import _api
from ftq.client._plan import A, Call, Flow, Progress, R, T
from ftq.contract.schemas import FileList, FilePublic


# What `client.files` needs of its client: the transport that runs calls and flows. Typed as protocols,
# so this module needs neither client module (each of which imports it).
class Runs(Protocol):
    def _call(self, call: Call[A]) -> A: ...

    def _run(self, flow: Flow[Never, R]) -> R: ...

    def _iterate(self, flow: Flow[T, None]) -> Iterator[T]: ...


class AsyncRuns(Protocol):
    async def _call(self, call: Call[A]) -> A: ...

    async def _run(self, flow: Flow[Never, R]) -> R: ...

    def _iterate(self, flow: Flow[T, None]) -> AsyncIterator[T]: ...


class Files:
    """The /files routes; reached as `client.files`."""

    def __init__(self, client: Runs) -> None:
        self._client = client

    def upload(
        self, path: str | os.PathLike[str], *, filename: str | None = None, progress: Progress | None = None
    ) -> FilePublic:
        """Upload a JSON Lines file (streamed from disk as the raw body, never read whole). The file
        comes back `validating`; `wait(id)` returns it once `ready` or `invalid`. progress(sent, total)
        is called as bytes go out."""
        return self._client._call(_api.upload(path, filename, progress))

    def list_page(self, *, limit: int = 50, cursor: str | None = None) -> FileList:
        return self._client._call(_api.files_page(limit=limit, cursor=cursor))

    def list(self, *, limit: int = 50) -> Iterator[FilePublic]:
        """Every file of yours, newest first."""
        return self._client._iterate(_api.list_files(limit))

    def get(self, file_id: str) -> FilePublic:
        return self._client._call(_api.get_file(file_id))

    def content(self, file_id: str) -> bytes:
        """The file's bytes (for a large file, `download` writes them to disk as they come)."""
        return self._client._call(_api.file_content(file_id))

    def download(self, file_id: str, dest: str | os.PathLike[str]) -> Path:
        return self._client._run(_api.download_file(file_id, dest))

    def delete(self, file_id: str) -> None:
        """Delete the file and its bytes; a Conflict (409) while a queued or running job uses it."""
        self._client._call(_api.delete_file(file_id))

    def wait(self, file_id: str, *, timeout: float | None = None, poll: float = 0.5) -> FilePublic:
        """The file once validated (`ready` or `invalid`); WaitTimeout after `timeout` seconds."""
        return self._client._run(_api.wait_file(file_id, timeout, poll))


class AsyncFiles:
    """The /files routes for `AsyncClient`; reached as `client.files`."""

    def __init__(self, client: AsyncRuns) -> None:
        self._client = client

    async def upload(
        self, path: str | os.PathLike[str], *, filename: str | None = None, progress: Progress | None = None
    ) -> FilePublic:
        """As `Files.upload`: the file streamed from disk as the raw body."""
        return await self._client._call(_api.upload(path, filename, progress))

    async def list_page(self, *, limit: int = 50, cursor: str | None = None) -> FileList:
        return await self._client._call(_api.files_page(limit=limit, cursor=cursor))

    def list(self, *, limit: int = 50) -> AsyncIterator[FilePublic]:
        return self._client._iterate(_api.list_files(limit))

    async def get(self, file_id: str) -> FilePublic:
        return await self._client._call(_api.get_file(file_id))

    async def content(self, file_id: str) -> bytes:
        return await self._client._call(_api.file_content(file_id))

    async def download(self, file_id: str, dest: str | os.PathLike[str]) -> Path:
        return await self._client._run(_api.download_file(file_id, dest))

    async def delete(self, file_id: str) -> None:
        await self._client._call(_api.delete_file(file_id))

    async def wait(self, file_id: str, *, timeout: float | None = None, poll: float = 0.5) -> FilePublic:
        return await self._client._run(_api.wait_file(file_id, timeout, poll))
