"""Client commands of `ftq`: submit, ls, status, logs, events, metrics, samples, cancel, pause, resume,
artifacts, download, eval, evals, export, exports, deployments.

They talk to the API through the Python SDK (`ftq.client.Client`), at `FTQ_URL` (default
http://127.0.0.1:$FTQ_PORT, the port `ftq up` listens on; 8000 unless set), sending `FTQ_TOKEN` as a
bearer token when it is set. Every expected failure
(server down, 401, 404, a 422 on a spec field, a missing or unparsable file) is one line on stderr and
a non-zero exit, never a traceback:

    exit 0  done (for `submit --follow`: the job succeeded)
    exit 1  the server refused the request, or the followed job failed or was cancelled
    exit 2  the local input is wrong (missing file, bad YAML/JSON)
    exit 3  the server cannot be reached
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TextIO, TypeVar

import typer
import yaml
from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from ftq.cli.files import print_dataset, upload_spec_files
from ftq.cli.output import (
    EXIT_INPUT,
    EXIT_REFUSED,
    POLL_SECONDS,
    TERMINAL,
    TRANSIENT,
    EventCount,
    LogLines,
    Patience,
    api,
    err,
    fail,
    fmt_age,
    fmt_bytes,
    fmt_count,
    fmt_duration,
    fmt_fixed,
    fmt_loss,
    fmt_number,
    fmt_progress,
    fmt_sci,
    fmt_status,
    fmt_time,
    one_line_errors,
    out,
    sparkline,
)
from ftq.client import (
    Client,
    Deployment,
    DeploymentList,
    EvaluationPublic,
    ExportPublic,
    FtqClientError,
    JobPublic,
    PlanPublic,
    Point,
)
from ftq.contract import specyaml
from ftq.contract.tinker import TrainingClientInfo

client_app = typer.Typer(add_completion=False)

P = ParamSpec("P")
R = TypeVar("R")

# Commands ----------------------------------------------------------------------------------------------


def _command(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def register(fn: Callable[P, R]) -> Callable[P, R]:
        wrapped = one_line_errors(fn)
        client_app.command(name)(wrapped)
        return wrapped

    return register


JobIdArg = Annotated[str, typer.Argument(help="Job id, e.g. job_0123456789abcdef", show_default=False)]


@_command("submit")
def submit(
    file: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON.", show_default=False)],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show progress and the log until it ends.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the rendered launch; store nothing.")
    ] = False,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retries with this key return the same job.")
    ] = None,
    upload: Annotated[
        bool,
        typer.Option(
            "--upload",
            help="Upload the local .jsonl files the spec names (dataset.name_or_path, and an eval file) "
            "and submit the spec with their file ids instead.",
        ),
    ] = False,
) -> None:
    """Submit a job spec. With --follow, exit 0 when the job succeeds and 1 when it fails or is cancelled."""
    with api() as client:
        spec: Any = file
        if upload:
            spec = upload_spec_files(client, file)
        if dry_run:
            plan = client.jobs.create(spec, idempotency_key=idempotency_key, dry_run=True)
            print_plan(plan, spec)
            if plan.warnings:
                # Scripts that gate a submit on the dry run see what submit would refuse.
                raise typer.Exit(EXIT_REFUSED)
            return
        job = client.jobs.create(spec, idempotency_key=idempotency_key)
        out.print(f"submitted {job.id} ({escape(job.name)}): {fmt_status(job.status)}")
        if follow:
            try:
                code = follow_job(client, job.id, shown=job.status)
            except KeyboardInterrupt:
                # Following is only watching: the job goes on, and the user should know how to stop it.
                fail(f"stopped following {job.id}; it keeps running (`ftq cancel {job.id}` stops it)", 130)
            raise typer.Exit(code)
    out.print(f"follow it with: ftq status {job.id}  |  ftq logs {job.id} --follow")


def print_plan(plan: PlanPublic, spec: Path | dict[str, Any] | None = None) -> None:
    _print_rendered(plan)
    if plan.dataset is not None:
        out.rule("dataset")
        print_dataset(plan.dataset)
    _print_fetch(plan, spec)
    if plan.warnings:
        out.rule("[red]submit would refuse this job[/]")
        for warning in plan.warnings:
            out.print(f"[red]✗[/] {escape(warning)}", soft_wrap=True)


FETCH_STEP = (
    "-m trainer.fetch"  # what launch.sh and job.sbatch run before the ranks when the spec names a hub repo
)


def _print_fetch(plan: PlanPublic, spec: Path | dict[str, Any] | None) -> None:
    """A plan with a fetch step (a hub model or dataset): what it downloads, and that it does so only when
    the run starts, where it can still fail (gated, private, not found, no network)."""
    if FETCH_STEP not in plan.launch_script and FETCH_STEP not in (plan.sbatch_script or ""):
        return
    names = hub_names(spec)
    what = ", ".join(names) if names else "the spec's hub model or dataset"
    out.rule("[yellow]fetched at run time[/]")
    out.print(
        f"[yellow]![/] {escape(what)}: not checked here; the run's first step downloads it from the Hugging "
        "Face Hub (into the server's hub cache) before training, and the job fails there if it cannot "
        "(gated, private, not found, or the server offline)",
        soft_wrap=True,
    )


def hub_names(spec: Path | dict[str, Any] | None) -> list[str]:
    """The hub ids a spec names as its model, adapter or dataset (names not written as local paths)."""
    from ftq.contract.spec import looks_local

    body: Any = spec
    if isinstance(spec, Path):
        try:
            body = specyaml.load(spec.read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            return []
    if not isinstance(body, dict):
        return []
    found = []
    for section, key in (("model", "name_or_path"), ("model", "adapter"), ("dataset", "name_or_path")):
        value = (body.get(section) or {}).get(key) if isinstance(body.get(section), dict) else None
        if isinstance(value, str) and value and not looks_local(value):
            found.append(value)
    return found


def _print_rendered(plan: PlanPublic) -> None:
    out.rule("accelerate config (accelerate_config.yaml)")
    out.print(escape(plan.accelerate_config_yaml.rstrip()), soft_wrap=True)
    out.rule("command")
    out.print(escape(shlex.join(plan.command)), soft_wrap=True)
    if plan.sbatch_script:
        out.rule("sbatch script (job.sbatch)")
        out.print(escape(plan.sbatch_script.rstrip()), soft_wrap=True)
    elif plan.launch_script:
        out.rule("launch script (launch.sh)")
        out.print(escape(plan.launch_script.rstrip()), soft_wrap=True)
    _print_time_estimate(plan)
    out.rule("memory estimate")
    estimate = plan.estimate
    if estimate is None or estimate.per_device_bytes is None:
        reason = (estimate.reason if estimate else None) or "the model config could not be read"
        out.print(f"no estimate: {escape(str(reason))}")
        return
    fits = estimate.fits
    verdict = "[green]fits[/]" if fits else "[red]does not fit[/]" if fits is False else "unknown"
    out.print(
        f"per device: {fmt_bytes(estimate.per_device_bytes)} of "
        f"{fmt_bytes(estimate.device_memory_bytes)}: {verdict}"
    )
    for key, value in estimate.breakdown.items():
        # The breakdown's numbers are bytes (params, grads, optimizer, activations, ...).
        out.print(f"  {escape(str(key))}: {escape(fmt_bytes(value))}")
    if estimate.usable_device_bytes is not None:
        out.print(
            f"usable per device (the allocator keeps the rest): {fmt_bytes(estimate.usable_device_bytes)}"
        )
    if estimate.host_bytes_per_node is not None:
        have = estimate.host_memory_bytes
        out.print(
            f"host RAM per node: {fmt_bytes(estimate.host_bytes_per_node)}"
            + (f" of {fmt_bytes(have)}" if have else " (not checked: FTQ_NODE_MEMORY_GB unset)")
        )
        for key, value in estimate.host_breakdown.items():
            out.print(f"  {escape(str(key))}: {escape(fmt_bytes(value))}")
    if estimate.fix:
        out.print(f"fix: {escape(estimate.fix)}")
    for alternative in estimate.alternatives:
        out.print(escape(alternative))


def _print_time_estimate(plan: PlanPublic) -> None:
    te = plan.time_estimate
    if te is None:
        return
    out.rule("time estimate")
    if te.seconds is None:
        out.print(f"no time estimate: {escape(te.reason or 'see the assumptions')}", soft_wrap=True)
    else:
        cost = f", cost {te.cost:g}" if te.cost is not None else ""
        out.print(f"{fmt_duration(te.seconds)} on {te.devices} device(s), {te.tokens} tokens{cost}")
    for line in te.assumptions:
        out.print(f"  {escape(line)}", soft_wrap=True)


def follow_job(client: Client, job_id: str, shown: str | None = None) -> int:
    """Progress bar, streamed log and final status of a job; returns the exit code. `shown`: the status
    already printed (by `submit`), not printed again."""
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[detail]}"),
    ]
    with Progress(*columns, console=out, transient=False, refresh_per_second=4) as bar:
        task = bar.add_task(job_id, total=None, detail="")
        feed = JobFeed(client, job_id, bar.console, status=shown)
        patience = Patience()
        while True:
            try:
                job = client.jobs.get(job_id)
            except TRANSIENT as exc:
                patience.failed(exc)
                time.sleep(POLL_SECONDS)
                continue
            patience.answered()
            ended = job.status in TERMINAL
            complete = False
            try:
                complete = feed.catch_up(job.status, ended)
            except TRANSIENT as exc:
                patience.failed(exc)  # what was read is kept (events, log offset); the rest next time
            bar.update(
                task, completed=job.progress.step or 0, total=job.progress.max_steps, detail=bar_detail(job)
            )
            if ended and complete:
                break
            time.sleep(POLL_SECONDS)
        feed.end(job.status)
    code = report_end(job)
    evaluations_hint(client, job)
    return code


def bar_detail(job: JobPublic) -> str:
    """What the follow's bar says after its percentage: the step, loss, learning rate and eta while the
    job trains; before its first step and after its last, what it is doing (`progress.message`, e.g.
    `loading the tokenizer, dataset and model`, else its phase: `queued (#2)`)."""
    progress, step = job.progress, job.progress.step or 0
    of = progress.max_steps or "?"
    if progress.message:
        return escape((f"step {step}/{of} " if step else "") + progress.message)
    if not step and progress.phase and job.status not in TERMINAL:
        position = job.queue.position if job.queue is not None else None
        return escape(progress.phase + (f" (#{position})" if position is not None else ""))
    latest = job.latest_metrics or Point(step=0)
    eta = fmt_duration(progress.eta_seconds) if job.status == "running" else "-"
    return f"step {step}/{of} loss {fmt_loss(latest.loss)} lr {fmt_sci(latest.learning_rate)} eta {eta}"


class JobFeed:
    """What `submit --follow` prints above its bar, in the order it happened: each status the job
    enters, its events (numbered within the job) and its log, in whole lines, each log line with a short
    prefix (`LogLines`). The job's end comes last: once the job has ended, the rest of the log is printed
    first (the trainer wrote it before the job ended), then the last events, then the status it ended in."""

    def __init__(self, client: Client, job_id: str, console: Console, status: str | None = None) -> None:
        self.client, self.job_id, self.console = client, job_id, console
        self.events_seen = EventCount()
        self.log_lines = LogLines()
        self.offset = 0  # of the log read so far
        self.partial = ""  # a line of the log not yet ended
        self.status = status  # the last status printed

    def catch_up(self, status: str, ended: bool) -> bool:
        """Prints what is new since the last look; True once the job's whole log was read."""
        if ended:
            complete = self.log()
            self.events()
            return complete
        if status != self.status:
            self.console.print(f"{self.job_id}: {fmt_status(status)}")
            self.status = status
        self.events()
        return self.log()

    def end(self, status: str) -> None:
        if self.partial:
            self.line(self.log_lines.short(self.partial))
        self.console.print(f"{self.job_id}: {fmt_status(status)}")

    def events(self) -> None:
        for event in self.client.jobs.iter_events(self.job_id, after=self.events_seen.after):
            self.line(self.events_seen.line(event))

    def log(self) -> bool:
        complete = False
        for chunk in self.client.jobs.log_chunks(self.job_id, offset=self.offset):
            self.offset, complete = chunk.next_offset, chunk.complete
            # Whole lines only, so the bar never splits a line of the log.
            lines = (self.partial + chunk.text).split("\n")
            self.partial = lines.pop()
            for line in lines:
                self.line(self.log_lines.short(line))
        return complete

    def line(self, text: str) -> None:
        self.console.print(escape(text), soft_wrap=True, highlight=False)


def report_end(job: JobPublic) -> int:
    latest = job.latest_metrics
    if job.status == "succeeded":
        loss = f", final loss {fmt_loss(latest.loss)}" if latest and latest.loss is not None else ""
        out.print(f"{job.id} [green]succeeded[/] at step {job.progress.step or '-'}{loss}")
        return 0
    code = str(job.error.code) if job.error else str(job.status)
    message = job.error.message if job.error else ""
    exit_code = job.error.exit_code if job.error else None
    detail = f" (exit code {exit_code})" if exit_code is not None else ""
    err.print(f"ftq: {job.id} {job.status}: {escape(code)}: {escape(message)}{detail}", soft_wrap=True)
    return EXIT_REFUSED


def evaluations_hint(client: Client, job: JobPublic) -> None:
    """After a followed job's end: its evaluations that are still to run (queued, running, or final/'s,
    which the worker queues a few seconds after the job succeeded), and the command that waits for them."""
    if not job.spec.eval.suites:
        return
    try:
        found = client.jobs.evaluations(job.id)
    except FtqClientError:
        return  # the job's end is what was followed; `ftq evals` says the rest
    pending = sum(ev.status not in TERMINAL for ev in found)
    final = final_evaluation_due(job, found)
    if not (pending or final):
        return
    what = [f"{pending} queued or running"] if pending else []
    what += ["final/'s to be queued"] if final else []
    out.print(f"evaluations still to come: {', '.join(what)}")
    out.print(f"  wait for their results: ftq evals {job.id} --follow")


@_command("ls")
def ls(
    status: Annotated[
        str | None, typer.Option("--status", help="Comma-separated, e.g. queued,running")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="Most jobs to show.")] = 20,
) -> None:
    """List jobs, newest first; then your Tinker training clients that have not ended (or those of
    `--status`)."""
    with api() as client:
        page = client.jobs.list_page(status, limit=limit)
        try:
            tcs = client.training_clients.list(limit=limit).data
        except FtqClientError:  # a server without Tinker's routes
            tcs = []
    wanted = set(status.split(",")) if status else {"queued", "starting", "running", "paused", "cancelling"}
    tcs = [t for t in tcs if t.status in wanted]
    if not page.data:
        out.print("no jobs" + (f" with status {status}" if status else ""))
    else:
        table, beneath = jobs_table(page.data, out.width)
        out.print(table)
        for line in beneath:
            out.print(line, soft_wrap=True)
        if page.next_cursor:
            out.print(f"(more than {limit}; use --limit)")
    if tcs:
        out.print("")
        out.print("training clients (Tinker):")
        out.print(training_clients_table(tcs))


def training_clients_table(found: list[TrainingClientInfo]) -> Table:
    """`ftq ls`'s section of Tinker training clients: each a run (paused: saved idle, its next call brings
    it back), its devices, device time, the last forward_backward's time on its host and when last used."""
    table = Table(box=None, header_style="bold", pad_edge=False, collapse_padding=True)
    for header in ("ID", "BASE", "STATUS", "DEVICES", "DEV-TIME", "STEP", "USED"):
        justify: JustifyMethod = "right" if header in ("DEV-TIME", "STEP", "USED") else "left"
        table.add_column(header, no_wrap=True, overflow="ellipsis", justify=justify)
    for t in found:
        step = "-" if t.last_step_seconds is None else f"{t.last_step_seconds:.3f}s"
        table.add_row(
            Text(t.id),  # plain text: rich would read `:train:` in a Tinker model id as an emoji's name
            Text(t.base),
            fmt_status(t.status),
            f"{t.device} x{t.devices}",
            fmt_duration(t.device_seconds),
            step,
            fmt_duration(_age_seconds(t.last_used_at)) + " ago",
        )
    return table


# `ftq ls` fits the terminal without cutting what a user copies or reads: the id, status, progress, loss and
# age are whole, with their headers, and the name takes the room that is left, whole where it fits (cut
# with an ellipsis only where it must). A failed job's error gets a column where there is room for the
# whole name and at least LS_ERROR_MIN of it; else each failed job's error is a line under the table (the
# whole message is in `ftq status`). A terminal too narrow for LS_NAME_MIN of the name loses the age, the
# loss and the progress first.
LS_NAME_MIN = 12
LS_ERROR_MIN, LS_ERROR_MAX = 24, 60
LS_GAP = 2  # between two columns
LS_DROPPED_FIRST = ("AGE", "LOSS", "PROGRESS")


def jobs_table(jobs: list[JobPublic], width: int) -> tuple[Table, list[str]]:
    """The table of `jobs` for a terminal `width` columns wide, and the lines to print under it."""
    fixed = {
        "ID": [j.id for j in jobs],
        "STATUS": [fmt_status(j.status) for j in jobs],
        "PROGRESS": [fmt_progress(j) for j in jobs],
        "LOSS": [fmt_loss(j.latest_metrics.loss if j.latest_metrics else None) for j in jobs],
        "AGE": [fmt_duration(_age_seconds(j.created_at)) for j in jobs],
    }
    names = [escape(j.name) for j in jobs]
    errors = [
        f"[red]{escape(str(j.error.code))}[/]: {escape(j.error.message)}" if j.error else "" for j in jobs
    ]
    widths = {header: _cells_width(header, cells) for header, cells in fixed.items()}
    for dropped in LS_DROPPED_FIRST:  # a terminal too narrow for the name: these go, in this order
        if _room(width, widths) >= LS_NAME_MIN:
            break
        del fixed[dropped], widths[dropped]
    room = _room(width, widths)  # what is left for the name (and the error)
    name_width = _cells_width("NAME", names)
    error_width = min(_cells_width("ERROR", errors), LS_ERROR_MAX)
    with_error = any(errors) and room - LS_GAP - name_width >= LS_ERROR_MIN
    if with_error:
        error_width = min(error_width, room - LS_GAP - name_width)
    else:
        name_width = max(len("NAME"), min(name_width, room))

    table = Table(box=None, header_style="bold", pad_edge=False)
    columns = {"ID": fixed["ID"], "NAME": names, **{k: v for k, v in fixed.items() if k != "ID"}}
    for header in columns:
        size = name_width if header == "NAME" else widths[header]
        justify: JustifyMethod = "right" if header == "LOSS" else "left"
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=size, justify=justify)
    if with_error:
        table.add_column("ERROR", no_wrap=True, overflow="ellipsis", width=error_width)
    for row, error in zip(zip(*columns.values(), strict=True), errors, strict=True):
        table.add_row(*row, *([error] if with_error else []))
    beneath = [] if with_error else [f"{j.id}: {e}" for j, e in zip(jobs, errors, strict=True) if e]
    return table, beneath


def _age_seconds(when: datetime) -> float:
    """Seconds since `when` (the store's times are UTC)."""
    return (datetime.now(UTC) - (when if when.tzinfo else when.replace(tzinfo=UTC))).total_seconds()


def _room(width: int, widths: dict[str, int]) -> int:
    return width - sum(widths.values()) - LS_GAP * len(widths)


def _cells_width(header: str, cells: list[str]) -> int:
    return max(cell_len(Text.from_markup(c).plain) for c in [header, *cells])


@_command("status")
def status(
    job_id: JobIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Job as JSON.")] = False,
) -> None:
    """Show one job."""
    with api() as client:
        job = client.jobs.get(job_id)
    if as_json:
        out.print_json(data=job.model_dump(mode="json"))
        return
    progress = job.progress
    latest = job.latest_metrics or Point(step=0)
    external = f" ({escape(str(job.external_id))})" if job.external_id else ""
    rows: list[tuple[str, str]] = [
        ("id", job.id),
        ("name", escape(job.name)),
        ("owner", escape(job.owner)),
        ("status", fmt_status(job.status)),
        ("model", escape(job.spec.model.name_or_path)),
        ("dataset", escape(job.spec.dataset.source or "-")),
        ("launcher", job.launcher + external),
        ("created", f"{fmt_time(job.created_at)} ({fmt_age(job.created_at)})"),
        ("started", fmt_time(job.started_at)),
        ("finished", fmt_time(job.finished_at)),
        ("progress", fmt_progress(job) + (f" ({escape(progress.message)})" if progress.message else "")),
        ("epoch", fmt_fixed(progress.epoch, 2)),
        ("eta", fmt_duration(progress.eta_seconds) if job.status == "running" else "-"),
        ("loss", fmt_loss(latest.loss)),
        ("eval loss", fmt_loss(latest.eval_loss)),
        ("learning rate", fmt_sci(latest.learning_rate)),
    ]
    if job.queue is not None:
        q = job.queue
        where = f"#{q.position} " if q.position is not None else ""
        when = f", expected to start {fmt_time(q.estimated_start)}" if q.estimated_start else ""
        rows.append(("queue", f"{where}waiting: {escape(q.reason)}{when}"))
    if job.usage is not None:
        u = job.usage
        rows.append(
            (
                "usage",
                f"{u.devices} device(s) x {fmt_duration(u.device_seconds / max(u.devices, 1))}"
                f" = {u.device_seconds:.0f} device-seconds ({u.gpu_hours:.3f} GPU hours)",
            )
        )
    if job.estimate_vs_actual is not None and job.estimate_vs_actual.estimated_seconds:
        e = job.estimate_vs_actual
        rows.append(
            (
                "estimate",
                f"{fmt_duration(e.estimated_seconds)} estimated, {fmt_duration(e.actual_seconds)} taken",
            )
        )
    if job.best_checkpoint is not None:
        rows.append(("best checkpoint", fmt_best(job)))
    error = job.error
    if error:
        exit_code = f" (exit code {error.exit_code})" if error.exit_code is not None else ""
        rows.append(("error", f"[red]{escape(str(error.code))}[/]: {escape(error.message)}{exit_code}"))
    print_fields(rows)


def fmt_best(job: JobPublic) -> str:
    """The job's best checkpoint by its spec's eval.select: `step 20: qa/score 0.5 (the highest)`."""
    best, select = job.best_checkpoint, job.spec.eval.select
    if best is None:
        return "-"
    which = "" if select is None else f" (the {'highest' if select.mode == 'max' else 'lowest'})"
    return f"step {best.step}: {escape(best.metric)} {fmt_number(best.value)}{which}"


def print_fields(rows: list[tuple[str, str]]) -> None:
    """`key  value` rows: in a terminal, a long value folds under its column; elsewhere (a pipe, a file)
    each row is one line with no padding after its value."""
    if out.is_terminal:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in rows:
            table.add_row(key, value)
        out.print(table)
        return
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}", soft_wrap=True)


class EventPrinter:
    """Prints a job's new events on stderr from a thread of its own, while the log goes to stdout (so
    `ftq logs ID --follow > train.log` still writes the log alone)."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client, self.job_id = client, job_id
        self.seen = EventCount()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.print_new()  # what the job's end added

    def print_new(self) -> None:
        try:
            for event in self.client.jobs.iter_events(self.job_id, after=self.seen.after):
                err.print(escape(self.seen.line(event)), soft_wrap=True, highlight=False)
        except FtqClientError:
            return  # the log is what was asked for: a missed poll is shown at the next

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self.print_new()


@_command("usage")
def usage(
    since: Annotated[
        datetime | None, typer.Option("--from", help="Runs that ended at or after this UTC time.")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option("--to", help="Runs that ended before this UTC time.")
    ] = None,
    by_day: Annotated[bool, typer.Option("--by-day", help="One row per owner and day.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Device-seconds and GPU hours your runs used (GET /usage)."""
    since = since.replace(tzinfo=UTC) if since is not None and since.tzinfo is None else since
    until = until.replace(tzinfo=UTC) if until is not None and until.tzinfo is None else until
    with api() as client:
        page = client.usage(since=since, until=until, group_by="day" if by_day else "owner")
    if as_json:
        out.print_json(data=page.model_dump(mode="json"))
        return
    table = Table("owner", "day", "runs", "device-seconds", "GPU hours")
    for row in page.data:
        table.add_row(
            escape(row.owner),
            row.day or "-",
            str(row.jobs),
            f"{row.device_seconds:.0f}",
            f"{row.gpu_hours:.3f}",
        )
    out.print(table)


@_command("deployments")
def deployments(
    as_json: Annotated[bool, typer.Option("--json", help="Print the server's answer as JSON.")] = False,
) -> None:
    """Your serving engines (GET /deployments): base, status, devices, adapters, requests, tokens in/out,
    device time."""
    with api() as client:
        listing = client.deployments.list()
    if as_json:
        out.print_json(data=listing.model_dump(mode="json"))
        return
    if not listing.data:
        out.print("no deployments: a call to a model through /v1 starts its engine")
    else:
        table, beneath = deployments_table(listing.data, out.width)
        out.print(table)
        for line in beneath:
            out.print(line, soft_wrap=True)
    usage = serving_usage_line(listing)
    if usage:
        out.print(usage)


# `ftq deployments` fits 80 columns: the id, status, devices, adapters, requests, tokens and device time
# are whole, one space apart (two would leave the base too little room at 80), and the base takes the
# room that is left, cut with an ellipsis only where it must. Why a deployment waits (queued) or failed
# is a line under the table, whole (the terminal wraps it).
DEPLOY_BASE_MIN = 8


def deployments_table(found: list[Deployment], width: int) -> tuple[Table, list[str]]:
    """The table of `found` for a terminal `width` columns wide, and the lines to print under it."""
    fixed = {
        "ID": [d.id for d in found],
        "STATUS": [fmt_status(d.status) for d in found],
        "DEVICES": [f"{d.device} x{d.devices}" for d in found],
        "ADPT": [str(len(d.adapters)) for d in found],
        "REQS": [fmt_count(d.requests) for d in found],
        "IN/OUT": [f"{fmt_count(d.prompt_tokens)}/{fmt_count(d.completion_tokens)}" for d in found],
        "DEV-TIME": [fmt_duration(d.device_seconds) for d in found],
    }
    bases = [escape(d.base) for d in found]
    widths = {header: _cells_width(header, cells) for header, cells in fixed.items()}
    room = width - sum(widths.values()) - len(widths)  # one space between columns
    base_width = max(len("BASE"), DEPLOY_BASE_MIN, min(_cells_width("BASE", bases), room))
    table = Table(box=None, header_style="bold", pad_edge=False, collapse_padding=True)
    columns = {"ID": fixed["ID"], "BASE": bases, **{k: v for k, v in fixed.items() if k != "ID"}}
    for header in columns:
        justify: JustifyMethod = "right" if header in ("ADPT", "REQS", "IN/OUT", "DEV-TIME") else "left"
        size = base_width if header == "BASE" else widths[header]
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=size, justify=justify)
    for row in zip(*columns.values(), strict=True):
        table.add_row(*row)
    beneath = []
    for d in found:
        if d.status == "queued" and d.queue_reason:
            beneath.append(f"{d.id}: queued: {escape(d.queue_reason)}")
        elif d.status == "failed" and d.error:
            beneath.append(f"{d.id}: [red]failed[/]: {escape(d.error)}")
    return table, beneath


def serving_usage_line(listing: DeploymentList) -> str:
    """What every engine of the caller's answered since the API process started, or "" when nothing."""
    u = listing.usage
    if not u.requests:
        return ""
    since = datetime.fromtimestamp(u.since, UTC).strftime("%Y-%m-%d %H:%M UTC")
    requests = f"{u.requests} request" + ("" if u.requests == 1 else "s")
    return (
        f"since {since}: {requests}, {fmt_count(u.prompt_tokens)} tokens in, "
        f"{fmt_count(u.completion_tokens)} out"
    )


@_command("grade")
def grade(
    grader_file: Annotated[
        Path, typer.Argument(help="A grader, in OpenAI's grader JSON.", show_default=False)
    ],
    sample: Annotated[str, typer.Option("--sample", help="The model's answer to score (its text).")] = "",
    item_file: Annotated[
        Path | None, typer.Option("--item", help="The dataset row as a JSON object (item.* in templates).")
    ] = None,
    validate_only: Annotated[bool, typer.Option("--validate", help="Only check the grader.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the server's answer as JSON.")] = False,
) -> None:
    """Score one sample with a grader (POST /graders/run), or check it (--validate)."""
    grader_obj = _json_object(grader_file, "grader")
    item = _json_object(item_file, "--item") if item_file is not None else {}
    with api() as client:
        if validate_only:
            checked = client.graders.validate(grader_obj)
            if as_json:
                out.print_json(data=checked.model_dump(mode="json"))
            else:
                out.print("valid")
            return
        result = client.graders.run(grader_obj, sample, item)
    if as_json:
        out.print_json(data=result.model_dump(mode="json"))
    else:
        out.print(f"reward {result.reward:g}")
        for name, value in result.sub_rewards.items():
            out.print(f"  {escape(name)} {value:g}")
    if result.metadata.errors:
        err.print(escape(str(result.metadata.errors.get("message") or result.metadata.errors)))
        raise typer.Exit(1)


def _json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise typer.BadParameter(f"{what}: cannot read {path}: {e}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{what}: {path} holds no JSON object")
    return value


@_command("logs")
def logs(
    job_id: JobIdArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    show_events: Annotated[
        bool,
        typer.Option("--events/--no-events", help="With --follow, also print the job's events on stderr."),
    ] = True,
    raw: Annotated[
        bool,
        typer.Option("--raw", help="The file as it is, on a terminal too (piped, it always is)."),
    ] = False,
) -> None:
    """Print the job's train.log; with --follow, its events too (on stderr). On a terminal each line has a
    short prefix, as `submit --follow` prints it (the time, the level when not INFO); piped, or with
    --raw, the file as it is."""
    write = LogWriter(sys.stdout, short=not raw and sys.stdout.isatty())
    with api() as client:
        printer = EventPrinter(client, job_id) if follow and show_events else None
        if printer is not None:
            printer.start()
        try:
            for chunk in client.jobs.log_chunks(job_id, follow=follow, poll=POLL_SECONDS):
                write(chunk.text)
            write.end()
        finally:
            if printer is not None:
                printer.stop()


class LogWriter:
    """Writes a log's chunks as they come: as they are, or (`short`) in whole lines, each with the short
    prefix of `LogLines` (a line not yet ended waits for its end, or for `end()`)."""

    def __init__(self, stream: TextIO, *, short: bool) -> None:
        self.stream, self.short = stream, short
        self.lines = LogLines()
        self.partial = ""

    def __call__(self, text: str) -> None:
        if not text:
            return
        if self.short:
            lines = (self.partial + text).split("\n")
            self.partial = lines.pop()
            text = "".join(self.lines.short(line) + "\n" for line in lines)
        self.stream.write(text)
        self.stream.flush()

    def end(self) -> None:
        if self.partial:
            self.stream.write(self.lines.short(self.partial))
            self.stream.flush()
            self.partial = ""


@_command("events")
def events(
    job_id: JobIdArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event.")] = False,
) -> None:
    """Print the job's events (queued, started, checkpoint, eval, warning, the end), oldest first, numbered
    within the job (--json: the server's ids, the cursor of GET /jobs/{id}/events?after=)."""
    seen = EventCount()
    with api() as client:
        for event in client.jobs.iter_events(job_id, follow=follow, poll=POLL_SECONDS):
            if as_json:
                sys.stdout.write(event.model_dump_json() + "\n")
                sys.stdout.flush()
            else:
                out.print(escape(seen.line(event)), soft_wrap=True, highlight=False)


@_command("metrics")
def metrics(
    job_id: JobIdArg,
    tail: Annotated[int, typer.Option("--tail", min=0, help="Show only the last N rows (0: all).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the points as JSON.")] = False,
) -> None:
    """Show the job's metric points and a sparkline of its loss."""
    with api() as client:
        job = client.jobs.get(job_id)
        points = list(client.jobs.iter_metrics(job_id, page_size=10000))
    if as_json:
        out.print_json(data=[p.model_dump(mode="json") for p in points])
        return
    if not points:
        if job.status in TERMINAL:
            why = f": {escape(str(job.error.code))}: {escape(job.error.message)}" if job.error else ""
            out.print(f"{job_id} ({fmt_status(job.status)}) logged no metrics{why}", soft_wrap=True)
        else:
            out.print(f"{job_id} ({fmt_status(job.status)}) has logged no metrics yet")
        return
    shown = points[-tail:] if tail else points
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("STEP", "EPOCH", "LOSS", "EVAL LOSS", "LR", "GRAD NORM", "TOK/S"):
        table.add_column(name, justify="right", no_wrap=True)
    for p in shown:
        table.add_row(
            str(p.step),
            fmt_fixed(p.epoch, 2),
            fmt_loss(p.loss),
            fmt_loss(p.eval_loss),
            fmt_sci(p.learning_rate),
            fmt_fixed(p.grad_norm, 3),
            fmt_fixed(p.tokens_per_second, 0),
        )
    out.print(table)
    for label, values in (
        ("loss", [p.loss for p in points if p.loss is not None]),
        ("eval", [p.eval_loss for p in points if p.eval_loss is not None]),
    ):
        if values:
            first, last = fmt_loss(values[0]), fmt_loss(values[-1])
            out.print(f"{label:<5} {sparkline(values)}  {first} → {last}  ({len(values)} points)")


@_command("samples")
def samples(
    job_id: JobIdArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new samples until the job ends.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print each sample as one JSON line.")] = False,
) -> None:
    """Show the completions of the spec's eval.sample_prompts, step by step."""
    with api() as client:
        shown_step: int | None = None
        count = 0
        for sample in client.jobs.iter_samples(job_id, follow=follow, poll=POLL_SECONDS):
            count += 1
            if as_json:
                sys.stdout.write(sample.model_dump_json() + "\n")
                sys.stdout.flush()
                continue
            if sample.step != shown_step:
                out.print(f"[bold]step {sample.step}[/]")
                shown_step = sample.step
            out.print(f"  [dim]\\[{sample.index}] {escape(sample.prompt)}[/]", soft_wrap=True)
            out.print(f"      {escape(sample.completion) or '[dim](empty)[/]'}", soft_wrap=True)
        if count == 0 and not as_json:
            job = client.jobs.get(job_id)
            if not job.spec.eval.sample_prompts:
                out.print(f"{job_id} has no eval.sample_prompts in its spec: it writes no samples")
            elif job.status in TERMINAL:
                out.print(f"{job_id} ({fmt_status(job.status)}) wrote no samples")
            else:
                out.print(f"{job_id} ({fmt_status(job.status)}) has written no samples yet")


@_command("cancel")
def cancel(job_id: JobIdArg) -> None:
    """Cancel a job (a finished job stays as it is)."""
    with api() as client:
        job = client.jobs.cancel(job_id)
    out.print(f"{job.id}: {fmt_status(job.status)}")


@_command("pause")
def pause(job_id: JobIdArg) -> None:
    """Pause a job: a queued one is held; a running one saves a checkpoint, ends its processes and frees
    its devices (`ftq resume` continues it from there)."""
    with api() as client:
        job = client.jobs.pause(job_id)
    pausing = job.status != "paused"
    out.print(f"{job.id}: {fmt_status(job.status)}" + (" (pausing: saving a checkpoint)" if pausing else ""))


@_command("resume")
def resume(job_id: JobIdArg) -> None:
    """Resume a paused job: it is queued again and continues from its newest checkpoint."""
    with api() as client:
        job = client.jobs.resume(job_id)
    out.print(f"{job.id}: {fmt_status(job.status)}")


# Evaluations -------------------------------------------------------------------------------------------


def _checkpoint_ref(text: str) -> str | int:
    if text in ("final", "best"):
        return text
    if not text.isdigit():
        fail(f"--checkpoint {text!r}: say final, best or a step (e.g. 20)", EXIT_INPUT)
    return int(text)


def _side_run_line(row: ExportPublic | EvaluationPublic, what: str) -> str:
    """One line about a side run: its id, status, `what` it is, and its error if it failed."""
    line = f"{row.id}: {fmt_status(row.status)} {what}"
    if row.error is not None:
        line += f" [red]{escape(str(row.error.code))}[/]: {escape(row.error.message)}"
    return line


def _evaluation_line(ev: EvaluationPublic) -> str:
    """An evaluation's line, then one line per metric (`  qa/score  0.5`): short enough for 80 columns."""
    what = "final/" if ev.checkpoint == "final" else f"checkpoint {ev.checkpoint}"
    lines = [_side_run_line(ev, what)]
    results = sorted((ev.results or {}).items())
    width = max((len(k) for k, _ in results), default=0)
    lines += [f"  {escape(k.ljust(width))}  {fmt_number(v)}" for k, v in results]
    return "\n".join(lines)


@_command("eval")
def evaluate(
    job_id: JobIdArg,
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="final, best (by the spec's eval.select) or a step.")
    ] = "final",
    suite: Annotated[
        list[str] | None,
        typer.Option("--suite", help="A suite of the spec's eval.suites (repeat); all by default."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Wait until it ends and print its results.")
    ] = False,
) -> None:
    """Evaluate a job's checkpoint with its spec's suites (a run of its own); --follow prints the metrics."""
    with api() as client:
        made = client.jobs.evaluate(job_id, _checkpoint_ref(checkpoint), suites=suite or None)
        out.print(_evaluation_line(made))
        if not follow:
            return
        made = follow_side_run(lambda i: client.jobs.get_evaluation(job_id, i), made, _evaluation_line)
    if made.status != "succeeded":
        raise typer.Exit(EXIT_REFUSED)


@_command("evals")
def evals(
    job_id: JobIdArg,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Wait until the job and every evaluation of it ended, printing each change.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """List a job's evaluations, newest first, with their metrics. With --follow, exit 1 when one failed."""
    if follow and as_json:
        fail("--follow prints lines as they change; --json prints the list once: choose one", EXIT_INPUT)
    with api() as client:
        if follow:
            found = follow_evaluations(client, job_id)
            if any(ev.status != "succeeded" for ev in found):
                raise typer.Exit(EXIT_REFUSED)
            return
        found = client.jobs.evaluations(job_id)
    if as_json:
        out.print_json(data=[ev.model_dump(mode="json") for ev in found])
        return
    if not found:
        out.print(f"no evaluations of {job_id}")
        return
    for ev in found:
        out.print(_evaluation_line(ev), soft_wrap=True)


# A succeeded job's final/ is evaluated once the worker's next sweep queues it (seconds): `evals --follow`
# waits this long after the job's end for it to appear.
FINAL_EVALUATION_WAIT_SECONDS = 300.0


def final_evaluation_due(job: JobPublic, found: list[EvaluationPublic]) -> bool:
    """Whether the evaluation of final/ that a succeeded job with suites gets is not queued yet."""
    if job.status != "succeeded" or not job.spec.eval.suites or job.finished_at is None:
        return False
    if any(ev.trigger == "final" for ev in found):
        return False
    return _age_seconds(job.finished_at) < FINAL_EVALUATION_WAIT_SECONDS


def follow_evaluations(client: Client, job_id: str) -> list[EvaluationPublic]:
    """Print a job's evaluations, oldest first, and each one again when its status changes, until the job
    ended and every evaluation of it did (with final/'s, for a succeeded job); returns the last list."""
    printed: dict[str, str] = {}
    patience = Patience()
    while True:
        try:
            job = client.jobs.get(job_id)
            found = client.jobs.evaluations(job_id)
        except TRANSIENT as exc:
            patience.failed(exc)
            time.sleep(POLL_SECONDS)
            continue
        patience.answered()
        for ev in reversed(found):
            if printed.get(ev.id) != ev.status:
                out.print(_evaluation_line(ev), soft_wrap=True)
                printed[ev.id] = ev.status
        ended = job.status in TERMINAL and all(ev.status in TERMINAL for ev in found)
        if ended and not final_evaluation_due(job, found):
            if not found:
                out.print(f"no evaluations of {job_id}")
            return found
        time.sleep(POLL_SECONDS)


# Exports -----------------------------------------------------------------------------------------------


def _export_line(export: ExportPublic) -> str:
    return _side_run_line(export, f"{export.kind} {export.dtype} -> {export.path}")


@_command("export")
def export(
    job_id: JobIdArg,
    merged: Annotated[bool, typer.Option("--merged", help="The adapter merged into the base model.")] = False,
    adapter: Annotated[bool, typer.Option("--adapter", help="The LoRA adapter alone.")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    max_shard_size: Annotated[
        str | None, typer.Option("--max-shard-size", help="Largest safetensors shard, e.g. 2GB.")
    ] = None,
    push_to_hub: Annotated[
        str | None, typer.Option("--push-to-hub", help="Also push to this Hub repo (private).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Wait until it ends, showing its status.")
    ] = False,
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="final, best (by the spec's eval.select) or a step.")
    ] = "final",
) -> None:
    """Export a succeeded job's model: --merged (a full model) or --adapter, in --dtype."""
    if merged == adapter:
        fail("say what to export: --merged or --adapter", EXIT_INPUT)
    kind = "merged" if merged else "adapter"
    with api() as client:
        made = client.jobs.export(
            job_id,
            kind,
            dtype,
            max_shard_size=max_shard_size,
            push_to_hub=push_to_hub,
            checkpoint=_checkpoint_ref(checkpoint),
        )
        out.print(_export_line(made))
        if not follow:
            return
        made = follow_export(client, job_id, made)
    if made.status != "succeeded":
        raise typer.Exit(EXIT_REFUSED)
    out.print(f"download it with: ftq download {job_id} {made.path}")


def follow_export(client: Client, job_id: str, made: ExportPublic) -> ExportPublic:
    """Poll an export until it ends, printing each status it passes through; returns its last state."""
    return follow_side_run(lambda export_id: client.jobs.get_export(job_id, export_id), made, _export_line)


SideRun = TypeVar("SideRun", ExportPublic, EvaluationPublic)


def follow_side_run(get: Callable[[str], SideRun], made: SideRun, line: Callable[[SideRun], str]) -> SideRun:
    """Poll a side run (`get` reads it by id) until it ends, printing its `line` at each status it passes
    through; outages are waited out (`Patience`). Returns its last state."""
    last = made.status
    patience = Patience()
    while made.status not in TERMINAL:
        time.sleep(POLL_SECONDS)
        try:
            made = get(made.id)
        except TRANSIENT as exc:
            patience.failed(exc)
            continue
        patience.answered()
        if made.status != last:
            out.print(line(made))
            last = made.status
    return made


@_command("exports")
def exports(job_id: JobIdArg) -> None:
    """List a job's exports, newest first."""
    with api() as client:
        found = client.jobs.exports(job_id)
    if not found:
        out.print(f"no exports of {job_id}")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("ID", "STATUS", "KIND", "DTYPE", "CREATED"):
        table.add_column(name, no_wrap=True)
    # Why a failed export failed, at a glance (the whole message: `ftq export` or the API).
    table.add_column("ERROR", no_wrap=True, overflow="ellipsis", max_width=50)
    for e in found:
        table.add_row(
            e.id,
            fmt_status(e.status),
            str(e.kind),
            str(e.dtype),
            fmt_age(e.created_at),
            f"[red]{escape(str(e.error.code))}[/]: {escape(e.error.message)}" if e.error else "",
        )
    out.print(table)


# The hash `ftq artifacts` shows: as many hex digits as `git log --oneline` shows of a commit.
SHORT_HASH = 12


@_command("artifacts")
def artifacts(
    job_id: JobIdArg,
    full_hash: Annotated[
        bool,
        typer.Option(
            "--full-hash", help="Each file's whole sha256 and its path, one a line, as sha256sum prints them."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """List the files of a job's run you can download (final/, checkpoints, exports, logs)."""
    with api() as client:
        listed = client.jobs.artifacts(job_id)
    if as_json:
        out.print_json(data=[a.model_dump(mode="json") for a in listed])
        return
    if not listed:
        out.print(f"{job_id} has no artifacts yet")
        return
    if full_hash:
        for a in listed:
            out.print(f"{a.sha256 or '(hashing)'}  {escape(a.path)}", soft_wrap=True)
        return
    paths = max(cell_len(a.path) for a in listed)
    kinds = max(len("KIND"), *(len(a.kind) for a in listed))
    sizes = max(len("SIZE"), *(len(fmt_bytes(a.size)) for a in listed))
    hashes = max(len("SHA256"), *(len(_short_hash(a.sha256)) for a in listed))
    # A path is what `ftq download ID PATH` takes: whole, on one line. The kind gives way where the
    # terminal is too narrow for all four columns (its folder says most of it; --json has it).
    with_kind = paths + kinds + sizes + hashes + 3 * LS_GAP <= out.width
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, LS_GAP // 2))
    table.add_column("PATH", no_wrap=True, min_width=paths)
    if with_kind:
        table.add_column("KIND", no_wrap=True)
    table.add_column("SIZE", no_wrap=True, justify="right")
    table.add_column("SHA256", no_wrap=True)
    for a in listed:
        kind = [a.kind] if with_kind else []
        table.add_row(escape(a.path), *kind, fmt_bytes(a.size), _short_hash(a.sha256))
    out.print(table)
    out.print(f"download: ftq download {job_id} final\n      or: ftq download {job_id} PATH --out DIR")


def _short_hash(sha256: str | None) -> str:
    return sha256[:SHORT_HASH] if sha256 else "(hashing)"


@_command("download")
def download(
    job_id: JobIdArg,
    path: Annotated[
        str,
        typer.Argument(
            help="An artifact file, or a folder (final, checkpoints/checkpoint-20, exports/ID) fetched "
            "file by file into DIR/<folder name>/."
        ),
    ] = "final",
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder to write into.")] = Path("."),
) -> None:
    """Download a job's artifact or folder, resuming an interrupted download, checking each sha256."""
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    ]
    # The bar starts with the first bytes, so a refusal (404, 401) stays one line on stderr.
    bar = Progress(*columns, console=err, transient=False)
    task: TaskID | None = None

    def progress(n: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task(f"{job_id}/{path}", total=total)
        bar.update(task, advance=n)

    with api() as client:
        try:
            files = client.jobs.download(job_id, path, out_dir, progress=progress)
        finally:
            if task is not None:
                bar.stop()
    for f in files:
        resumed = f" (resumed at {fmt_bytes(f.resumed_from)})" if f.resumed_from else ""
        check = (
            "sha256 ok" if f.verified else "[yellow]sha256 not yet computed by the server: not verified[/]"
        )
        out.print(f"{escape(str(f.path))}  {fmt_bytes(f.artifact.size)}  {check}{resumed}")
