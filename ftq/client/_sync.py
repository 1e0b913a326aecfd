"""The blocking client: `Client(...).jobs.create(...)`, for scripts, CLIs and internal tools."""

from __future__ import annotations

import builtins
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, overload

import httpx

from ftq.client import _core
from ftq.client._core import M, SpecInput, StatusFilter
from ftq.client._files import Files
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


class Client:
    """A connection to one ftq server. Reuse it (it keeps connections open); close it when done.

    url: the server (default: FTQ_URL, else http://127.0.0.1:8000). token: the bearer token (default:
    FTQ_TOKEN; "" sends none). transport: an httpx transport, e.g. to route through a proxy or a test app.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = _core.DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = _core.resolve_url(url)
        self._http = httpx.Client(
            base_url=self.url,
            headers=_core.build_headers(token, headers),
            timeout=timeout,
            transport=transport,
        )
        self.jobs = Jobs(self)
        self.files = Files(self)

    def events(self, *, after: int = 0, limit: int = 100) -> EventPage:
        """GET /events: one page of the events of all this owner's jobs, after the cursor `after`."""
        return self._call("GET", "/events", EventPage, params={"after": after, "limit": limit})

    def health(self) -> Health:
        """GET /healthz: the API process answers (it does not check the store; see /readyz)."""
        return self._call("GET", "/healthz", Health)

    def usage(
        self, *, since: datetime | None = None, until: datetime | None = None, group_by: str = "owner"
    ) -> UsagePage:
        """GET /usage: device-seconds of runs that ended in [since, until), per owner or per owner and day."""
        params: dict[str, Any] = {"group_by": group_by}
        if since is not None:
            params["from"] = since.isoformat()
        if until is not None:
            params["to"] = until.isoformat()
        return self._call("GET", "/usage", UsagePage, params=params)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"

    # Transport: every request goes through here, so every failure comes out as an ftq error.

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        content: bytes | Iterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            resp = self._http.request(method, path, params=query, content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, path) from exc
        if resp.status_code >= 400:
            raise _core.error_from_response(resp)
        return resp

    def _call(self, method: str, path: str, model: type[M], **kwargs: Any) -> M:
        return _core.parse_model(self._send(method, path, **kwargs), model, self.url)

    @contextmanager
    def _stream_get(self, path: str) -> Iterator[httpx.Response]:
        """A GET whose body is read as it comes (a file's content)."""
        try:
            with self._http.stream("GET", path) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _core.error_from_response(resp)
                yield resp
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, path) from exc

    @contextmanager
    def _stream(
        self, path: str, params: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Iterator[httpx.Response]:
        try:
            with self._http.stream(
                "GET", path, params=dict(params), headers=dict(headers or {"Accept": "text/event-stream"})
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _core.error_from_response(resp)
                yield resp
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, path) from exc


class Jobs:
    """The /jobs routes; reached as `client.jobs`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[False] = False
    ) -> JobPublic: ...

    @overload
    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[True]
    ) -> PlanPublic: ...

    @overload
    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool
    ) -> JobPublic | PlanPublic: ...

    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool = False
    ) -> JobPublic | PlanPublic:
        """Submit a job; with dry_run, only the plan (config, command, memory estimate), nothing stored.

        spec: a JobSpec, a dict, or a YAML/JSON file's path. idempotency_key: a retry with the same key
        and spec returns the same job instead of a second one, so a tool can retry a POST safely.
        """
        content, ctype = _core.spec_body(spec)
        headers = {"Content-Type": ctype}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if dry_run:
            params = {"dry_run": "true"}
            return self._client._call(
                "POST", "/jobs", PlanPublic, params=params, content=content, headers=headers
            )
        return self._client._call("POST", "/jobs", JobPublic, content=content, headers=headers)

    def list_page(
        self, status: StatusFilter = None, *, limit: int = 50, cursor: str | None = None
    ) -> JobList:
        """One page of jobs, newest first; pass its next_cursor to get the next page."""
        params = {"status": _core.status_param(status), "limit": limit, "cursor": cursor}
        return self._client._call("GET", "/jobs", JobList, params=params)

    def list(self, status: StatusFilter = None, *, limit: int = 50) -> Iterator[JobPublic]:
        """Every job (of these statuses), newest first, fetching `limit` per request as it goes."""
        cursor: str | None = None
        while True:
            page = self.list_page(status, limit=limit, cursor=cursor)
            yield from page.data
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def get(self, job_id: str) -> JobPublic:
        return self._client._call("GET", _core.job_path(job_id), JobPublic)

    def cancel(self, job_id: str) -> JobPublic:
        """Ask the job to stop; idempotent, and a finished job is returned unchanged."""
        return self._client._call("POST", _core.job_path(job_id, "cancel"), JobPublic)

    def plan(self, job_id: str) -> PlanPublic:
        """What was rendered for the job: accelerate config, command, launch or sbatch script."""
        return self._client._call("GET", _core.job_path(job_id, "plan"), PlanPublic)

    def checkpoints(self, job_id: str) -> builtins.list[Checkpoint]:
        return self._client._call("GET", _core.job_path(job_id, "checkpoints"), CheckpointList).data

    # Exports

    def export(
        self,
        job_id: str,
        kind: str = "merged",
        dtype: str = "bf16",
        *,
        max_shard_size: str | None = None,
        push_to_hub: Mapping[str, Any] | str | None = None,
    ) -> ExportPublic:
        """Export a succeeded job's model (`merged` or `adapter`, in `dtype`); an identical export under
        way or done is returned instead of a new one. `push_to_hub`: a repo id or `{repo_id, private}`."""
        content, headers = _core.export_body(kind, dtype, max_shard_size, push_to_hub)
        path = _core.export_path(job_id)
        return self._client._call("POST", path, ExportPublic, content=content, headers=headers)

    def exports(self, job_id: str) -> builtins.list[ExportPublic]:
        """The job's exports, newest first."""
        return self._client._call("GET", _core.export_path(job_id), ExportList).data

    def get_export(self, job_id: str, export_id: str) -> ExportPublic:
        return self._client._call("GET", _core.export_path(job_id, export_id), ExportPublic)

    def cancel_export(self, job_id: str, export_id: str) -> ExportPublic:
        return self._client._call("POST", _core.export_path(job_id, export_id, "cancel"), ExportPublic)

    def wait_export(
        self, job_id: str, export_id: str, *, timeout: float | None = None, poll: float = 1.0
    ) -> ExportPublic:
        """The export once it has ended; WaitTimeout-like TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            export = self.get_export(job_id, export_id)
            if _core.is_terminal(export.status):
                return export
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"export {export_id} still {export.status} after {timeout} s")
            time.sleep(poll)

    # Logs

    def log_chunk(self, job_id: str, *, offset: int = 0, limit: int = _core.LOG_READ_BYTES) -> LogChunk:
        """Bytes [offset, offset+limit) of train.log; `complete` once the job ended and all was read."""
        params = {"offset": offset, "limit": limit}
        return self._client._call("GET", _core.job_path(job_id, "logs"), LogChunk, params=params)

    def log_chunks(
        self, job_id: str, *, offset: int = 0, follow: bool = False, poll: float = 1.0
    ) -> Iterator[LogChunk]:
        """train.log as it comes. Without follow: what is there now. With follow: until the job has
        ended and the whole log was read; the last chunk then has `complete` set."""
        if follow:
            yield from self._follow(job_id, offset, poll)
            return
        while True:
            chunk = self.log_chunk(job_id, offset=offset)
            yield chunk
            if chunk.complete or not chunk.text or chunk.next_offset == offset:
                return
            offset = chunk.next_offset

    def logs(self, job_id: str, *, follow: bool = False, offset: int = 0, poll: float = 1.0) -> Iterator[str]:
        """train.log line by line (without the newline); see `log_chunks` for follow."""
        lines = _core.LineBuffer()
        for chunk in self.log_chunks(job_id, offset=offset, follow=follow, poll=poll):
            yield from lines.feed(chunk.text)
        rest = lines.flush()
        if rest is not None:
            yield rest

    def _follow(self, job_id: str, offset: int, poll: float) -> Iterator[LogChunk]:
        # The server streams the log (one request for the whole run). Should the stream end early
        # (server restart, a proxy's idle timeout), one plain read catches up and the stream reopens.
        path = _core.job_path(job_id, "logs", "stream")
        while True:
            try:
                with self._client._stream(path, {"offset": offset}) as resp:
                    sse = _core.SSEDecoder()
                    for line in resp.iter_lines():
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
            time.sleep(poll)
            chunk = self.log_chunk(job_id, offset=offset)
            if chunk.text or chunk.complete:
                yield chunk
            if chunk.complete:
                return
            offset = chunk.next_offset

    # Events

    def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> EventPage:
        """One page of the job's events with id > after, oldest first; pass `next_after` on."""
        params = {"after": after, "limit": limit}
        return self._client._call("GET", _core.job_path(job_id, "events"), EventPage, params=params)

    # Metrics

    def metrics(self, job_id: str, *, after_step: int = -1, limit: int = 1000) -> MetricsPage:
        """One page of points with step > after_step; after_step=-1 starts at the first point."""
        params = {"after_step": after_step, "limit": limit}
        return self._client._call("GET", _core.job_path(job_id, "metrics"), MetricsPage, params=params)

    def iter_metrics(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 1000,
    ) -> Iterator[Point]:
        """Every point after after_step, page by page; with follow, also those logged later, until the
        job has ended and all were read."""
        while True:
            page = self.metrics(job_id, after_step=after_step, limit=page_size)
            yield from page.data
            if page.data:
                after_step = page.next_after_step
            if page.complete:
                return
            if len(page.data) < page_size:  # caught up with what is there now
                if not follow:
                    return
                time.sleep(poll)

    # Samples

    def samples(self, job_id: str, *, after_step: int = -1, limit: int = 100) -> SamplesPage:
        """One page of samples (completions of the spec's eval.sample_prompts): up to `limit` whole steps
        after after_step; after_step=-1 starts at the first."""
        params = {"after_step": after_step, "limit": limit}
        return self._client._call("GET", _core.job_path(job_id, "samples"), SamplesPage, params=params)

    def iter_samples(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 100,
    ) -> Iterator[SamplePublic]:
        """Every sample after after_step, page by page; with follow, also those written later, until the
        job has ended and all were read."""
        while True:
            page = self.samples(job_id, after_step=after_step, limit=page_size)
            yield from page.data
            if page.data:
                after_step = page.next_after_step
            if page.complete:
                return
            if len({s.step for s in page.data}) < page_size:  # caught up with what is there now
                if not follow:
                    return
                time.sleep(poll)

    # Waiting

    def wait(self, job_id: str, *, timeout: float | None = None, poll: float = 1.0) -> JobPublic:
        """The job once it has ended (succeeded, failed or cancelled); WaitTimeout after `timeout` s.

        A 503 (the server's store restarting) is waited out rather than raised, while time is left.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                job = self.get(job_id)
            except Unavailable as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                time.sleep(exc.retry_after or poll)
                continue
            if _core.is_terminal(job.status):
                return job
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WaitTimeout(job, timeout or 0.0)
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - now)))

    # Artifacts

    def artifacts(self, job_id: str) -> builtins.list[Artifact]:
        """Every file of the run a user may download (final/, checkpoints, exports, logs), with size,
        kind and sha256 (None while the server is still hashing a big file)."""
        return self._client._call("GET", _core.job_path(job_id, "artifacts"), ArtifactList).data

    def download(
        self,
        job_id: str,
        path: str = "final",
        out: str | os.PathLike[str] = ".",
        *,
        progress: Callable[[int, int], None] | None = None,
        verify: bool = True,
    ) -> builtins.list[_core.Downloaded]:
        """Download an artifact file, or a folder file by file (`final`, `checkpoints/checkpoint-20`,
        `exports/<id>`), into `out`: a file as out/<name>, a folder as out/<folder name>/... (the layout
        of its .tar). Each file is written to `<name>.part` and moved into place once its sha256 matches
        the list (ChecksumMismatch otherwise); an interrupted download continues from its .part file
        (Range + If-Range: only if the server still has the same version of the file). `progress` is
        called with (bytes just written, total bytes of the download)."""
        listed = self.artifacts(job_id)
        plan = _core.plan_download(listed, path, Path(out))
        if not plan:
            raise _core.no_artifact(job_id, path)
        total = sum(a.size for a, _ in plan)
        report = (lambda n: progress(n, total)) if progress else (lambda n: None)
        fetched: builtins.list[tuple[Artifact, Path, str | None, int]] = []
        for artifact, dest in plan:
            if _core.already_there(dest, artifact):
                report(artifact.size)
                fetched.append((artifact, dest, None, 0))
                continue
            digest, resumed = self._fetch(job_id, artifact, dest, report)
            fetched.append((artifact, dest, digest, resumed))
        return self._settle(job_id, fetched, verify)

    def _fetch(
        self, job_id: str, artifact: Artifact, dest: Path, report: Callable[[int], None]
    ) -> tuple[str, int]:
        """Fetch one file into its .part file; (sha256 of the whole file, bytes it resumed from)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        part, etag_file = _core.part_files(dest)
        headers, have = _core.resume_headers(part, etag_file)
        if have > artifact.size:
            headers, have = {}, 0
        if have == artifact.size:  # interrupted after the last byte: the sha256 check says if it is whole
            digest, have = _core.hash_prefix(part)
            report(have)
            return digest.hexdigest(), have
        with self._client._stream(_core.artifact_path(job_id, artifact.path), {}, headers) as resp:
            if resp.status_code == 206:
                digest, have = _core.hash_prefix(part)
                mode = "ab"
                report(have)
            else:
                digest, have, mode = hashlib.sha256(), 0, "wb"
            etag_file.write_text(resp.headers.get("etag", ""))
            with part.open(mode) as f:
                for chunk in resp.iter_bytes(_core.DOWNLOAD_CHUNK):
                    f.write(chunk)
                    digest.update(chunk)
                    report(len(chunk))
        return digest.hexdigest(), have

    def _settle(
        self, job_id: str, fetched: builtins.list[tuple[Artifact, Path, str | None, int]], verify: bool
    ) -> builtins.list[_core.Downloaded]:
        """Check each fetched file against the listed sha256 (waiting for the server to hash what it
        had not yet) and move it into place."""
        deadline = time.monotonic() + _core.SHA_WAIT_SECONDS
        listed = {a.path: a for a, *_ in fetched}
        while verify and any(listed[a.path].sha256 is None for a, _, d, _ in fetched if d is not None):
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
            listed.update({a.path: a for a in self.artifacts(job_id) if a.path in listed})
        return [
            _core.settle_file(listed[a.path], dest, digest, resumed, verify)
            for a, dest, digest, resumed in fetched
        ]
