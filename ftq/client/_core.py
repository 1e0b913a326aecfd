"""What the sync and async clients share and that does no I/O on the network: the URL and headers,
request bodies, turning responses into models or typed errors, and the line and SSE decoders.
Keeping it here means `Client` and `AsyncClient` cannot drift apart in how they read the API."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import pydantic
import pydantic_core
import yaml

from ftq import __version__
from ftq.client import errors
from ftq.contract import specyaml
from ftq.contract.schemas import Artifact, LogChunk
from ftq.contract.spec import JobSpec
from ftq.contract.status import TERMINAL, JobStatus
from ftq.contract.yaml_errors import describe as describe_yaml_error

DEFAULT_PORT = 8000
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
DEFAULT_TIMEOUT = 30.0
# How long a wait or a follow rides out a server that stopped answering (timeouts, dropped or refused
# connections while it restarts, 503s) before it gives up: watching a job outlives one restart.
OUTAGE_PATIENCE_SECONDS = 300.0
# What a server that stopped answering looks like: no answer at all, or a 503 while its store restarts.
OUTAGE_ERRORS = (errors.ConnectionFailed, errors.Unavailable)
# Bytes of train.log per read: large enough that a finished log comes in a request or two.
LOG_READ_BYTES = 262_144

M = TypeVar("M", bound=pydantic.BaseModel)

# A spec as a tool holds it: the model, a dict, or a YAML/JSON file's path.
SpecInput: TypeAlias = JobSpec | Mapping[str, Any] | str | os.PathLike[str]
StatusFilter: TypeAlias = str | JobStatus | Iterable[str | JobStatus] | None

__all__ = ["TERMINAL", "SpecInput", "StatusFilter"]


# Where and as whom -----------------------------------------------------------------------------------------


def resolve_url(url: str | None) -> str:
    """url, else FTQ_URL, else the local server on FTQ_PORT (the port `ftq up` reads too); checked here
    so a typo fails before any request."""
    raw = (url or os.environ.get("FTQ_URL") or default_url()).rstrip("/")
    try:
        parsed = httpx.URL(raw)
    except (httpx.InvalidURL, ValueError) as exc:
        raise errors.InvalidURL(raw, f"is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise errors.InvalidURL(raw, "is not an http(s) URL")
    return raw


def default_url() -> str:
    """http://127.0.0.1:<FTQ_PORT>: one variable sets the port of `ftq up` / `ftq api` and of every client."""
    port = os.environ.get("FTQ_PORT", "").strip()
    if not port:
        return DEFAULT_URL
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.InvalidURL(f"FTQ_PORT={port!r}", "is not a port number (1-65535)")
    return f"http://127.0.0.1:{int(port)}"


def build_headers(token: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    """token=None reads FTQ_TOKEN; an empty token sends none (auth-off servers, or to test a 401)."""
    if token is None:
        token = os.environ.get("FTQ_TOKEN", "")
    headers = {"User-Agent": f"ftq-python/{__version__}", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra or {})
    return headers


def job_path(job_id: str, *rest: str) -> str:
    """/jobs/<id>/...; the id is quoted so that no id can reach another route."""
    if not job_id:
        raise ValueError("job_id is empty")
    return "/".join(["/jobs", quote(job_id, safe=""), *rest])


def side_run_path(job_id: str, plural: str, row_id: str | None = None, *rest: str) -> str:
    """/jobs/<id>/<plural>[/<row id>/...] of a job's side runs (`exports`, `evaluations`), both ids quoted."""
    if row_id is None:
        return job_path(job_id, plural)
    if not row_id:
        raise ValueError(f"{plural[:-1]}_id is empty")
    return job_path(job_id, plural, quote(row_id, safe=""), *rest)


def export_path(job_id: str, export_id: str | None = None, *rest: str) -> str:
    return side_run_path(job_id, "exports", export_id, *rest)


def evaluation_path(job_id: str, evaluation_id: str | None = None, *rest: str) -> str:
    return side_run_path(job_id, "evaluations", evaluation_id, *rest)


def evaluation_body(checkpoint: str | int, suites: Sequence[str] | None) -> tuple[bytes, dict[str, str]]:
    """The body of POST /jobs/{id}/evaluations: `final`, `best` or a step; the spec's suites by name."""
    body: dict[str, Any] = {"checkpoint": checkpoint}
    if suites is not None:
        body["suites"] = list(suites)
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def export_body(
    kind: str,
    dtype: str,
    max_shard_size: str | None,
    push_to_hub: Mapping[str, Any] | str | None,
    checkpoint: str | int = "final",
) -> tuple[bytes, dict[str, str]]:
    """The body of POST /jobs/{id}/exports; `push_to_hub` a repo id or `{repo_id, private}`."""
    body: dict[str, Any] = {"kind": kind, "dtype": dtype}
    if checkpoint != "final":
        body["checkpoint"] = checkpoint
    if max_shard_size is not None:
        body["max_shard_size"] = max_shard_size
    if isinstance(push_to_hub, str):
        body["push_to_hub"] = {"repo_id": push_to_hub}
    elif push_to_hub is not None:
        body["push_to_hub"] = dict(push_to_hub)
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def status_param(status: StatusFilter) -> str | None:
    if status is None:
        return None
    if isinstance(status, str):  # a JobStatus is a str too
        return str(status) or None
    return ",".join(str(s) for s in status) or None


# Request bodies ----------------------------------------------------------------------------------------


def spec_body(spec: SpecInput) -> tuple[bytes, str]:
    """The bytes to POST and their content type. A file is sent as written (YAML stays YAML, so the
    server's error positions match the user's file), after a local parse that catches typos early."""
    if isinstance(spec, JobSpec):
        # Only what was set: the server fills its own defaults, as it does for a dict.
        return pydantic_core.to_json(spec.model_dump(mode="json", exclude_unset=True)), "application/json"
    if isinstance(spec, str | os.PathLike):
        return read_spec_file(Path(spec))
    if isinstance(spec, Mapping):
        return pydantic_core.to_json(dict(spec)), "application/json"
    raise TypeError(f"a spec is a JobSpec, a mapping or a file path, not a {type(spec).__name__}")


def read_spec_file(path: Path) -> tuple[bytes, str]:
    """The file's bytes and content type (.json: JSON, anything else: YAML, a superset of JSON)."""
    if not path.exists():
        raise errors.SpecFileError(str(path), "no such file")
    if path.is_dir():
        raise errors.SpecFileError(str(path), "is a directory, not a job spec file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.SpecFileError(str(path), f"cannot read it: {exc}") from None
    body: Any
    if path.suffix.lower() == ".json":
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise errors.SpecFileError(
                str(path), f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        ctype = "application/json"
    else:
        try:
            body = specyaml.load(text)
        except yaml.YAMLError as exc:
            raise errors.SpecFileError(str(path), describe_yaml_error(text, exc)) from None
        ctype = "application/yaml"
    if not isinstance(body, dict):
        raise errors.SpecFileError(
            str(path), f"a job spec is a mapping (name:, model:, dataset:, ...), not a {type(body).__name__}"
        )
    return text.encode("utf-8"), ctype


# Responses -----------------------------------------------------------------------------------------------

_ERROR_CLASSES: dict[int, type[errors.FtqAPIError]] = {
    400: errors.BadRequest,
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    422: errors.ValidationError,
    429: errors.RateLimited,
    503: errors.Unavailable,
}
# What the server's own errors call themselves (service/errors.py), for bodies that carry no code:
# FastAPI's 404 for an unknown route, its 422 for a bad parameter, a proxy's 502.
_DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
}


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # the HTTP-date form: ftq never sends it
        return None


def _field_errors(items: list[Any]) -> list[errors.FieldError]:
    found = []
    for item in items:
        if isinstance(item, dict):
            loc = item.get("loc") or []
            found.append(
                errors.FieldError(
                    loc=tuple(p if isinstance(p, int) else str(p) for p in loc),
                    msg=str(item.get("msg", "invalid")),
                    type=str(item.get("type", "value_error")),
                )
            )
        else:
            found.append(errors.FieldError(loc=(), msg=str(item)))
    return found


def error_from_response(resp: httpx.Response) -> errors.FtqAPIError:
    """The typed error for a 4xx/5xx: the API's `{"detail", "code"}`, or a 422's list of fields."""
    status = resp.status_code
    cls = _ERROR_CLASSES.get(status) or (errors.ServerError if status >= 500 else errors.FtqAPIError)
    code = _DEFAULT_CODES.get(status) or f"http_{status}"
    fields: list[errors.FieldError] = []
    body: Any = None
    try:
        body = resp.json()
    except ValueError:
        detail = " ".join(resp.text.split())[:200]
    else:
        raw = body.get("detail") if isinstance(body, dict) else body
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            code = body["code"]
        if isinstance(raw, list):
            fields = _field_errors(raw)
            detail = "; ".join(f"{e.field or 'spec'}: {e.msg}" for e in fields)
            if status == 422 and not (isinstance(body, dict) and "code" in body):
                # A spec error's locations start at "body"; anything else is a parameter or header.
                on_body = any(e.loc[:1] == ("body",) for e in fields)
                code = "invalid_spec" if on_body else "invalid_request"
        else:
            detail = "" if raw is None else str(raw)
    return cls(
        status,
        code,
        detail,
        fields[0].field if fields else None,
        errors=fields,
        retry_after=_retry_after(resp.headers),
        headers=resp.headers,
        body=body,
    )


def parse_model(resp: httpx.Response, model: type[M], url: str) -> M:
    """The response body as `model`; a body of another shape means FTQ_URL is not (this) ftq."""
    try:
        data = resp.json()
    except ValueError:
        raise errors.UnexpectedResponse(url, resp.status_code, "not JSON") from None
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise errors.UnexpectedResponse(
            url, resp.status_code, f"not a {model.__name__} ({where}: {first['msg']})"
        ) from None


def transport_error(exc: httpx.HTTPError, url: str, path: str) -> errors.FtqClientError:
    """The typed error for a request that got no answer."""
    if isinstance(exc, httpx.UnsupportedProtocol):
        return errors.InvalidURL(url, "is not an http(s) URL")
    if isinstance(exc, httpx.ConnectError):
        # "[Errno 111] Connection refused" -> "Connection refused"
        return errors.ConnectionFailed(url, str(exc).split("] ")[-1] or "connection refused", path)
    if isinstance(exc, httpx.TimeoutException):
        return errors.ServerTimeout(url, str(exc) or "timed out", path)
    return errors.ConnectionLost(url, str(exc) or type(exc).__name__, path)


# Decoders ------------------------------------------------------------------------------------------------


class Outage:
    """One run of failed requests to a server that stopped answering, and whether to keep waiting it out:
    the SDK's waits and follows and the CLI's follow loops all decide by this."""

    def __init__(self, seconds: float = OUTAGE_PATIENCE_SECONDS) -> None:
        self.seconds = seconds
        self.since: float | None = None  # when this run of failures began; None while the server answers

    def endure(self, exc: Exception, *, answered: bool = True, deadline: float | None = None) -> bool:
        """True to wait on after `exc`: an outage error, no longer than `seconds` so far and not past
        `deadline`; a timeout or a dropped or refused connection only once the server has `answered`
        (before that, a wrong URL looks the same)."""
        if not isinstance(exc, OUTAGE_ERRORS):
            return False
        if isinstance(exc, errors.ConnectionFailed) and not answered:
            return False
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return (deadline is None or now < deadline) and now - self.since <= self.seconds

    def over(self) -> bool:
        """The server answered: the outage (if one was under way) is over; True when one was."""
        was, self.since = self.since is not None, None
        return was


class LineBuffer:
    """Splits text that arrives in arbitrary chunks into whole lines (without their "\\n")."""

    def __init__(self) -> None:
        self._partial = ""

    def feed(self, text: str) -> list[str]:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        return lines

    def flush(self) -> str | None:
        """The last line when the text did not end with a newline."""
        rest, self._partial = self._partial, ""
        return rest or None


class SSEDecoder:
    """Server-sent events, line by line, as the log stream route writes them (event:, data:, id:)."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        """(event, data) when `line` ends an event, else None."""
        if not line:
            if not self._event and not self._data:
                return None
            event = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):  # a comment: the server's keep-alive
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def log_event(event: str, data: str, offset: int) -> LogChunk | None:
    """A LogChunk for one event of /logs/stream: text for `log`, the complete marker for `end`."""
    if event == "log":
        payload = json.loads(data)
        return LogChunk(
            offset=int(payload["offset"]),
            next_offset=int(payload["next_offset"]),
            text=str(payload["text"]),
            complete=False,
        )
    if event == "end":
        return LogChunk(offset=offset, next_offset=offset, text="", complete=True)
    return None


def is_terminal(status: JobStatus | str) -> bool:
    return status in TERMINAL


# Downloads -----------------------------------------------------------------------------------------------

# What one read of a file or of a response body holds: files are streamed, never read whole.
CHUNK_BYTES = 1024**2
# How long a download waits for the server to finish hashing a big file before it reports the file
# as not verified (the server hashes each file once, in the background, after it is first listed).
SHA_WAIT_SECONDS = 300.0


class Downloaded(pydantic.BaseModel):
    """One file a download wrote: where, what the server lists for it, and whether its sha256 was
    checked (False only when the server had not hashed it within SHA_WAIT_SECONDS)."""

    path: Path
    artifact: Artifact
    verified: bool
    resumed_from: int = 0


def artifact_path(job_id: str, path: str) -> str:
    """/jobs/<id>/artifacts/<path>, each part of the path quoted."""
    return job_path(job_id, "artifacts", *(quote(p, safe="") for p in path.strip("/").split("/")))


def plan_download(artifacts: list[Artifact], path: str, out: Path) -> list[tuple[Artifact, Path]]:
    """What a download of `path` fetches and where each file goes: a file to out/<its name>; a folder
    (`final`, `checkpoints/checkpoint-20`, `exports/<id>`) file by file to out/<folder name>/..., the
    layout its .tar has. Empty when `path` is neither."""
    path = path.strip("/")
    for a in artifacts:
        if a.path == path:
            return [(a, out / path.rsplit("/", 1)[-1])]
    base = path.rsplit("/", 1)[-1]
    plan = []
    for a in artifacts:
        if a.path.startswith(path + "/"):
            rest = a.path[len(path) + 1 :].split("/")
            # The server never lists such a path; a hostile server must not make us write outside `out`.
            if any(p in ("", ".", "..") or "\\" in p for p in rest) or base in ("", ".", ".."):
                raise errors.UnexpectedResponse(
                    "server", 200, f"an artifact path that escapes its folder: {a.path}"
                )
            plan.append((a, out.joinpath(base, *rest)))
    return plan


def no_artifact(job_id: str, path: str) -> errors.NotFound:
    """What the server answers for a path it does not list (the SDK says it without a request)."""
    detail = f"job {job_id} has no artifact {path}"
    return errors.NotFound(404, "not_found", detail, body={"detail": detail, "code": "not_found"})


def part_files(dest: Path) -> tuple[Path, Path]:
    """The partial file of a download and the ETag of the version it holds (for If-Range)."""
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.etag")


def hash_prefix(part: Path) -> tuple[Any, int]:
    """(sha256 object, bytes) of what an interrupted download left in `part`."""
    digest = hashlib.sha256()
    size = 0
    with part.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest, size


def already_there(dest: Path, artifact: Artifact) -> bool:
    """Whether dest is this artifact already (same size and, when listed, same sha256)."""
    if not dest.is_file() or dest.stat().st_size != artifact.size or artifact.sha256 is None:
        return False
    digest, _ = hash_prefix(dest)
    return bool(digest.hexdigest() == artifact.sha256)


def resume_headers(part: Path, etag_file: Path) -> tuple[dict[str, str], int]:
    """The Range/If-Range headers that continue an interrupted download, and where it continues from.
    Without a recorded ETag the partial file cannot be trusted to be this version: start over."""
    try:
        have = part.stat().st_size
        etag = etag_file.read_text().strip()
    except OSError:
        return {}, 0
    if not have or not etag:
        return {}, 0
    return {"Range": f"bytes={have}-", "If-Range": etag}, have


def settle_file(artifact: Artifact, dest: Path, digest: str | None, resumed: int, verify: bool) -> Downloaded:
    """Move a fetched .part into place once it matches the listed sha256 (digest None: dest was
    already this file). A mismatch removes the .part (a retry starts over) and raises."""
    part, etag_file = part_files(dest)
    if digest is None:
        return Downloaded(path=dest, artifact=artifact, verified=True)
    checked = verify and artifact.sha256 is not None
    if checked and digest != artifact.sha256:
        part.unlink(missing_ok=True)
        etag_file.unlink(missing_ok=True)
        raise errors.ChecksumMismatch(artifact.path, str(artifact.sha256), digest)
    part.replace(dest)
    etag_file.unlink(missing_ok=True)
    return Downloaded(path=dest, artifact=artifact, verified=checked, resumed_from=resumed)
