"""Client commands of `ftq`: submit, ls, status, logs, metrics, cancel.

They talk to the API over HTTP only (httpx), at `FTQ_URL` (default http://127.0.0.1:8000), sending
`FTQ_TOKEN` as a bearer token when it is set. Every expected failure (server down, 401, 404, a 422 on
a spec field, a missing or unparsable file) is one line on stderr and a non-zero exit, never a traceback:

    exit 0  done (for `submit --follow`: the job succeeded)
    exit 1  the server refused the request, or the followed job failed or was cancelled
    exit 2  the local input is wrong (missing file, bad YAML/JSON)
    exit 3  the server cannot be reached
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

client_app = typer.Typer(add_completion=False)

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")
STATUS_STYLE = {
    "queued": "cyan",
    "starting": "cyan",
    "running": "blue",
    "cancelling": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
}
SPARK = "▁▂▃▄▅▆▇█"
POLL_SECONDS = 1.0

EXIT_REFUSED = 1
EXIT_INPUT = 2
EXIT_UNREACHABLE = 3

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

P = ParamSpec("P")
R = TypeVar("R")


class ClientError(Exception):
    """An expected failure: `message` is the one line the user sees."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def _fail(message: str, exit_code: int = EXIT_REFUSED) -> NoReturn:
    raise ClientError(message, exit_code)


def _one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every failure into one line on stderr and an exit code (FTQ_DEBUG=1 keeps tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ClientError as exc:
            err.print(f"ftq: {escape(exc.message)}", soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("ftq: interrupted", soft_wrap=True)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if os.environ.get("FTQ_DEBUG"):
                raise
            err.print(
                f"ftq: unexpected error: {escape(type(exc).__name__)}: {escape(str(exc))} "
                "(FTQ_DEBUG=1 shows the traceback)",
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_REFUSED) from None

    return wrapper


# HTTP -------------------------------------------------------------------------------------------------


class Api:
    """A thin client over the ftq HTTP API that turns failures into `ClientError`s."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = (url or os.environ.get("FTQ_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("FTQ_TOKEN", "")
        headers = {"User-Agent": "ftq-cli", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        except (httpx.InvalidURL, ValueError) as exc:
            _fail(f"FTQ_URL {self.url!r} is not a valid URL: {exc}", EXIT_INPUT)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.UnsupportedProtocol:
            _fail(f"FTQ_URL {self.url!r} is not an http(s) URL", EXIT_INPUT)
        except httpx.ConnectError as exc:
            reason = str(exc).split("] ")[-1] or "connection refused"
            _fail(
                f"cannot reach the ftq server at {self.url} ({reason}); "
                "start it with `ftq up` or set FTQ_URL",
                EXIT_UNREACHABLE,
            )
        except httpx.TimeoutException:
            _fail(f"the ftq server at {self.url} did not answer in time", EXIT_UNREACHABLE)
        except httpx.HTTPError as exc:
            _fail(f"request to {self.url}{path} failed: {exc}", EXIT_UNREACHABLE)
        if resp.status_code >= 400:
            _fail(describe_error(resp))
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            _fail(
                f"the server at {self.url} answered {resp.status_code} with a body that is not JSON; "
                "is FTQ_URL an ftq server?"
            )

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)


def describe_error(resp: httpx.Response) -> str:
    """One line for an error response: the status, and the failing field's path for a 422."""
    status = resp.status_code
    try:
        body = resp.json()
    except ValueError:
        text = " ".join(resp.text.split())[:200]
        return f"server answered {status} {resp.reason_phrase}" + (f": {text}" if text else "")
    detail = body.get("detail") if isinstance(body, dict) else body
    if status == 401:
        hint = "set FTQ_TOKEN" if not os.environ.get("FTQ_TOKEN") else "check FTQ_TOKEN"
        return f"unauthorized (401): {detail or 'missing or invalid bearer token'}; {hint}"
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if not isinstance(item, dict):
                parts.append(str(item))
                continue
            loc = [str(p) for p in item.get("loc", [])]
            if loc and loc[0] == "body":
                loc = loc[1:]
            where = ".".join(loc) if loc else "spec"
            parts.append(f"{where}: {item.get('msg', 'invalid')}")
        label = "invalid spec" if status == 422 else f"request refused ({status})"
        return f"{label}: " + "; ".join(parts)
    if status == 404:
        return f"not found (404): {detail}"
    retry = resp.headers.get("Retry-After")
    suffix = f" (retry after {retry}s)" if retry and status in (429, 503) else ""
    return f"server answered {status}: {detail}{suffix}"


# Reading a spec file -------------------------------------------------------------------------------------


def read_spec_file(path: Path) -> tuple[str, str]:
    """The file's text and the content type to send it as; checks locally that it parses."""
    if not path.exists():
        _fail(f"{path}: no such file", EXIT_INPUT)
    if path.is_dir():
        _fail(f"{path}: is a directory, not a job spec file", EXIT_INPUT)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"{path}: cannot read it: {exc}", EXIT_INPUT)
    if path.suffix.lower() == ".json":
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            _fail(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", EXIT_INPUT)
        ctype = "application/json"
    else:
        # YAML is a superset of JSON, so any other name is read as YAML.
        try:
            body = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            _fail(f"{path}: not valid YAML: {problem}{where}", EXIT_INPUT)
        ctype = "application/yaml"
    if not isinstance(body, dict):
        _fail(
            f"{path}: a job spec is a mapping (name:, model:, dataset:, ...), not a {type(body).__name__}",
            EXIT_INPUT,
        )
    return text, ctype


# Formatting --------------------------------------------------------------------------------------------


def sparkline(values: list[float], width: int = 60) -> str:
    """A unicode sparkline, averaging values into at most `width` buckets."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [
            sum(chunk) / len(chunk)
            for i in range(width)
            if (chunk := values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)])
        ]
    lo, hi = min(values), max(values)
    span = hi - lo
    if span == 0:
        return SPARK[3] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))] for v in values)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def fmt_num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.2e}"
    return f"{value:.{digits}g}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def fmt_age(value: str | None) -> str:
    when = _parse_time(value)
    if when is None:
        return "-"
    return fmt_duration((datetime.now(UTC) - when).total_seconds()) + " ago"


def fmt_status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def fmt_progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    step, max_steps = progress.get("step"), progress.get("max_steps")
    if step is None:
        return "-" if max_steps is None else f"0/{max_steps}"
    if max_steps:
        return f"{step}/{max_steps} ({100 * step / max_steps:.0f}%)"
    return str(step)


# Commands ----------------------------------------------------------------------------------------------


def _command(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def register(fn: Callable[P, R]) -> Callable[P, R]:
        wrapped = _one_line_errors(fn)
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
) -> None:
    """Submit a job spec. With --follow, exit 0 when the job succeeds and 1 when it fails or is cancelled."""
    text, ctype = read_spec_file(file)
    api = Api()
    headers = {"Content-Type": ctype}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    if dry_run:
        plan = api.post("/jobs", params={"dry_run": "true"}, content=text.encode(), headers=headers)
        print_plan(plan)
        return
    job = api.post("/jobs", content=text.encode(), headers=headers)
    out.print(f"submitted {job['id']} ({escape(job['name'])}): {fmt_status(job['status'])}")
    if follow:
        try:
            code = follow_job(api, job["id"])
        except KeyboardInterrupt:
            # Following is only watching: the job goes on, and the user should know how to stop it.
            _fail(f"stopped following {job['id']}; it keeps running (`ftq cancel {job['id']}` stops it)", 130)
        raise typer.Exit(code)
    out.print(f"follow it with: ftq status {job['id']}  |  ftq logs {job['id']} --follow")


def print_plan(plan: dict[str, Any]) -> None:
    out.rule("accelerate config (accelerate_config.yaml)")
    out.print(escape(plan.get("accelerate_config_yaml", "").rstrip()), soft_wrap=True)
    out.rule("command")
    out.print(escape(shlex.join(plan.get("command") or [])), soft_wrap=True)
    if plan.get("sbatch_script"):
        out.rule("sbatch script (job.sbatch)")
        out.print(escape(plan["sbatch_script"].rstrip()), soft_wrap=True)
    elif plan.get("launch_script"):
        out.rule("launch script (launch.sh)")
        out.print(escape(plan["launch_script"].rstrip()), soft_wrap=True)
    out.rule("memory estimate")
    estimate = plan.get("estimate") or {}
    if estimate.get("per_device_bytes") is None:
        reason = estimate.get("reason") or "the model config could not be read"
        out.print(f"no estimate: {escape(str(reason))}")
        return
    fits = estimate.get("fits")
    verdict = "[green]fits[/]" if fits else "[red]does not fit[/]" if fits is False else "unknown"
    out.print(
        f"per device: {fmt_bytes(estimate['per_device_bytes'])} of "
        f"{fmt_bytes(estimate.get('device_memory_bytes'))}: {verdict}"
    )
    for key, value in (estimate.get("breakdown") or {}).items():
        # The breakdown's numbers are bytes (params, grads, optimizer, activations, ...).
        shown = fmt_bytes(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
        out.print(f"  {escape(str(key))}: {escape(str(shown))}")


def _read_logs(api: Api, job_id: str, offset: int) -> Iterator[dict[str, Any]]:
    """Chunks of train.log from `offset` until nothing more is there now."""
    while True:
        chunk = api.get(f"/jobs/{job_id}/logs", offset=offset, limit=262144)
        yield chunk
        if not chunk["text"] or chunk["next_offset"] == offset:
            return
        offset = chunk["next_offset"]


def follow_job(api: Api, job_id: str) -> int:
    """Progress bar, streamed log and final status of a job; returns the exit code."""
    offset = 0
    partial = ""
    last_status: str | None = None
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("step {task.completed:.0f}/{task.fields[max_steps]}"),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("lr {task.fields[lr]}"),
        TextColumn("eta {task.fields[eta]}"),
    ]
    with Progress(*columns, console=out, transient=False, refresh_per_second=4) as bar:
        task = bar.add_task(job_id, total=None, max_steps="?", loss="-", lr="-", eta="-")
        while True:
            job = api.get(f"/jobs/{job_id}")
            status = job["status"]
            if status != last_status:
                bar.console.print(f"{job_id}: {fmt_status(status)}")
                last_status = status
            complete = False
            for chunk in _read_logs(api, job_id, offset):
                offset = chunk["next_offset"]
                complete = chunk["complete"]
                # Print whole lines only, so the bar never splits a line of the log.
                lines = (partial + chunk["text"]).split("\n")
                partial = lines.pop()
                for line in lines:
                    bar.console.print(escape(line), soft_wrap=True, highlight=False)
            progress = job.get("progress") or {}
            latest = job.get("latest_metrics") or {}
            bar.update(
                task,
                completed=progress.get("step") or 0,
                total=progress.get("max_steps"),
                max_steps=progress.get("max_steps") or "?",
                loss=fmt_num(latest.get("loss")),
                lr=fmt_num(latest.get("learning_rate")),
                eta=fmt_duration(progress.get("eta_seconds")) if status == "running" else "-",
            )
            if status in TERMINAL and complete:
                break
            time.sleep(POLL_SECONDS)
        if partial:
            bar.console.print(escape(partial), soft_wrap=True, highlight=False)
    return report_end(job)


def report_end(job: dict[str, Any]) -> int:
    status = job["status"]
    latest = job.get("latest_metrics") or {}
    progress = job.get("progress") or {}
    if status == "succeeded":
        loss = f", final loss {fmt_num(latest.get('loss'))}" if latest.get("loss") is not None else ""
        out.print(f"{job['id']} [green]succeeded[/] at step {progress.get('step') or '-'}{loss}")
        return 0
    error = job.get("error") or {}
    code = error.get("code") or status
    message = error.get("message") or ""
    exit_code = error.get("exit_code")
    detail = f" (exit code {exit_code})" if exit_code is not None else ""
    err.print(f"ftq: {job['id']} {status}: {escape(code)}: {escape(message)}{detail}", soft_wrap=True)
    return EXIT_REFUSED


@_command("ls")
def ls(
    status: Annotated[
        str | None, typer.Option("--status", help="Comma-separated, e.g. queued,running")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="Most jobs to show.")] = 20,
) -> None:
    """List jobs, newest first."""
    page = Api().get("/jobs", status=status, limit=limit)
    jobs = page["data"]
    if not jobs:
        out.print("no jobs" + (f" with status {status}" if status else ""))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("ID", no_wrap=True)
    table.add_column("NAME", no_wrap=True, overflow="ellipsis", max_width=28)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("PROGRESS", no_wrap=True)
    table.add_column("LOSS", no_wrap=True, justify="right")
    table.add_column("CREATED", no_wrap=True)
    for job in jobs:
        latest = job.get("latest_metrics") or {}
        table.add_row(
            job["id"],
            escape(job["name"]),
            fmt_status(job["status"]),
            fmt_progress(job),
            fmt_num(latest.get("loss")),
            fmt_age(job.get("created_at")),
        )
    out.print(table)
    if page.get("next_cursor"):
        out.print(f"(more than {limit}; use --limit)")


@_command("status")
def status(
    job_id: JobIdArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Job as JSON.")] = False,
) -> None:
    """Show one job."""
    job = Api().get(f"/jobs/{job_id}")
    if as_json:
        out.print_json(data=job)
        return
    progress = job.get("progress") or {}
    latest = job.get("latest_metrics") or {}
    spec = job.get("spec") or {}
    external = f" ({escape(str(job['external_id']))})" if job.get("external_id") else ""
    rows: list[tuple[str, str]] = [
        ("id", job["id"]),
        ("name", escape(job["name"])),
        ("owner", escape(job["owner"])),
        ("status", fmt_status(job["status"])),
        ("model", escape(str((spec.get("model") or {}).get("name_or_path", "-")))),
        ("dataset", escape(str((spec.get("dataset") or {}).get("name_or_path", "-")))),
        ("launcher", job["launcher"] + external),
        ("created", f"{job['created_at']} ({fmt_age(job['created_at'])})"),
        ("started", job.get("started_at") or "-"),
        ("finished", job.get("finished_at") or "-"),
        ("progress", fmt_progress(job)),
        ("epoch", fmt_num(progress.get("epoch"), 3)),
        ("eta", fmt_duration(progress.get("eta_seconds")) if job["status"] == "running" else "-"),
        ("loss", fmt_num(latest.get("loss"))),
        ("eval loss", fmt_num(latest.get("eval_loss"))),
        ("learning rate", fmt_num(latest.get("learning_rate"))),
    ]
    error = job.get("error")
    if error:
        exit_code = f" (exit code {error['exit_code']})" if error.get("exit_code") is not None else ""
        rows.append(("error", f"[red]{escape(error['code'])}[/]: {escape(error['message'])}{exit_code}"))
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)


@_command("logs")
def logs(
    job_id: JobIdArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
) -> None:
    """Print the job's train.log."""
    api = Api()
    offset = 0
    while True:
        complete = False
        for chunk in _read_logs(api, job_id, offset):
            offset = chunk["next_offset"]
            complete = chunk["complete"]
            if chunk["text"]:
                sys.stdout.write(chunk["text"])
                sys.stdout.flush()
        if not follow or complete:
            return
        time.sleep(POLL_SECONDS)


def fetch_all_metrics(api: Api, job_id: str) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    after = -1
    while True:
        page = api.get(f"/jobs/{job_id}/metrics", after_step=after, limit=10000)
        points.extend(page["data"])
        if not page["data"] or page["next_after_step"] == after:
            return points
        after = page["next_after_step"]


@_command("metrics")
def metrics(
    job_id: JobIdArg,
    tail: Annotated[int, typer.Option("--tail", min=0, help="Show only the last N rows (0: all).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the points as JSON.")] = False,
) -> None:
    """Show the job's metric points and a sparkline of its loss."""
    api = Api()
    job = api.get(f"/jobs/{job_id}")
    points = fetch_all_metrics(api, job_id)
    if as_json:
        out.print_json(data=points)
        return
    if not points:
        out.print(f"{job_id} ({fmt_status(job['status'])}) has logged no metrics yet")
        return
    shown = points[-tail:] if tail else points
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("STEP", "EPOCH", "LOSS", "EVAL LOSS", "LR", "GRAD NORM", "TOK/S"):
        table.add_column(name, justify="right", no_wrap=True)
    for p in shown:
        table.add_row(
            str(p["step"]),
            fmt_num(p.get("epoch"), 3),
            fmt_num(p.get("loss")),
            fmt_num(p.get("eval_loss")),
            fmt_num(p.get("learning_rate")),
            fmt_num(p.get("grad_norm")),
            fmt_num(p.get("tokens_per_second"), 5),
        )
    out.print(table)
    for label, field in (("loss", "loss"), ("eval", "eval_loss")):
        values = [p[field] for p in points if p.get(field) is not None]
        if values:
            first, last = fmt_num(values[0]), fmt_num(values[-1])
            out.print(f"{label:<5} {sparkline(values)}  {first} → {last}  ({len(values)} points)")


@_command("cancel")
def cancel(job_id: JobIdArg) -> None:
    """Cancel a job (a finished job stays as it is)."""
    job = Api().post(f"/jobs/{job_id}/cancel")
    out.print(f"{job['id']}: {fmt_status(job['status'])}")
