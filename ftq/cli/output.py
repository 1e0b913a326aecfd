"""What the `ftq` client commands print and how they exit: the consoles, the exit codes, one line on
stderr for every expected failure (never a traceback), and the formats of numbers, times and statuses.
Shared by `ftq.cli.client` and `ftq.cli.files`."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from pydantic import TypeAdapter
from rich.console import Console
from rich.markup import escape

from ftq.client import (
    OUTAGE_ERRORS,
    OUTAGE_PATIENCE_SECONDS,
    ChecksumMismatch,
    Client,
    ConnectionFailed,
    ConnectionLost,
    Event,
    FtqAPIError,
    FtqClientError,
    InvalidURL,
    JobPublic,
    ServerTimeout,
    SpecFileError,
    UnexpectedResponse,
)
from ftq.client._core import Outage

TERMINAL = ("succeeded", "failed", "cancelled")
STATUS_STYLE = {
    "queued": "cyan",
    "starting": "cyan",
    "running": "blue",
    "cancelling": "yellow",
    "paused": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    # A deployment's (GET /deployments) besides those above.
    "ready": "green",
    "stopping": "yellow",
    "stopped": "dim",
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


def fail(message: str, exit_code: int = EXIT_REFUSED) -> NoReturn:
    raise ClientError(message, exit_code)


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every failure into one line on stderr and an exit code (FTQ_DEBUG=1 keeps tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ClientError as exc:
            err.print(f"ftq: {escape(exc.message)}", soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except FtqClientError as exc:
            message, exit_code = describe_failure(exc)
            err.print(f"ftq: {escape(message)}", soft_wrap=True)
            raise typer.Exit(exit_code) from None
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


def api() -> Client:
    """The SDK client for FTQ_URL and FTQ_TOKEN; every HTTP call of these commands goes through it."""
    return Client(headers={"User-Agent": "ftq-cli"})


def describe_failure(exc: FtqClientError) -> tuple[str, int]:
    """The one line and the exit code for an SDK error."""
    if isinstance(exc, SpecFileError):
        return str(exc), EXIT_INPUT
    if isinstance(exc, ChecksumMismatch):
        return f"{exc}; the partial file was removed, run the download again", EXIT_REFUSED
    if isinstance(exc, InvalidURL):
        # An FTQ_PORT that is not a port names itself; anything else came from FTQ_URL.
        if exc.url.startswith("FTQ_PORT="):
            return f"{exc.url} {exc.reason}", EXIT_INPUT
        return f"FTQ_URL {exc.url!r} {exc.reason}", EXIT_INPUT
    if isinstance(exc, ServerTimeout):
        return f"the ftq server at {exc.url} did not answer in time", EXIT_UNREACHABLE
    if isinstance(exc, ConnectionLost):
        return f"request to {exc.url}{exc.path} failed: {exc.reason}", EXIT_UNREACHABLE
    if isinstance(exc, ConnectionFailed):
        return (
            f"cannot reach the ftq server at {exc.url} ({exc.reason}); "
            "start it with `ftq up` or set FTQ_URL or FTQ_PORT",
            EXIT_UNREACHABLE,
        )
    if isinstance(exc, UnexpectedResponse):
        return f"{exc}; is FTQ_URL an ftq server?", EXIT_REFUSED
    if isinstance(exc, FtqAPIError):
        return describe_error(exc), EXIT_REFUSED
    return str(exc), EXIT_REFUSED


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def describe_error(exc: FtqAPIError) -> str:
    """One line for an error answer: the status, and the failing field's path for a 422."""
    status = exc.status_code
    if exc.body is None:  # not JSON: a proxy's page, say
        return f"server answered {status} {_phrase(status)}" + (f": {exc.detail}" if exc.detail else "")
    if status == 401:
        hint = "set FTQ_TOKEN" if not os.environ.get("FTQ_TOKEN") else "check FTQ_TOKEN"
        return f"unauthorized (401): {exc.detail or 'missing or invalid bearer token'}; {hint}"
    if exc.errors:
        label = "invalid spec" if status == 422 else f"request refused ({status})"
        return f"{label}: " + "; ".join(f"{e.field or 'spec'}: {e.msg}" for e in exc.errors)
    if status == 404:
        return f"not found (404): {exc.detail}"
    suffix = ""
    if status in (429, 503) and exc.retry_after is not None:
        suffix = f" (retry after {exc.retry_after:g}s)"
    return f"server answered {status}: {exc.detail}{suffix}"


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


def fmt_fixed(value: float | None, decimals: int) -> str:
    """A column's numbers with one number of decimals, so they line up and read the same."""
    return "-" if value is None else f"{value:,.{decimals}f}"


def fmt_sci(value: float | None) -> str:
    """Learning rates, always in scientific form: 1.00e-03, never 0.001 in one row and 2.0e-04 below."""
    return "-" if value is None else f"{value:.2e}"


def fmt_loss(value: float | None) -> str:
    return fmt_fixed(value, 4)


def fmt_count(n: int | None) -> str:
    """A count short enough for a narrow column: 999, 1.2k, 12k, 1.2M (`--json` has every digit)."""
    if n is None:
        return "-"
    if abs(n) < 1000:
        return str(n)
    value = float(n)
    for unit in ("k", "M", "G", "T"):
        value /= 1000
        if abs(value) < 9.95:
            return f"{value:.1f}{unit}"
        if abs(value) < 999.5:
            return f"{value:.0f}{unit}"
    return f"{value:.0f}T"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


_TIME = TypeAdapter(datetime)


def fmt_time(value: datetime | None) -> str:
    """A time as the API writes it in JSON (ISO 8601), so `ftq status` shows what curl shows."""
    return _TIME.dump_python(value, mode="json") if value is not None else "-"


def fmt_age(value: datetime | None) -> str:
    if value is None:
        return "-"
    when = value if value.tzinfo else value.replace(tzinfo=UTC)  # the store's times are UTC
    return fmt_duration((datetime.now(UTC) - when).total_seconds()) + " ago"


def fmt_number(value: Any) -> str:
    """A metric in a sentence, to 4 significant digits (`--json` has every digit)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:.4g}"


def fmt_metrics(metrics: Any) -> str:
    """`{'eval_loss': 6.0463, 'qa/score': 0.08}` as `eval_loss 6.046, qa/score 0.08`."""
    if not isinstance(metrics, dict):
        return str(metrics)
    return ", ".join(f"{k} {fmt_number(v)}" for k, v in sorted(metrics.items()))


def _at(data: dict[str, Any]) -> str:
    step = data.get("step")
    return f"at step {step}" if step is not None else ""


def _phrase_of(kind: str, data: dict[str, Any]) -> str:
    """What an event of `kind` (its type without `job.`) says, in words; "" when its type says it all."""
    d = data
    if kind == "created":
        return f"as {d['name']}" if d.get("name") else ""
    if kind == "queued":
        return f"position {d['position']} in the queue" if d.get("position") is not None else ""
    if kind == "started":
        where = str(d.get("launcher") or "") + (f" on {d['host']}" if d.get("host") else "")
        slurm = d.get("slurm_job_id") or d.get("external_id")
        parts = [where.strip()]
        if d.get("num_nodes") is not None and d.get("processes_per_node") is not None:
            parts.append(f"{d['num_nodes']} node(s) x {d['processes_per_node']} process(es)")
        if slurm:
            parts.append(f"SLURM job {slurm}")
        elif d.get("pid"):
            parts.append(f"pid {d['pid']}")
        if d.get("attempt"):
            parts.append(f"retry {d['attempt']}")
        return ", ".join(p for p in parts if p)
    if kind == "checkpoint":
        return f"{_at(d)}: saved {d.get('path')}".strip(": ")
    if kind == "eval":
        return f"{_at(d)}: {fmt_metrics(d.get('metrics') or {})}".strip(": ")
    if kind == "sample":
        return f"{_at(d)} (ftq samples shows it)".strip()
    if kind == "evaluation":
        what = "final/" if d.get("checkpoint") == "final" else f"checkpoint {d.get('checkpoint')}"
        line = f"{what} {d.get('status')}"
        if d.get("metrics"):
            line += f": {fmt_metrics(d['metrics'])}"
        best = d.get("best_checkpoint")
        if isinstance(best, dict):  # its score is in the line of the evaluation that scored it
            line += " (the best)" if best.get("step") == d.get("step") else f"; best: step {best.get('step')}"
        return line
    if kind == "warning":
        head = " ".join(str(p) for p in (d.get("kind") or "warning", _at(d)) if p)
        return f"{head}: {d['message']}" if d.get("message") else head
    if kind == "retried":
        return f"retry {d.get('attempt')}" + (f": {d['reason']}" if d.get("reason") else "")
    if kind == "paused":
        parts = [_at(d)]
        if "checkpoint" in d:
            c = d["checkpoint"]
            parts.append(
                f"resumes from step {c}" if c is not None else "no checkpoint: resumes from the start"
            )
        return "; ".join(p for p in parts if p)
    if kind == "resumed":
        c = d.get("checkpoint")
        return f"from step {c}" if c is not None else "from the start"
    if kind in ("failed", "cancelled"):
        error = d.get("error")
        if isinstance(error, dict):
            code = f" (exit code {error['exit_code']})" if error.get("exit_code") is not None else ""
            return f"{error.get('code')}: {error.get('message')}{code}"
        return ""
    return ", ".join(
        f"{k} {fmt_metrics(v) if isinstance(v, dict) else v}" for k, v in d.items() if v is not None
    )


def fmt_event(event: Event, number: int) -> str:
    """One event as a sentence, `number` its place in its job's events (1: the first), not the server's
    id (which runs across every job): `event 5  job.checkpoint  at step 20: saved checkpoints/...`."""
    phrase = _phrase_of(event.type.removeprefix("job."), dict(event.data))
    return f"event {number}  {event.type}" + (f"  {phrase}" if phrase else "")


class EventCount:
    """Numbers a job's events as they are printed (1, 2, ...), and keeps the cursor of the next read."""

    def __init__(self) -> None:
        self.after = 0  # the server's id of the last event printed
        self.count = 0

    def line(self, event: Event) -> str:
        self.count += 1
        self.after = event.id
        return fmt_event(event, self.count)


# The trainer's log lines (trainer/train.py: `%(asctime)s %(name)s %(levelname)s %(message)s`; an
# evaluation's, trainer/evaluate.py: `%(asctime)s %(levelname)s %(name)s: %(message)s`).
_LEVELS = "DEBUG|INFO|WARNING|ERROR|CRITICAL"
_TRAIN_LINE = re.compile(rf"^(\d{{4}}-\d\d-\d\d) (\d\d:\d\d:\d\d),\d+ (\S+) ({_LEVELS}) (.*)$", re.S)
_SIDE_LINE = re.compile(rf"^(\d{{4}}-\d\d-\d\d) (\d\d:\d\d:\d\d),\d+ ({_LEVELS}) (\S+): (.*)$", re.S)
# A step line ends with the eta then, which the follow's bar shows as it is now.
_STEP_ETA = re.compile(r"^(step \d+/\d+ .*?)\s+eta \d+:\d\d:\d\d$")
ROOT_LOGGER = "trainer"


class LogLines:
    """The log's lines as `submit --follow` prints them, each short enough for 80 columns: the time
    (HH:MM:SS) for the trainer's date, time and milliseconds; the level only when it is not INFO; the
    logger only when it is not the trainer's own; and a step line without its eta (the bar shows it).
    The date is printed on the first line of each day after the first (a run past midnight). Lines
    not in the logging format (a traceback, a library's own output) are printed as they are."""

    def __init__(self) -> None:
        self.day: str | None = None

    def short(self, line: str) -> str:
        found = _TRAIN_LINE.match(line)
        if found:
            day, clock, name, level, message = found.groups()
        elif found := _SIDE_LINE.match(line):
            day, clock, level, name, message = found.groups()
        else:
            return line
        if (eta := _STEP_ETA.match(message)) is not None:
            message = eta.group(1)
        when = clock if self.day in (None, day) else f"{day} {clock}"
        self.day = day
        parts = [when, level if level != "INFO" else "", name if name != ROOT_LOGGER else "", message]
        return " ".join(p for p in parts if p)


def fmt_status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def fmt_progress(job: JobPublic) -> str:
    step, max_steps = job.progress.step, job.progress.max_steps
    if step is None:
        return "-" if max_steps is None else f"0/{max_steps}"
    if max_steps:
        return f"{step}/{max_steps} ({100 * step / max_steps:.0f}%)"
    return str(step)


# A followed job or export is polled through a slow or restarting server as the SDK's waits are (the
# same `Outage`): following is watching, and one slow answer from a busy server must not end it. A follow
# starts from an answer (the job or export it follows), so a refused connection in it is a restart.
TRANSIENT = OUTAGE_ERRORS


class Patience:
    """A follow loop's outage: the first failure is said once on stderr, one the `Outage` will not wait
    out is raised, and the next answer says the server is back."""

    def __init__(self, seconds: float = OUTAGE_PATIENCE_SECONDS) -> None:
        self.outage = Outage(seconds)

    def failed(self, exc: FtqClientError) -> None:
        first = self.outage.since is None
        if not self.outage.endure(exc):
            raise exc
        if first:
            message, _ = describe_failure(exc)
            err.print(f"ftq: {escape(message)}; still following, trying again", soft_wrap=True)

    def answered(self) -> None:
        if self.outage.over():
            err.print("ftq: the server answers again", soft_wrap=True)
