"""The SDK's exceptions: one class per way a call can fail, so a tool catches what it can handle.

`FtqAPIError` and its subclasses are answers from the server (they carry its status, `code` and, for a
bad spec, the failing field); `ConnectionFailed` and its subclasses mean no answer came; the rest are
local (a spec file that does not parse, a `wait` that ran out of time). All derive from
`FtqClientError`, so one `except` catches everything the SDK raises on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ftq.contract.schemas import JobPublic

__all__ = [
    "ApiError",
    "BadRequest",
    "ChecksumMismatch",
    "Conflict",
    "ConnectionFailed",
    "ConnectionLost",
    "FieldError",
    "Forbidden",
    "FtqAPIError",
    "FtqClientError",
    "InvalidURL",
    "NotFound",
    "RateLimited",
    "ServerError",
    "ServerTimeout",
    "SpecFileError",
    "Unauthorized",
    "Unavailable",
    "UnexpectedResponse",
    "ValidationError",
    "WaitTimeout",
]


class FtqClientError(Exception):
    """Base of every error the SDK raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The subclasses' constructors take other arguments than `args`: rebuild from args and
        # attributes, so an error survives pickling (multiprocessing, concurrent.futures, Celery).
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[FtqClientError], args: tuple[Any, ...], state: dict[str, Any]) -> FtqClientError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


# Answers from the server ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldError:
    """One entry of a 422 body: where (`loc`, as the API gives it) and what is wrong."""

    loc: tuple[str | int, ...]
    msg: str
    type: str = "value_error"

    @property
    def field(self) -> str | None:
        """The dotted path in the spec (`training.learning_rate`); the API's leading "body" dropped."""
        parts = self.loc[1:] if self.loc and self.loc[0] == "body" else self.loc
        return ".".join(str(p) for p in parts) or None


class FtqAPIError(FtqClientError):
    """The server answered with an error status.

    `code` is the API's machine-readable code (`not_found`, `invalid_spec`, `rate_limited`, ...);
    `detail` the human message; `field` the dotted spec path the error is about, when it names one.
    """

    def __init__(
        self,
        status_code: int,
        code: str,
        detail: str,
        field: str | None = None,
        *,
        errors: Sequence[FieldError] = (),
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(f"{status_code} {code}: {detail}")
        self.status_code = status_code
        self.code = code
        self.detail = detail
        self.field = field
        self.errors: list[FieldError] = list(errors)
        # Seconds the server asked us to wait (Retry-After on 429 and 503), None when it did not say.
        self.retry_after = retry_after
        self.headers: dict[str, str] = dict(headers or {})  # names in lower case, as httpx gives them
        # The parsed JSON body, or None when the body was not JSON (a proxy's HTML page, say).
        self.body = body

    @property
    def status(self) -> int:
        """The HTTP status (the contract's name for it; same as `status_code`)."""
        return self.status_code


# The contract names the base class `ApiError`; both names are the same class.
ApiError = FtqAPIError


class BadRequest(FtqAPIError):
    """400: the body is not JSON or YAML, or a query value is malformed."""


class Unauthorized(FtqAPIError):
    """401: no token, or not one the server knows (set FTQ_TOKEN or pass token=)."""


class Forbidden(FtqAPIError):
    """403: the server refused the request's origin or host (a browser-style cross-site request)."""


class NotFound(FtqAPIError):
    """404: no such job, or it belongs to another owner (the API does not tell them apart)."""


class Conflict(FtqAPIError):
    """409: a request with the same Idempotency-Key is still being processed; retrying is safe."""


class ValidationError(FtqAPIError):
    """422: the spec (or a parameter) is invalid; `errors` lists every field, `loc` is the first one's."""

    @property
    def loc(self) -> list[str | int]:
        """The first error's location as the API gives it, e.g. ["body", "training", "learning_rate"]."""
        return list(self.errors[0].loc) if self.errors else []

    @property
    def fields(self) -> list[str]:
        """The dotted spec path of every failing field, in the API's order."""
        return [e.field for e in self.errors if e.field]


class RateLimited(FtqAPIError):
    """429: too many submissions a minute, or too many active jobs; wait `retry_after` seconds."""


class ServerError(FtqAPIError):
    """5xx: the server failed; not the request's fault."""


class Unavailable(ServerError):
    """503: the server's store or broker is down for now; retry after `retry_after` seconds."""


# No answer ----------------------------------------------------------------------------------------------


class InvalidURL(FtqClientError, ValueError):
    """The server URL (url= or FTQ_URL) is not an http(s) URL, so no request can be made."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url!r} {reason}")
        self.url = url
        # Reads after the URL: "is not an http(s) URL", "is not a valid URL: ...".
        self.reason = reason


class ConnectionFailed(FtqClientError):
    """The server could not be reached (not running, wrong host or port, network down)."""

    def __init__(self, url: str, reason: str, path: str = "") -> None:
        super().__init__(f"cannot reach the ftq server at {url} ({reason})")
        self.url = url
        self.reason = reason
        self.path = path


class ServerTimeout(ConnectionFailed):
    """The server did not answer within the client's timeout."""

    def __init__(self, url: str, reason: str = "timed out", path: str = "") -> None:
        super().__init__(url, reason, path)
        self.args = (f"the ftq server at {url} did not answer in time",)


class ConnectionLost(ConnectionFailed):
    """The connection broke during the exchange (server restarted, proxy cut it)."""

    def __init__(self, url: str, reason: str, path: str = "") -> None:
        super().__init__(url, reason, path)
        self.args = (f"request to {url}{path} failed: {reason}",)


class UnexpectedResponse(FtqClientError):
    """A success status with a body that is not what the API sends: FTQ_URL is likely not ftq."""

    def __init__(self, url: str, status_code: int, what: str) -> None:
        super().__init__(f"the server at {url} answered {status_code} with a body that is {what}")
        self.url = url
        self.status_code = status_code


# Local -------------------------------------------------------------------------------------------------


class SpecFileError(FtqClientError, ValueError):
    """A spec file that is missing, unreadable, not YAML/JSON, or not a mapping; nothing was sent."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class WaitTimeout(FtqClientError, TimeoutError):
    """`jobs.wait` gave up before the job ended; `job` is its last state (the job keeps running)."""

    def __init__(self, job: JobPublic, timeout: float) -> None:
        super().__init__(f"{job.id} is still {job.status} after {timeout:g} s")
        self.job = job
        self.job_id = job.id
        self.timeout = timeout


class ChecksumMismatch(FtqClientError):
    """A download whose bytes do not hash to the sha256 the server lists (or do not have its size); the
    file was not moved into place (the `.part` file is removed, so a retry starts over)."""

    def __init__(self, path: str, expected: str, got: str) -> None:
        super().__init__(f"{path}: sha256 {got} does not match the listed {expected}")
        self.path = path
        self.expected = expected
        self.got = got
