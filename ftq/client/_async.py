"""The asyncio (and trio) client: the same surface as `Client`, with `await` and `async for`."""

from __future__ import annotations

import builtins
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, overload

import anyio
import httpx

from ftq.client import _core
from ftq.client._core import M, SpecInput, StatusFilter
from ftq.client._files import AsyncFiles
from ftq.client.errors import ConnectionLost, Unavailable, WaitTimeout
from ftq.schemas import (
    Artifact,
    ArtifactList,
    Checkpoint,
    CheckpointList,
    EventPage,
    ExportList,
    ExportPublic,
    Health,
    JobList,
    JobPublic,
    LogChunk,
    MetricsPage,
    PlanPublic,
    Point,
    SamplePublic,
    SamplesPage,
    UsagePage,
)


class AsyncClient:
    """A connection to one ftq server for async code; `async with AsyncClient() as c: ...`.

    Arguments as for `Client`; transport is an `httpx.AsyncBaseTransport`.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = _core.DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = _core.resolve_url(url)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=_core.build_headers(token, headers),
            timeout=timeout,
            transport=transport,
        )
        self.jobs = AsyncJobs(self)
        self.files = AsyncFiles(self)

    async def health(self) -> Health:
        """GET /healthz: the API process answers (it does not check the store; see /readyz)."""
        return await self._call("GET", "/healthz", Health)

    async def usage(
        self, *, since: datetime | None = None, until: datetime | None = None, group_by: str = "owner"
    ) -> UsagePage:
        """GET /usage: device-seconds of runs that ended in [since, until), per owner or per owner and day."""
        params: dict[str, Any] = {"group_by": group_by}
        if since is not None:
            params["from"] = since.isoformat()
        if until is not None:
            params["to"] = until.isoformat()
        return await self._call("GET", "/usage", UsagePage, params=params)

    async def close(self) -> None:
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient(url={self.url!r})"

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        content: bytes | AsyncIterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            resp = await self._http.request(method, path, params=query, content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, path) from exc
        if resp.status_code >= 400:
            raise _core.error_from_response(resp)
        return resp

    async def _call(self, method: str, path: str, model: type[M], **kwargs: Any) -> M:
        return _core.parse_model(await self._send(method, path, **kwargs), model, self.url)

    @asynccontextmanager
    async def _stream(
        self, path: str, params: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[httpx.Response]:
        try:
            async with self._http.stream(
                "GET", path, params=dict(params), headers=dict(headers or {"Accept": "text/event-stream"})
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise _core.error_from_response(resp)
                yield resp
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, path) from exc


class AsyncJobs:
    """The /jobs routes; reached as `client.jobs`. See `ftq.client.Jobs` for what each one does."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @overload
    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[False] = False
    ) -> JobPublic: ...

    @overload
    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[True]
    ) -> PlanPublic: ...

    @overload
    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool
    ) -> JobPublic | PlanPublic: ...

    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool = False
    ) -> JobPublic | PlanPublic:
        """Submit a job (JobSpec, dict or file path); with dry_run, only its plan, nothing stored."""
        content, ctype = _core.spec_body(spec)
        headers = {"Content-Type": ctype}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if dry_run:
            params = {"dry_run": "true"}
            return await self._client._call(
                "POST", "/jobs", PlanPublic, params=params, content=content, headers=headers
            )
        return await self._client._call("POST", "/jobs", JobPublic, content=content, headers=headers)

    async def list_page(
        self, status: StatusFilter = None, *, limit: int = 50, cursor: str | None = None
    ) -> JobList:
        params = {"status": _core.status_param(status), "limit": limit, "cursor": cursor}
        return await self._client._call("GET", "/jobs", JobList, params=params)

    async def list(self, status: StatusFilter = None, *, limit: int = 50) -> AsyncIterator[JobPublic]:
        """Every job (of these statuses), newest first: `async for job in client.jobs.list(): ...`."""
        cursor: str | None = None
        while True:
            page = await self.list_page(status, limit=limit, cursor=cursor)
            for job in page.data:
                yield job
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def get(self, job_id: str) -> JobPublic:
        return await self._client._call("GET", _core.job_path(job_id), JobPublic)

    async def cancel(self, job_id: str) -> JobPublic:
        return await self._client._call("POST", _core.job_path(job_id, "cancel"), JobPublic)

    async def plan(self, job_id: str) -> PlanPublic:
        return await self._client._call("GET", _core.job_path(job_id, "plan"), PlanPublic)

    async def checkpoints(self, job_id: str) -> builtins.list[Checkpoint]:
        page = await self._client._call("GET", _core.job_path(job_id, "checkpoints"), CheckpointList)
        return page.data

    # Exports

    async def export(
        self,
        job_id: str,
        kind: str = "merged",
        dtype: str = "bf16",
        *,
        max_shard_size: str | None = None,
        push_to_hub: Mapping[str, Any] | str | None = None,
    ) -> ExportPublic:
        """As `Client.jobs.export`."""
        content, headers = _core.export_body(kind, dtype, max_shard_size, push_to_hub)
        path = _core.export_path(job_id)
        return await self._client._call("POST", path, ExportPublic, content=content, headers=headers)

    async def exports(self, job_id: str) -> builtins.list[ExportPublic]:
        page = await self._client._call("GET", _core.export_path(job_id), ExportList)
        return page.data

    async def get_export(self, job_id: str, export_id: str) -> ExportPublic:
        return await self._client._call("GET", _core.export_path(job_id, export_id), ExportPublic)

    async def cancel_export(self, job_id: str, export_id: str) -> ExportPublic:
        path = _core.export_path(job_id, export_id, "cancel")
        return await self._client._call("POST", path, ExportPublic)

    # Logs

    async def log_chunk(self, job_id: str, *, offset: int = 0, limit: int = _core.LOG_READ_BYTES) -> LogChunk:
        params = {"offset": offset, "limit": limit}
        return await self._client._call("GET", _core.job_path(job_id, "logs"), LogChunk, params=params)

    async def log_chunks(
        self, job_id: str, *, offset: int = 0, follow: bool = False, poll: float = 1.0
    ) -> AsyncIterator[LogChunk]:
        if follow:
            async for chunk in self._follow(job_id, offset, poll):
                yield chunk
            return
        while True:
            chunk = await self.log_chunk(job_id, offset=offset)
            yield chunk
            if chunk.complete or not chunk.text or chunk.next_offset == offset:
                return
            offset = chunk.next_offset

    async def logs(
        self, job_id: str, *, follow: bool = False, offset: int = 0, poll: float = 1.0
    ) -> AsyncIterator[str]:
        lines = _core.LineBuffer()
        async for chunk in self.log_chunks(job_id, offset=offset, follow=follow, poll=poll):
            for line in lines.feed(chunk.text):
                yield line
        rest = lines.flush()
        if rest is not None:
            yield rest

    async def _follow(self, job_id: str, offset: int, poll: float) -> AsyncIterator[LogChunk]:
        path = _core.job_path(job_id, "logs", "stream")
        while True:
            try:
                async with self._client._stream(path, {"offset": offset}) as resp:
                    sse = _core.SSEDecoder()
                    async for line in resp.aiter_lines():
                        event = sse.feed(line)
                        chunk = _core.log_event(*event, offset) if event else None
                        if chunk is None:
                            continue
                        yield chunk
                        if chunk.complete:
                            return
                        offset = chunk.next_offset
            except ConnectionLost:
                pass
            await anyio.sleep(poll)
            chunk = await self.log_chunk(job_id, offset=offset)
            if chunk.text or chunk.complete:
                yield chunk
            if chunk.complete:
                return
            offset = chunk.next_offset

    # Metrics

    async def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> EventPage:
        params = {"after": after, "limit": limit}
        return await self._client._call("GET", _core.job_path(job_id, "events"), EventPage, params=params)

    async def metrics(self, job_id: str, *, after_step: int = -1, limit: int = 1000) -> MetricsPage:
        params = {"after_step": after_step, "limit": limit}
        return await self._client._call("GET", _core.job_path(job_id, "metrics"), MetricsPage, params=params)

    async def iter_metrics(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 1000,
    ) -> AsyncIterator[Point]:
        while True:
            page = await self.metrics(job_id, after_step=after_step, limit=page_size)
            for point in page.data:
                yield point
            if page.data:
                after_step = page.next_after_step
            if page.complete:
                return
            if len(page.data) < page_size:
                if not follow:
                    return
                await anyio.sleep(poll)

    # Samples

    async def samples(self, job_id: str, *, after_step: int = -1, limit: int = 100) -> SamplesPage:
        params = {"after_step": after_step, "limit": limit}
        return await self._client._call("GET", _core.job_path(job_id, "samples"), SamplesPage, params=params)

    async def iter_samples(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 100,
    ) -> AsyncIterator[SamplePublic]:
        while True:
            page = await self.samples(job_id, after_step=after_step, limit=page_size)
            for sample in page.data:
                yield sample
            if page.data:
                after_step = page.next_after_step
            if page.complete:
                return
            if len({s.step for s in page.data}) < page_size:
                if not follow:
                    return
                await anyio.sleep(poll)

    # Waiting

    async def wait(self, job_id: str, *, timeout: float | None = None, poll: float = 1.0) -> JobPublic:
        """The job once it has ended; WaitTimeout after `timeout` s; a 503 is waited out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                job = await self.get(job_id)
            except Unavailable as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                await anyio.sleep(exc.retry_after or poll)
                continue
            if _core.is_terminal(job.status):
                return job
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WaitTimeout(job, timeout or 0.0)
            await anyio.sleep(poll if deadline is None else max(0.0, min(poll, deadline - now)))

    # Artifacts

    async def artifacts(self, job_id: str) -> builtins.list[Artifact]:
        return (await self._client._call("GET", _core.job_path(job_id, "artifacts"), ArtifactList)).data

    async def download(
        self,
        job_id: str,
        path: str = "final",
        out: str | os.PathLike[str] = ".",
        *,
        progress: Callable[[int, int], None] | None = None,
        verify: bool = True,
    ) -> builtins.list[_core.Downloaded]:
        """See `ftq.client.Jobs.download`."""
        listed = await self.artifacts(job_id)
        plan = _core.plan_download(listed, path, Path(out))
        if not plan:
            raise _core.no_artifact(job_id, path)
        total = sum(a.size for a, _ in plan)

        def report(n: int) -> None:
            if progress:
                progress(n, total)

        fetched: builtins.list[tuple[Artifact, Path, str | None, int]] = []
        for artifact, dest in plan:
            if await anyio.to_thread.run_sync(_core.already_there, dest, artifact):
                report(artifact.size)
                fetched.append((artifact, dest, None, 0))
                continue
            digest, resumed = await self._fetch(job_id, artifact, dest, report)
            fetched.append((artifact, dest, digest, resumed))
        deadline = time.monotonic() + _core.SHA_WAIT_SECONDS
        listed_now = {a.path: a for a, *_ in fetched}
        while verify and any(listed_now[a.path].sha256 is None for a, _, d, _ in fetched if d is not None):
            if time.monotonic() > deadline:
                break
            await anyio.sleep(1.0)
            listed_now.update({a.path: a for a in await self.artifacts(job_id) if a.path in listed_now})
        return [
            _core.settle_file(listed_now[a.path], dest, digest, resumed, verify)
            for a, dest, digest, resumed in fetched
        ]

    async def _fetch(
        self, job_id: str, artifact: Artifact, dest: Path, report: Callable[[int], None]
    ) -> tuple[str, int]:
        dest.parent.mkdir(parents=True, exist_ok=True)
        part, etag_file = _core.part_files(dest)
        headers, have = _core.resume_headers(part, etag_file)
        if have > artifact.size:
            headers, have = {}, 0
        if have == artifact.size:
            digest, have = await anyio.to_thread.run_sync(_core.hash_prefix, part)
            report(have)
            return str(digest.hexdigest()), have
        async with self._client._stream(_core.artifact_path(job_id, artifact.path), {}, headers) as resp:
            if resp.status_code == 206:
                digest, have = await anyio.to_thread.run_sync(_core.hash_prefix, part)
                mode = "ab"
                report(have)
            else:
                digest, have, mode = hashlib.sha256(), 0, "wb"
            etag_file.write_text(resp.headers.get("etag", ""))
            with part.open(mode) as f:
                async for chunk in resp.aiter_bytes(_core.DOWNLOAD_CHUNK):
                    f.write(chunk)
                    digest.update(chunk)
                    report(len(chunk))
        return str(digest.hexdigest()), have
