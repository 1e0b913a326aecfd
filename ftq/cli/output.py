"""What the `ftq` client commands print and how they exit: the consoles, the exit codes, one line on
stderr for every expected failure (never a traceback), and the formats of numbers, times and statuses.
Shared by `ftq.cli.client` and `ftq.cli.files`."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import NoReturn, ParamSpec, TypeVar

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


def fmt_event(event: Event) -> str:
    """One event as a line: `event 12 job.checkpoint step 20 path=checkpoints/checkpoint-20`."""
    data = dict(event.data)
    parts = [f"event {event.id}", event.type]
    step = data.pop("step", None)
    if step is not None:
        parts.append(f"step {step}")
    error = data.pop("error", None)
    if isinstance(error, dict):
        parts.append(f"{error.get('code')}: {error.get('message')}")
    message = data.pop("message", None)
    kind = data.pop("kind", None)
    if kind:
        parts.append(str(kind))
    if message:
        parts.append(str(message))
    for key, value in data.items():
        if value is not None and key not in ("prompt", "completion"):
            parts.append(f"{key}={value}")
    return "  ".join(parts)


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
