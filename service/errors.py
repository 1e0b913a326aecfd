"""Expected failures: one base class carrying its HTTP status, mapped to a response in one handler."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel


class FtqError(Exception):
    """An expected failure, answered with its status and `{"detail", "code"}`. A subclass names both in
    its class line: `class NotFound(FtqError, status=404, code="not_found")`."""

    status_code = 500
    code = "internal"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status_code = status
        if code is not None:
            cls.code = code

    def __init__(
        self, message: str, *, headers: dict[str, str] | None = None, retry_after: int | None = None
    ):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.code}


class BadRequest(FtqError, status=400, code="bad_request"): ...


class Forbidden(FtqError, status=403, code="forbidden"): ...


class NotFound(FtqError, status=404, code="not_found"): ...


class Conflict(FtqError, status=409, code="conflict"): ...


class NotPausable(Conflict, code="not_pausable"):
    """A pause of a job that has ended or is being cancelled."""


class NotResumable(Conflict, code="not_resumable"):
    """A resume of a job that has ended, is being cancelled, or is still pausing."""


class RequestTimeout(FtqError, status=408, code="request_timeout"):
    def __init__(self, message: str):
        super().__init__(message, headers={"Connection": "close"})


class PayloadTooLarge(FtqError, status=413, code="payload_too_large"): ...


class UnsupportedMediaType(FtqError, status=415, code="unsupported_media_type"): ...


class MisdirectedRequest(FtqError, status=421, code="misdirected_request"): ...


class HeadersTooLarge(FtqError, status=431, code="headers_too_large"): ...


class InsufficientStorage(FtqError, status=507, code="insufficient_storage"):
    """The server's disk (or the file system's quota) has no room for what the request would store."""

    def __init__(self, message: str):
        super().__init__(message, retry_after=60)


class Unauthorized(FtqError, status=401, code="unauthorized"):
    def __init__(self, message: str = "missing or invalid bearer token"):
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class TooManyRequests(FtqError, status=429, code="rate_limited"):
    def __init__(self, message: str, retry_after: int):
        super().__init__(message, retry_after=max(1, retry_after))


class QuotaExceeded(FtqError, status=429, code="quota_exceeded"):
    """An owner's cap (a setting, named in the message) is reached; Retry-After says when to look again."""

    def __init__(self, message: str, retry_after: int = 30):
        super().__init__(message, retry_after=max(1, retry_after))


class ServiceUnavailable(FtqError, status=503, code="unavailable"):
    def __init__(self, message: str, retry_after: int = 2):
        super().__init__(message, retry_after=retry_after)


class SandboxUnavailable(FtqError, status=503, code="sandbox_unavailable"):
    """Tenant code (a python grader, an evaluation task's code) asked of a host whose sandbox cannot
    start: refused, never run weaker; the message names the fix."""


class SpecError(FtqError, status=422, code="invalid_spec"):
    """A 422 for one or more spec fields; `errors` follow FastAPI's validation error shape."""

    def __init__(self, errors: list[dict[str, Any]]):
        first = errors[0] if errors else {"loc": [], "msg": "invalid spec"}
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
        super().__init__(f"{where}: {first.get('msg')}" if where else str(first.get("msg")))
        self.errors = errors

    def body(self) -> dict[str, Any]:
        return {"detail": self.errors}


def spec_field_error(
    loc: list[str | int] | tuple[str | int, ...], msg: str, type_: str = "value_error"
) -> SpecError:
    return SpecError([{"loc": ["body", *loc], "msg": msg, "type": type_}])


def suggest_fields(errors: list[dict[str, Any]], model: type[BaseModel]) -> list[dict[str, Any]]:
    """`errors` with each unknown field's message naming the nearest field the model has at that
    place ("did you mean `learning_rate`?"), or where it belongs when it is a field of another section."""
    return [_with_suggestion(err, model) if err.get("type") == "extra_forbidden" else err for err in errors]


def _with_suggestion(err: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    loc = [p for p in err.get("loc", []) if p != "body"]
    if not loc or not isinstance(loc[-1], str):
        return err
    parent = _model_at(model, loc[:-1])
    if parent is None:
        return err
    name = loc[-1]
    close = difflib.get_close_matches(name, list(parent.model_fields), n=1, cutoff=0.6)
    # A valid field written in the wrong section (`learning_rate` at the top, not under `training`).
    elsewhere = [".".join(path) for path in _field_paths(model) if path[-1] == name]
    if close:
        hint = f"did you mean `{close[0]}`?"
    elif elsewhere:
        hint = f"it belongs at `{elsewhere[0]}`"
    else:
        hint = "the fields here are " + ", ".join(f"`{f}`" for f in sorted(parent.model_fields))
    return {**err, "msg": f"unknown field `{name}`; {hint}"}


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (through `X | None`, lists and Annotated), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: list[Any]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):  # an item of a list of models
            continue
        if current is None or part not in current.model_fields:
            return None
        current = _submodel(current.model_fields[part].annotation)
    return current


def _field_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        paths.append((*prefix, name))
        sub = _submodel(info.annotation)
        if sub is not None and len(prefix) < 4:
            paths.extend(_field_paths(sub, (*prefix, name)))
    return paths


# Page cursors are row sequence numbers: a signed 64-bit integer in the store.
_MAX_CURSOR = 2**63 - 1


def parse_cursor(cursor: str | None) -> int | None:
    """A list's `cursor` query parameter (the `next_cursor` a previous page gave out) as a sequence number.

    isdigit() also holds for non-ASCII digits ("²", Arabic-Indic ones), and a long number overflows the
    store's 64-bit integer: both are a 422 naming the parameter, not a 500."""
    if not cursor:
        return None
    if not cursor.isdigit():
        raise BadRequest("cursor is not one this server gave out")
    if not cursor.isascii() or int(cursor) > _MAX_CURSOR:
        raise SpecError(
            [{"loc": ["query", "cursor"], "msg": "cursor is out of range", "type": "value_error"}]
        )
    return int(cursor)
