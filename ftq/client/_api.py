"""Every call of the SDK, described once for `Client` and `AsyncClient` (see `_plan`): a `Call` for a
single request, a flow for what pages, follows, waits or downloads."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Never, Protocol, TypeVar
from urllib.parse import quote

import httpx
import pydantic_core

from ftq.client import _core
from ftq.client._core import Downloaded, M, SpecInput, StatusFilter, job_path
from ftq.client._plan import (
    Call,
    Flow,
    Progress,
    Upload,
    blocking,
    each_item,
    fetch,
    next_bytes,
    next_line,
    open_stream,
    sleep,
)
from ftq.client.errors import ConnectionLost, Unavailable, WaitTimeout
from ftq.contract import graders, schemas, serving, tinker

X = TypeVar("X")
X_co = TypeVar("X_co", covariant=True)

_SSE = {"Accept": "text/event-stream"}
_JSON = {"Content-Type": "application/json"}


def reads(model: type[M]) -> Callable[[httpx.Response, str], M]:
    """The answer as `model` (an UnexpectedResponse when it is not one)."""
    return lambda resp, url: _core.parse_model(resp, model, url)


def get(path: str, model: type[M], **params: Any) -> Call[M]:
    return Call("GET", path, reads(model), params)


def post(path: str, model: type[M]) -> Call[M]:
    return Call("POST", path, reads(model))


# The server --------------------------------------------------------------------------------------------


def health() -> Call[schemas.Health]:
    return get("/healthz", schemas.Health)


def events(*, after: int, limit: int) -> Call[schemas.EventPage]:
    return get("/events", schemas.EventPage, after=after, limit=limit)


def usage(*, since: datetime | None, until: datetime | None, group_by: str) -> Call[schemas.UsagePage]:
    params = {
        "group_by": group_by,
        "from": None if since is None else since.isoformat(),
        "to": None if until is None else until.isoformat(),
    }
    return Call("GET", "/usage", reads(schemas.UsagePage), params)


def run_grader(
    grader: Mapping[str, Any], model_sample: str | Mapping[str, Any], item: Mapping[str, Any]
) -> Call[graders.GraderRunResponse]:
    body = {"grader": grader, "model_sample": model_sample, "item": item}
    return Call(
        "POST", "/graders/run", reads(graders.GraderRunResponse), {}, pydantic_core.to_json(body), _JSON
    )


def validate_grader(grader: Mapping[str, Any]) -> Call[graders.GraderValidateResponse]:
    body = {"grader": grader}
    return Call(
        "POST",
        "/graders/validate",
        reads(graders.GraderValidateResponse),
        {},
        pydantic_core.to_json(body),
        _JSON,
    )


def deployments() -> Call[serving.DeploymentList]:
    return get("/deployments", serving.DeploymentList)


def training_clients(limit: int) -> Call[tinker.TrainingClientList]:
    return get("/training_clients", tinker.TrainingClientList, limit=limit)


# Jobs --------------------------------------------------------------------------------------------------


def create_job(
    spec: SpecInput, idempotency_key: str | None, dry_run: bool
) -> Call[schemas.JobPublic | schemas.PlanPublic]:
    content, ctype = _core.spec_body(spec)
    headers = {"Content-Type": ctype}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    if dry_run:
        return Call("POST", "/jobs", reads(schemas.PlanPublic), {"dry_run": "true"}, content, headers)
    return Call("POST", "/jobs", reads(schemas.JobPublic), {}, content, headers)


def list_page(status: StatusFilter, *, limit: int, cursor: str | None) -> Call[schemas.JobList]:
    return get("/jobs", schemas.JobList, status=_core.status_param(status), limit=limit, cursor=cursor)


def list_jobs(status: StatusFilter, limit: int) -> Flow[schemas.JobPublic, None]:
    return pages_by_cursor(lambda cursor: list_page(status, limit=limit, cursor=cursor))


def get_job(job_id: str) -> Call[schemas.JobPublic]:
    return get(job_path(job_id), schemas.JobPublic)


def cancel_job(job_id: str) -> Call[schemas.JobPublic]:
    return post(job_path(job_id, "cancel"), schemas.JobPublic)


def pause_job(job_id: str) -> Call[schemas.JobPublic]:
    return post(job_path(job_id, "pause"), schemas.JobPublic)


def resume_job(job_id: str) -> Call[schemas.JobPublic]:
    return post(job_path(job_id, "resume"), schemas.JobPublic)


def plan(job_id: str) -> Call[schemas.PlanPublic]:
    return get(job_path(job_id, "plan"), schemas.PlanPublic)


def checkpoints(job_id: str) -> Call[list[schemas.Checkpoint]]:
    listing = reads(schemas.CheckpointList)
    return Call("GET", job_path(job_id, "checkpoints"), lambda resp, url: listing(resp, url).data)


def job_events(job_id: str, *, after: int, limit: int) -> Call[schemas.EventPage]:
    return get(job_path(job_id, "events"), schemas.EventPage, after=after, limit=limit)


def iter_events(
    job_id: str, after: int, follow: bool, poll: float, page_size: int
) -> Flow[schemas.Event, None]:
    """Every event of the job with id > after, page by page; with follow, also those added later, until
    the job has ended and its last event was read."""
    while True:
        job = (yield from fetch(get_job(job_id))) if follow else None
        while True:
            got = yield from fetch(job_events(job_id, after=after, limit=page_size))
            yield from got.data
            after = got.next_after
            if len(got.data) < page_size:
                break
        # The status was read before the events, so a job that had ended then has its last event read.
        if job is None or ended(job):
            return
        yield from sleep(poll)


def wait_job(job_id: str, timeout: float | None, poll: float) -> Flow[Never, schemas.JobPublic]:
    def timed_out(job: schemas.JobPublic) -> WaitTimeout:
        return WaitTimeout(job, timeout or 0.0)

    return wait_until(get_job(job_id), ended, timed_out, timeout, poll)


def ended(found: schemas.JobPublic | schemas.ExportPublic | schemas.EvaluationPublic) -> bool:
    return _core.is_terminal(found.status)


# Exports


def export(
    job_id: str,
    kind: str,
    dtype: str,
    max_shard_size: str | None,
    push_to_hub: Mapping[str, Any] | str | None,
    checkpoint: str | int = "final",
) -> Call[schemas.ExportPublic]:
    content, headers = _core.export_body(kind, dtype, max_shard_size, push_to_hub, checkpoint)
    return Call("POST", _core.export_path(job_id), reads(schemas.ExportPublic), {}, content, headers)


def exports(job_id: str) -> Call[list[schemas.ExportPublic]]:
    return side_runs(_core.export_path(job_id), schemas.ExportList)


def get_export(job_id: str, export_id: str) -> Call[schemas.ExportPublic]:
    return get(_core.export_path(job_id, export_id), schemas.ExportPublic)


def cancel_export(job_id: str, export_id: str) -> Call[schemas.ExportPublic]:
    return post(_core.export_path(job_id, export_id, "cancel"), schemas.ExportPublic)


def wait_export(
    job_id: str, export_id: str, timeout: float | None, poll: float
) -> Flow[Never, schemas.ExportPublic]:
    return wait_side_run(get_export(job_id, export_id), f"export {export_id}", timeout, poll)


# Evaluations


def evaluate(
    job_id: str, checkpoint: str | int, suites: Sequence[str] | None
) -> Call[schemas.EvaluationPublic]:
    content, headers = _core.evaluation_body(checkpoint, suites)
    return Call("POST", _core.evaluation_path(job_id), reads(schemas.EvaluationPublic), {}, content, headers)


def evaluations(job_id: str) -> Call[list[schemas.EvaluationPublic]]:
    return side_runs(_core.evaluation_path(job_id), schemas.EvaluationList)


def get_evaluation(job_id: str, evaluation_id: str) -> Call[schemas.EvaluationPublic]:
    return get(_core.evaluation_path(job_id, evaluation_id), schemas.EvaluationPublic)


def cancel_evaluation(job_id: str, evaluation_id: str) -> Call[schemas.EvaluationPublic]:
    return post(_core.evaluation_path(job_id, evaluation_id, "cancel"), schemas.EvaluationPublic)


def wait_evaluation(
    job_id: str, evaluation_id: str, timeout: float | None, poll: float
) -> Flow[Never, schemas.EvaluationPublic]:
    return wait_side_run(get_evaluation(job_id, evaluation_id), f"evaluation {evaluation_id}", timeout, poll)


# What every side run (an export, an evaluation) shares


SideRun = TypeVar("SideRun", schemas.ExportPublic, schemas.EvaluationPublic)


def side_runs(path: str, listing: type[schemas.ExportList] | type[schemas.EvaluationList]) -> Call[Any]:
    """A job's side runs of one kind (`path`, answered as `listing`), newest first."""
    read = reads(listing)
    return Call("GET", path, lambda resp, url: read(resp, url).data)


def wait_side_run(
    call: Call[SideRun], label: str, timeout: float | None, poll: float
) -> Flow[Never, SideRun]:
    """The side run `call` reads once it has ended; TimeoutError (naming it: `label`) after `timeout` s."""

    def timed_out(found: SideRun) -> TimeoutError:
        return TimeoutError(f"{label} still {found.status} after {timeout} s")

    return wait_until(call, ended, timed_out, timeout, poll)


# Logs


def log_chunk(job_id: str, *, offset: int, limit: int = _core.LOG_READ_BYTES) -> Call[schemas.LogChunk]:
    return get(job_path(job_id, "logs"), schemas.LogChunk, offset=offset, limit=limit)


def log_chunks(job_id: str, offset: int, follow: bool, poll: float) -> Flow[schemas.LogChunk, None]:
    """train.log as it comes. Without follow: what is there now. With follow: until the job has ended and
    the whole log was read; the last chunk then has `complete` set."""
    if follow:
        yield from follow_log(job_id, offset, poll)
        return
    while True:
        chunk = yield from fetch(log_chunk(job_id, offset=offset))
        yield chunk
        if chunk.complete or not chunk.text or chunk.next_offset == offset:
            return
        offset = chunk.next_offset


def follow_log(job_id: str, offset: int, poll: float) -> Flow[schemas.LogChunk, None]:
    # The server streams the log (one request for the whole run). Should the stream end early (server
    # restart, a proxy's idle timeout), one plain read catches up, through a restart, and the stream
    # reopens.
    path = job_path(job_id, "logs", "stream")
    answered = False
    while True:
        try:
            yield from open_stream(path, lines=True, params={"offset": offset}, headers=_SSE)
            answered = True
            sse = _core.SSEDecoder()
            while (line := (yield from next_line())) is not None:
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
        except _core.OUTAGE_ERRORS:
            if not answered:
                raise  # the server was never reached: a wrong URL, or one not started
        yield from sleep(poll)
        chunk = yield from riding_out(log_chunk(job_id, offset=offset), poll, answered=answered)
        answered = True
        if chunk.text or chunk.complete:
            yield chunk
        if chunk.complete:
            return
        offset = chunk.next_offset


def log_lines(chunks: Flow[schemas.LogChunk, None]) -> Flow[str, None]:
    """The text of `chunks` line by line (without the newline)."""
    buffer = _core.LineBuffer()
    yield from each_item(chunks, lambda chunk: iter(buffer.feed(chunk.text)))
    rest = buffer.flush()
    if rest is not None:
        yield rest


# Metrics and samples


def metrics(job_id: str, *, after_step: int, limit: int) -> Call[schemas.MetricsPage]:
    return get(job_path(job_id, "metrics"), schemas.MetricsPage, after_step=after_step, limit=limit)


def iter_metrics(
    job_id: str, after_step: int, follow: bool, poll: float, page_size: int
) -> Flow[schemas.Point, None]:
    page = partial(metrics, job_id, limit=page_size)
    return pages_after_step(page, after_step, page_size, follow, poll)


def samples(job_id: str, *, after_step: int, limit: int) -> Call[schemas.SamplesPage]:
    return get(job_path(job_id, "samples"), schemas.SamplesPage, after_step=after_step, limit=limit)


def iter_samples(
    job_id: str, after_step: int, follow: bool, poll: float, page_size: int
) -> Flow[schemas.SamplePublic, None]:
    def steps(got: Sequence[schemas.SamplePublic]) -> int:  # a page's `limit` counts whole steps
        return len({s.step for s in got})

    page = partial(samples, job_id, limit=page_size)
    return pages_after_step(page, after_step, page_size, follow, poll, count=steps)


# Artifacts


def artifacts(job_id: str) -> Call[list[schemas.Artifact]]:
    listing = reads(schemas.ArtifactList)
    return Call("GET", job_path(job_id, "artifacts"), lambda resp, url: listing(resp, url).data)


def download(
    job_id: str, path: str, out: str | os.PathLike[str], progress: Progress | None, verify: bool
) -> Flow[Never, list[Downloaded]]:
    """An artifact file, or a folder file by file, fetched into `out` (see `Jobs.download`)."""
    plan = _core.plan_download((yield from fetch(artifacts(job_id))), path, Path(out))
    if not plan:
        raise _core.no_artifact(job_id, path)
    total = sum(a.size for a, _ in plan)

    def report(n: int) -> None:
        if progress:
            progress(n, total)

    fetched: list[tuple[schemas.Artifact, Path, str | None, int]] = []
    for artifact, dest in plan:
        if (yield from blocking(partial(_core.already_there, dest, artifact))):
            report(artifact.size)
            fetched.append((artifact, dest, None, 0))
            continue
        digest, resumed = yield from _fetch_file(job_id, artifact, dest, report)
        fetched.append((artifact, dest, digest, resumed))

    # Check each fetched file against the listed sha256, waiting for the server to hash what it had not.
    deadline = time.monotonic() + _core.SHA_WAIT_SECONDS
    listed = {a.path: a for a, *_ in fetched}
    while verify and any(listed[a.path].sha256 is None for a, _, d, _ in fetched if d is not None):
        if time.monotonic() > deadline:
            break
        yield from sleep(1.0)
        listed.update({a.path: a for a in (yield from fetch(artifacts(job_id))) if a.path in listed})
    return [
        _core.settle_file(listed[a.path], dest, digest, resumed, verify)
        for a, dest, digest, resumed in fetched
    ]


def _fetch_file(
    job_id: str, artifact: schemas.Artifact, dest: Path, report: Callable[[int], None]
) -> Flow[Never, tuple[str, int]]:
    """One file into its .part file, continuing what an interrupted download left (Range + If-Range);
    (sha256 of the whole file, bytes it resumed from)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, etag_file = _core.part_files(dest)
    headers, have = _core.resume_headers(part, etag_file)
    if have > artifact.size:
        headers, have = {}, 0
    if have == artifact.size:  # interrupted after the last byte: the sha256 check says if it is whole
        digest, have = yield from blocking(partial(_core.hash_prefix, part))
        report(have)
        return str(digest.hexdigest()), have
    resp = yield from open_stream(_core.artifact_path(job_id, artifact.path), lines=False, headers=headers)
    if resp.status_code == 206:
        digest, have = yield from blocking(partial(_core.hash_prefix, part))
        mode = "ab"
        report(have)
    else:
        digest, have, mode = hashlib.sha256(), 0, "wb"
    etag_file.write_text(resp.headers.get("etag", ""))
    with part.open(mode) as f:
        while (chunk := (yield from next_bytes())) is not None:
            f.write(chunk)
            digest.update(chunk)
            report(len(chunk))
    return str(digest.hexdigest()), have


# Files -------------------------------------------------------------------------------------------------


def file_path(file_id: str, *rest: str) -> str:
    if not file_id:
        raise ValueError("file_id is empty")
    return "/".join(["/files", quote(file_id, safe=""), *rest])


def upload(
    path: str | os.PathLike[str], filename: str | None, progress: Progress | None
) -> Call[schemas.FilePublic]:
    local = Path(path)
    headers = {"Content-Type": "application/jsonl", "Content-Length": str(os.stat(local).st_size)}
    params = {"filename": filename or local.name}
    return Call("POST", "/files", reads(schemas.FilePublic), params, Upload(local, progress), headers)


def files_page(*, limit: int, cursor: str | None) -> Call[schemas.FileList]:
    return get("/files", schemas.FileList, limit=limit, cursor=cursor)


def list_files(limit: int) -> Flow[schemas.FilePublic, None]:
    return pages_by_cursor(lambda cursor: files_page(limit=limit, cursor=cursor))


def get_file(file_id: str) -> Call[schemas.FilePublic]:
    return get(file_path(file_id), schemas.FilePublic)


def file_content(file_id: str) -> Call[bytes]:
    return Call("GET", file_path(file_id, "content"), lambda resp, url: resp.content)


def download_file(file_id: str, dest: str | os.PathLike[str]) -> Flow[Never, Path]:
    out = Path(dest)
    yield from open_stream(file_path(file_id, "content"), lines=False)
    with open(out, "wb") as f:
        while (chunk := (yield from next_bytes())) is not None:
            f.write(chunk)
    return out


def delete_file(file_id: str) -> Call[None]:
    return Call("DELETE", file_path(file_id), lambda resp, url: None)


def wait_file(file_id: str, timeout: float | None, poll: float) -> Flow[Never, schemas.FilePublic]:
    def timed_out(found: schemas.FilePublic) -> WaitTimeout:
        return WaitTimeout(found, timeout or 0.0)  # type: ignore[arg-type]

    return wait_until(get_file(file_id), lambda f: f.status != "validating", timed_out, timeout, poll)


# Paging and waiting, for every route that pages or ends -------------------------------------------------


class CursorPage(Protocol[X_co]):
    @property
    def data(self) -> Sequence[X_co]: ...

    @property
    def next_cursor(self) -> str | None: ...


class StepPage(Protocol[X_co]):
    @property
    def data(self) -> Sequence[X_co]: ...

    @property
    def next_after_step(self) -> int: ...

    @property
    def complete(self) -> bool: ...


def pages_by_cursor(page: Callable[[str | None], Call[CursorPage[X]]]) -> Flow[X, None]:
    """Every item of every page, following `next_cursor` until a page has none."""
    cursor: str | None = None
    while True:
        got = yield from fetch(page(cursor))
        yield from got.data
        if not got.next_cursor:
            return
        cursor = got.next_cursor


def pages_after_step(
    page: Callable[..., Call[StepPage[X]]],
    after_step: int,
    page_size: int,
    follow: bool,
    poll: float,
    count: Callable[[Sequence[X]], int] = len,
) -> Flow[X, None]:
    """Every item after after_step, `page(after_step=...)` by page; with follow, also those written later,
    until the job has ended and all were read (`complete`). A page of fewer than `page_size` (as `count`
    counts them) means what is there now was read."""
    while True:
        got = yield from fetch(page(after_step=after_step))
        yield from got.data
        if got.data:
            after_step = got.next_after_step
        if got.complete:
            return
        if count(got.data) < page_size:
            if not follow:
                return
            yield from sleep(poll)


def riding_out(
    call: Call[M], poll: float, *, answered: bool, deadline: float | None = None
) -> Flow[Never, M]:
    """`call`'s answer, with an outage of the server waited out, every `poll` seconds, until `deadline`
    and for at most OUTAGE_PATIENCE_SECONDS: a 503 (its store restarting) at once, and timeouts and
    dropped or refused connections once it has `answered` (before that, a wrong URL looks the same)."""
    outage = _core.Outage()
    while True:
        try:
            return (yield from fetch(call))
        except _core.OUTAGE_ERRORS as exc:
            if not outage.endure(exc, answered=answered, deadline=deadline):
                raise
            wait = exc.retry_after if isinstance(exc, Unavailable) and exc.retry_after else poll
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            yield from sleep(wait)


def wait_until(
    call: Call[M],
    done: Callable[[M], bool],
    timed_out: Callable[[M], Exception],
    timeout: float | None,
    poll: float,
) -> Flow[Never, M]:
    """`call` every `poll` seconds until its answer is `done`; `timed_out(last answer)` is raised after
    `timeout` seconds. A server that stops answering is waited out as `riding_out` says."""
    deadline = None if timeout is None else time.monotonic() + timeout
    answered = False
    while True:
        found = yield from riding_out(call, poll, answered=answered, deadline=deadline)
        answered = True
        if done(found):
            return found
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise timed_out(found)
        yield from sleep(poll if deadline is None else max(0.0, min(poll, deadline - now)))
