# Generated from ftq/client/_async.py by bin/unasync_sdk.py (unasync): do not edit. Change _async.py
# and run `make unasync`; `make lint` fails while this file is stale.
"""The SDK's two clients, written once: `AsyncClient` (asyncio and trio) in `_async.py`, and `Client`,
the blocking one for scripts, CLIs and internal tools, in `_sync.py`, generated from it by unasync
(bin/unasync_sdk.py, `make unasync`): the same surface, without `await` and `async for`."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Never, overload

import httpx

from ftq.client import _api, _core, _plan
from ftq.client._core import SpecInput, StatusFilter
from ftq.client._plan import A, Progress, R, T
from ftq.contract import graders, schemas, serving, tinker
from ftq.contract.schemas import FileList, FilePublic


class Client:
    """A connection to one ftq server. Reuse it (it keeps connections open); close it when done.

    url: the server (default: FTQ_URL, else http://127.0.0.1:8000). token: the bearer token (default:
    FTQ_TOKEN; "" sends none). transport: an httpx transport (`httpx.BaseTransport`, for AsyncClient an
    `httpx.AsyncBaseTransport`), e.g. to route through a proxy or a test app.
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
        self.graders = Graders(self)
        self.deployments = Deployments(self)
        self.training_clients = TrainingClients(self)

    def events(self, *, after: int = 0, limit: int = 100) -> schemas.EventPage:
        """GET /events: one page of the events of all this owner's jobs, after the cursor `after`."""
        return self._call(_api.events(after=after, limit=limit))

    def health(self) -> schemas.Health:
        """GET /healthz: the API process answers (it does not check the store; see /readyz)."""
        return self._call(_api.health())

    def usage(
        self, *, since: datetime | None = None, until: datetime | None = None, group_by: str = "owner"
    ) -> schemas.UsagePage:
        """GET /usage: device-seconds of runs that ended in [since, until), per owner or per owner and day."""
        return self._call(_api.usage(since=since, until=until, group_by=group_by))

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
        return f"{type(self).__name__}(url={self.url!r})"

    # Transport: every call is a `_plan` flow, and this loop runs them all, so every failure comes out
    # as an ftq error and the two clients cannot read the API differently.

    def _call(self, call: _plan.Call[A]) -> A:
        return self._run(_plan.fetch(call))

    def _run(self, flow: _plan.Flow[Never, R]) -> R:
        run: _plan.Run[Never, R] = _plan.Run(flow)
        for _ in self._drive(run):
            pass
        return run.result

    def _iterate(self, flow: _plan.Flow[T, None]) -> Iterator[T]:
        return self._drive(_plan.Run(flow))

    def _drive(self, run: _plan.Run[T, Any]) -> Iterator[T]:
        """Does each step the flow asks for and answers it (or throws its failure in); yields its items."""
        with ExitStack() as stream:  # the response the flow reads with Next steps
            for step in run:
                if not isinstance(step, _plan.Step):
                    yield step
                    continue
                try:
                    run.answer(self._do(step, run, stream))
                except Exception as exc:
                    run.fail(exc)

    def _do(self, step: _plan.Step, run: _plan.Run[Any, Any], stream: ExitStack) -> Any:
        try:
            if isinstance(step, _plan.Next):
                return next(run.reading, None)
            if isinstance(step, _plan.Call):
                return step.read(self._request(step), self.url)
            if isinstance(step, _plan.Open):
                stream.close()  # a flow reads one response at a time
                resp = stream.enter_context(self._open(step))
                run.reading = resp.iter_lines() if step.lines else resp.iter_bytes(_core.CHUNK_BYTES)
                return resp
        except httpx.HTTPError as exc:
            raise _core.transport_error(exc, self.url, run.path) from exc
        if isinstance(step, _plan.Sleep | _plan.Blocking):
            return step.run()
        return None

    def _request(self, call: _plan.Call[Any]) -> httpx.Response:
        query = {k: v for k, v in call.params.items() if v is not None}
        content = call.content.chunks() if isinstance(call.content, _plan.Upload) else call.content
        resp = self._http.request(call.method, call.path, params=query, content=content, headers=call.headers)
        if resp.status_code >= 400:
            raise _core.error_from_response(resp)
        return resp

    @contextmanager
    def _open(self, step: _plan.Open) -> Iterator[httpx.Response]:
        with self._http.stream(
            "GET", step.path, params=dict(step.params), headers=dict(step.headers)
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise _core.error_from_response(resp)
            yield resp


class Jobs:
    """The /jobs routes; reached as `client.jobs`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[False] = False
    ) -> schemas.JobPublic: ...

    @overload
    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: Literal[True]
    ) -> schemas.PlanPublic: ...

    @overload
    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool
    ) -> schemas.JobPublic | schemas.PlanPublic: ...

    def create(
        self, spec: SpecInput, *, idempotency_key: str | None = None, dry_run: bool = False
    ) -> schemas.JobPublic | schemas.PlanPublic:
        """Submit a job; with dry_run, only the plan (config, command, memory estimate), nothing stored.

        spec: a JobSpec, a dict, or a YAML/JSON file's path. idempotency_key: a retry with the same key
        and spec returns the same job instead of a second one, so a tool can retry a POST safely.
        """
        return self._client._call(_api.create_job(spec, idempotency_key, dry_run))

    def list_page(
        self, status: StatusFilter = None, *, limit: int = 50, cursor: str | None = None
    ) -> schemas.JobList:
        """One page of jobs, newest first; pass its next_cursor to get the next page."""
        return self._client._call(_api.list_page(status, limit=limit, cursor=cursor))

    def list(self, status: StatusFilter = None, *, limit: int = 50) -> Iterator[schemas.JobPublic]:
        """Every job (of these statuses), newest first, fetching `limit` per request as it goes."""
        return self._client._iterate(_api.list_jobs(status, limit))

    def get(self, job_id: str) -> schemas.JobPublic:
        return self._client._call(_api.get_job(job_id))

    def cancel(self, job_id: str) -> schemas.JobPublic:
        """Ask the job to stop; idempotent, and a finished job is returned unchanged."""
        return self._client._call(_api.cancel_job(job_id))

    def pause(self, job_id: str) -> schemas.JobPublic:
        """Hold a queued job, or stop a running one with a checkpoint (it shows `paused` once its run has
        ended and its devices are free); idempotent. Conflict (`not_pausable`) once it has ended."""
        return self._client._call(_api.pause_job(job_id))

    def resume(self, job_id: str) -> schemas.JobPublic:
        """Queue a paused job again; it continues from its newest checkpoint. Conflict
        (`not_resumable`) while it is still pausing or once it has ended."""
        return self._client._call(_api.resume_job(job_id))

    def plan(self, job_id: str) -> schemas.PlanPublic:
        """What was rendered for the job: accelerate config, command, launch or sbatch script."""
        return self._client._call(_api.plan(job_id))

    def checkpoints(self, job_id: str) -> builtins.list[schemas.Checkpoint]:
        return self._client._call(_api.checkpoints(job_id))

    # Exports

    def export(
        self,
        job_id: str,
        kind: str = "merged",
        dtype: str = "bf16",
        *,
        max_shard_size: str | None = None,
        push_to_hub: Mapping[str, Any] | str | None = None,
        checkpoint: str | int = "final",
    ) -> schemas.ExportPublic:
        """Export a succeeded job's model (`merged` or `adapter`, in `dtype`); an identical export under
        way or done is returned instead of a new one. `push_to_hub`: a repo id or `{repo_id, private}`.
        `checkpoint`: `final`, `best` (by the spec's eval.select) or a checkpoint's step."""
        call = _api.export(job_id, kind, dtype, max_shard_size, push_to_hub, checkpoint)
        return self._client._call(call)

    def exports(self, job_id: str) -> builtins.list[schemas.ExportPublic]:
        """The job's exports, newest first."""
        return self._client._call(_api.exports(job_id))

    def get_export(self, job_id: str, export_id: str) -> schemas.ExportPublic:
        return self._client._call(_api.get_export(job_id, export_id))

    def cancel_export(self, job_id: str, export_id: str) -> schemas.ExportPublic:
        return self._client._call(_api.cancel_export(job_id, export_id))

    def wait_export(
        self, job_id: str, export_id: str, *, timeout: float | None = None, poll: float = 1.0
    ) -> schemas.ExportPublic:
        """The export once it has ended; TimeoutError after `timeout` s; outages waited out as by `wait`."""
        return self._client._run(_api.wait_export(job_id, export_id, timeout, poll))

    # Evaluations

    def evaluate(
        self, job_id: str, checkpoint: str | int = "final", *, suites: Sequence[str] | None = None
    ) -> schemas.EvaluationPublic:
        """Evaluate a checkpoint (`final`, `best` or a step) with the spec's suites (all, or those named)."""
        return self._client._call(_api.evaluate(job_id, checkpoint, suites))

    def evaluations(self, job_id: str) -> builtins.list[schemas.EvaluationPublic]:
        """The job's evaluations, newest first (those its spec's eval.on queued, and those asked for)."""
        return self._client._call(_api.evaluations(job_id))

    def get_evaluation(self, job_id: str, evaluation_id: str) -> schemas.EvaluationPublic:
        return self._client._call(_api.get_evaluation(job_id, evaluation_id))

    def cancel_evaluation(self, job_id: str, evaluation_id: str) -> schemas.EvaluationPublic:
        return self._client._call(_api.cancel_evaluation(job_id, evaluation_id))

    def wait_evaluation(
        self, job_id: str, evaluation_id: str, *, timeout: float | None = None, poll: float = 1.0
    ) -> schemas.EvaluationPublic:
        """The evaluation once it has ended; TimeoutError after `timeout` s."""
        return self._client._run(_api.wait_evaluation(job_id, evaluation_id, timeout, poll))

    # Logs

    def log_chunk(
        self, job_id: str, *, offset: int = 0, limit: int = _core.LOG_READ_BYTES
    ) -> schemas.LogChunk:
        """Bytes [offset, offset+limit) of train.log; `complete` once the job ended and all was read."""
        return self._client._call(_api.log_chunk(job_id, offset=offset, limit=limit))

    def log_chunks(
        self, job_id: str, *, offset: int = 0, follow: bool = False, poll: float = 1.0
    ) -> Iterator[schemas.LogChunk]:
        """train.log as it comes. Without follow: what is there now. With follow: until the job has
        ended and the whole log was read; the last chunk then has `complete` set. A follow rides out a
        server restart as `wait` does."""
        return self._client._iterate(_api.log_chunks(job_id, offset, follow, poll))

    def logs(self, job_id: str, *, follow: bool = False, offset: int = 0, poll: float = 1.0) -> Iterator[str]:
        """train.log line by line (without the newline); see `log_chunks` for follow."""
        return self._client._iterate(_api.log_lines(_api.log_chunks(job_id, offset, follow, poll)))

    # Events

    def events(self, job_id: str, *, after: int = 0, limit: int = 100) -> schemas.EventPage:
        """One page of the job's events with id > after, oldest first; pass `next_after` on."""
        return self._client._call(_api.job_events(job_id, after=after, limit=limit))

    def iter_events(
        self, job_id: str, *, after: int = 0, follow: bool = False, poll: float = 1.0, page_size: int = 1000
    ) -> Iterator[schemas.Event]:
        """Every event of the job with id > after, oldest first, page by page; with follow, also those
        added later, until the job has ended and its last event was read."""
        return self._client._iterate(_api.iter_events(job_id, after, follow, poll, page_size))

    # Metrics

    def metrics(self, job_id: str, *, after_step: int = -1, limit: int = 1000) -> schemas.MetricsPage:
        """One page of points with step > after_step; after_step=-1 starts at the first point."""
        return self._client._call(_api.metrics(job_id, after_step=after_step, limit=limit))

    def iter_metrics(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 1000,
    ) -> Iterator[schemas.Point]:
        """Every point after after_step, page by page; with follow, also those logged later, until the
        job has ended and all were read."""
        return self._client._iterate(_api.iter_metrics(job_id, after_step, follow, poll, page_size))

    # Samples

    def samples(self, job_id: str, *, after_step: int = -1, limit: int = 100) -> schemas.SamplesPage:
        """One page of samples (completions of the spec's eval.sample_prompts): up to `limit` whole steps
        after after_step; after_step=-1 starts at the first."""
        return self._client._call(_api.samples(job_id, after_step=after_step, limit=limit))

    def iter_samples(
        self,
        job_id: str,
        *,
        after_step: int = -1,
        follow: bool = False,
        poll: float = 1.0,
        page_size: int = 100,
    ) -> Iterator[schemas.SamplePublic]:
        """Every sample after after_step, page by page; with follow, also those written later, until the
        job has ended and all were read."""
        return self._client._iterate(_api.iter_samples(job_id, after_step, follow, poll, page_size))

    # Waiting

    def wait(self, job_id: str, *, timeout: float | None = None, poll: float = 1.0) -> schemas.JobPublic:
        """The job once it has ended (succeeded, failed or cancelled); WaitTimeout after `timeout` s.

        A server that stops answering (a 503, a timeout, a connection refused while it restarts) is
        waited out rather than raised, while time is left and for at most OUTAGE_PATIENCE_SECONDS in a
        row.
        """
        return self._client._run(_api.wait_job(job_id, timeout, poll))

    # Artifacts

    def artifacts(self, job_id: str) -> builtins.list[schemas.Artifact]:
        """Every file of the run a user may download (final/, checkpoints, exports, logs), with size,
        kind and sha256 (None while the server is still hashing a big file)."""
        return self._client._call(_api.artifacts(job_id))

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
        return self._client._run(_api.download(job_id, path, out, progress, verify))


class Graders:
    """The /graders routes (try a grader before training with it); reached as `client.graders`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def run(
        self,
        grader: Mapping[str, Any],
        model_sample: str | Mapping[str, Any],
        item: Mapping[str, Any] | None = None,
    ) -> graders.GraderRunResponse:
        """POST /graders/run: the grader's reward for the sample (its text, or {output_text,
        output_json}) and the dataset row `item`; `metadata.errors` says what went wrong."""
        return self._client._call(_api.run_grader(grader, model_sample, item or {}))

    def validate(self, grader: Mapping[str, Any]) -> graders.GraderValidateResponse:
        """POST /graders/validate: the grader as the server reads it (a ValidationError naming the field)."""
        return self._client._call(_api.validate_grader(grader))


class Files:
    """The /files routes (uploaded dataset files); reached as `client.files`."""

    def __init__(self, client: Client) -> None:
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


class Deployments:
    """The /deployments route (the engines that answer your /v1 calls); reached as `client.deployments`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self) -> serving.DeploymentList:
        """GET /deployments: your engines (`data`: base, status and why it is queued or failed, devices,
        adapters loaded, requests, tokens in and out, device-seconds), and `usage`, your calls' sums since
        the API process started."""
        return self._client._call(_api.deployments())


class TrainingClients:
    """The /training_clients route (your Tinker training clients, each a run); `client.training_clients`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self, *, limit: int = 50) -> tinker.TrainingClientList:
        """GET /training_clients: yours, newest first (`data`: base, rank, status, paused while saved idle,
        devices, device-seconds, last used, the last forward_backward's time)."""
        return self._client._call(_api.training_clients(limit))
