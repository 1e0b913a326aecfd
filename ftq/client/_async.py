"""The asyncio (and trio) client: the same surface as `Client`, with `await` and `async for`."""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Never, overload

import anyio
import httpx

from ftq.client import _api, _core, _plan
from ftq.client._core import SpecInput, StatusFilter
from ftq.client._files import AsyncFiles
from ftq.client._plan import A, R, T
from ftq.contract import schemas


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

    async def events(self, *, after: int = 0, limit: int = 100) -> schemas.EventPage:
        """GET /events: one page of the events of all this owner's jobs, after the cursor `after`."""
        return await self._call(_api.events(after=after, limit=limit))

    async def health(self) -> schemas.Health:
        """GET /healthz: the API process answers (it does not check the store; see /readyz)."""
        return await self._call(_api.health())

    async def usage(
        self, *, since: datetime | None = None, until: datetime | None = None, group_by: str = "owner"
    ) -> schemas.UsagePage:
        """GET /usage: device-seconds of runs that ended in [since, until), per owner or per owner and day."""
        return await self._call(_api.usage(since=since, until=until, group_by=group_by))

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

    # Transport: the same flows as `Client` runs (`_api`), each step awaited.

    async def _call(self, call: _plan.Call[A]) -> A:
        return await self._run(_plan.fetch(call))

    async def _run(self, flow: _plan.Flow[Never, R]) -> R:
        run: _plan.Run[Never, R] = _plan.Run(flow)
        async for _ in self._drive(run):
            pass
        return run.result

    def _iterate(self, flow: _plan.Flow[T, None]) -> AsyncIterator[T]:
        return self._drive(_plan.Run(flow))

    async def _drive(self, run: _plan.Run[T, Any]) -> AsyncIterator[T]:
        """As `Client._drive`, each step awaited (disk work in a worker thread)."""
        async with AsyncExitStack() as stream:
            for step in run:
                if not isinstance(step, _plan.Step):
                    yield step
                    continue
                try:
                    run.answer(await self._do(step, run, stream))
                except Exception as exc:
                    run.fail(exc)

    async def _do(self, step: _plan.Step, run: _plan.Run[Any, Any], stream: AsyncExitStack) -> Any:
        try:
            if isinstance(step, _plan.Next):
                return await anext(run.reading, None)
            if isinstance(step, _plan.Call):
                return step.read(await self._request(step), self.url)
            if isinstance(step, _plan.Open):
                await stream.aclose()  # a flow reads one response at a time
                resp = await stream.enter_async_context(self._open(step))
                run.reading = resp.aiter_lines() if step.lines else resp.aiter_bytes(_core.CHUNK_BYTES)
                return resp
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, run.path) from exc
        if isinstance(step, _plan.Sleep):
            await anyio.sleep(step.seconds)
        elif isinstance(step, _plan.Blocking):
            return await anyio.to_thread.run_sync(step.fn)
        return None

    async def _request(self, call: _plan.Call[Any]) -> httpx.Response:
        query = {k: v for k, v in call.params.items() if v is not None}
        content = call.content.achunks() if isinstance(call.content, _plan.Upload) else call.content
        resp = await self._http.request(
            call.method, call.path, params=query, content=content, headers=call.headers
        )
        if resp.status_code >= 400:
            raise _core.error_from_response(resp)
        return resp

    @asynccontextmanager
    async def _open(self, step: _plan.Open) -> AsyncIterator[httpx.Response]:
        async with self._http.stream(
            "GET", step.path, params=dict(step.params), headers=dict(step.headers)
        ) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                raise _core.error_from_response(resp)
            yield resp


class AsyncJobs:
    """The /jobs routes; reached as `client.jobs`. See `ftq.client.Jobs` for what each one does."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @overload
    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[False] = False
    ) -> schemas.JobPublic: ...

    @overload
    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[True]
    ) -> schemas.PlanPublic: ...

    @overload
    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool
    ) -> schemas.JobPublic | schemas.PlanPublic: ...

    async def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool = False
    ) -> schemas.JobPublic | schemas.PlanPublic:
        """Submit a job (JobSpec, dict or file path); with dry_run, only its plan, nothing stored."""
        return await self._client._call(_api.create_job(spec, idempotency_key, dry_run))

    async def list_page(
        self, status: StatusFilter = None, *, limit: int = 50, cursor: str | None = None
    ) -> schemas.JobList:
        return await self._client._call(_api.list_page(status, limit=limit, cursor=cursor))

    def list(self, status: StatusFilter = None, *, limit: int = 50) -> AsyncIterator[schemas.JobPublic]:
        """Every job (of these statuses), newest first: `async for job in client.jobs.list(): ...`."""
        return self._client._iterate(_api.list_jobs(status, limit))

    async def get(self, job_id: str) -> schemas.JobPublic:
        return await self._client._call(_api.get_job(job_id))

    async def cancel(self, job_id: str) -> schemas.JobPublic:
        return await self._client._call(_api.cancel_job(job_id))

    async def plan(self, job_id: str) -> schemas.PlanPublic:
        return await self._client._call(_api.plan(job_id))

    async def checkpoints(self, job_id: str) -> builtins.list[schemas.Checkpoint]:
        return await self._client._call(_api.checkpoints(job_id))

    # Exports

    async def export(
        self,
        job_id: str,
        kind: str = "merged",
        dtype: str = "bf16",
        *,
        max_shard_size: str | None = None,
        push_to_hub: Mapping[str, Any] | str | None = None,
    ) -> schemas.ExportPublic:
        """As `Client.jobs.export`."""
        return await self._client._call(_api.export(job_id, kind, dtype, max_shard_size, push_to_hub))

    async def exports(self, job_id: str) -> builtins.list[schemas.ExportPublic]:
        return await self._client._call(_api.exports(job_id))

    async def get_export(self, job_id: str, export_id: str) -> schemas.ExportPublic:
        return await self._client._call(_api.get_export(job_id, export_id))

    async def cancel_export(self, job_id: str, export_id: str) -> schemas.ExportPublic:
        return await self._client._call(_api.cancel_export(job_id, export_id))

    async def wait_export(
        self, job_id: str, export_id: str, *, timeout: float | None = None, poll: float = 1.0
    ) -> schemas.ExportPublic:
        return await self._client._run(_api.wait_export(job_id, export_id, timeout, poll))

    # Logs

    async def log_chunk(
        self, job_id: str, *, offset: int = 0, limit: int = _core.LOG_READ_BYTES
    ) -> schemas.LogChunk:
        return await self._client._call(_api.log_chunk(job_id, offset=offset, limit=limit))

    def log_chunks(
        self, job_id: str, *, offset: int = 0, follow: bool = False, poll: float = 1.0
    ) -> AsyncIterator[schemas.LogChunk]:
        return self._client._iterate(_api.log_chunks(job_id, offset, follow, poll))

    def logs(
        self, job_id: str, *, follow: bool = False, offset: int = 0, poll: float = 1.0
    ) -> AsyncIterator[str]:
        return self._client._iterate(_api.log_lines(_api.log_chunks(job_id, offset, follow, poll)))

    # Metrics

    async def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> schemas.EventPage:
        return await self._client._call(_api.job_events(job_id, after=after, limit=limit))

    def iter_events(
        self, job_id: str, *, after: int = 0, follow: bool = False, poll: float = 1.0, page_size: int = 1000
    ) -> AsyncIterator[schemas.Event]:
        """Every event of the job with id > after, oldest first, page by page; with follow, also those
        added later, until the job has ended and its last event was read."""
        return self._client._iterate(_api.iter_events(job_id, after, follow, poll, page_size))

    async def metrics(self, job_id: str, *, after_step: int = -1, limit: int = 1000) -> schemas.MetricsPage:
        return await self._client._call(_api.metrics(job_id, after_step=after_step, limit=limit))

    def iter_metrics(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 1000,
    ) -> AsyncIterator[schemas.Point]:
        return self._client._iterate(_api.iter_metrics(job_id, after_step, follow, poll, page_size))

    # Samples

    async def samples(self, job_id: str, *, after_step: int = -1, limit: int = 100) -> schemas.SamplesPage:
        return await self._client._call(_api.samples(job_id, after_step=after_step, limit=limit))

    def iter_samples(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 100,
    ) -> AsyncIterator[schemas.SamplePublic]:
        return self._client._iterate(_api.iter_samples(job_id, after_step, follow, poll, page_size))

    # Waiting

    async def wait(
        self, job_id: str, *, timeout: float | None = None, poll: float = 1.0
    ) -> schemas.JobPublic:
        """The job once it has ended; WaitTimeout after `timeout` s; outages waited out as by Jobs.wait."""
        return await self._client._run(_api.wait_job(job_id, timeout, poll))

    # Artifacts

    async def artifacts(self, job_id: str) -> builtins.list[schemas.Artifact]:
        return await self._client._call(_api.artifacts(job_id))

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
        return await self._client._run(_api.download(job_id, path, out, progress, verify))
