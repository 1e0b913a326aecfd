"""Expected failures: one base class carrying its HTTP status, mapped to a response in one handler."""

from __future__ import annotations

from typing import Any


class FtqError(Exception):
    status_code = 500
    code = "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.code}


class BadRequest(FtqError):
    status_code = 400
    code = "bad_request"


class Unauthorized(FtqError):
    status_code = 401
    code = "unauthorized"

    def __init__(self, message: str = "missing or invalid bearer token"):
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(FtqError):
    status_code = 403
    code = "forbidden"


class NotFound(FtqError):
    status_code = 404
    code = "not_found"


class Conflict(FtqError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(FtqError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(FtqError):
    status_code = 415
    code = "unsupported_media_type"


class MisdirectedRequest(FtqError):
    status_code = 421
    code = "misdirected_request"


class HeadersTooLarge(FtqError):
    status_code = 431
    code = "headers_too_large"


class TooManyRequests(FtqError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after: int):
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after))})


class ServiceUnavailable(FtqError):
    status_code = 503
    code = "unavailable"

    def __init__(self, message: str, retry_after: int = 2):
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class SpecError(FtqError):
    """A 422 for one or more spec fields; `errors` follow FastAPI's validation error shape."""

    status_code = 422
    code = "invalid_spec"

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
