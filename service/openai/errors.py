"""OpenAI's error envelope for every `/v1` route: `{"error": {"message", "type", "param", "code"}}` with
the status codes the `openai` SDK maps to its exception classes (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409 ConflictError, 422
UnprocessableEntityError, 429 RateLimitError). The app's error handlers call `under_v1` and, for a `/v1`
path, answer with `envelope(...)` instead of the native `{"detail", "code"}`."""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import JSONResponse

from service.errors import FtqError, NotFound, SpecError

PREFIX = "/v1"

# OpenAI's error `type` by status.
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
# OpenAI's error `code` where the native code differs.
_CODES = {"unauthorized": "invalid_api_key", "rate_limited": "rate_limit_exceeded", "not_found": "not_found"}

# Native spec fields and the `/v1` parameter they come from (a refusal of the planned spec names the
# parameter the user wrote).
_PARAMS = {
    "dataset.file_id": "training_file",
    "dataset.eval_file_id": "validation_file",
    "dataset": "training_file",
    "dataset.format": "training_file",
    "dataset.messages_field": "training_file",
    "dataset.text_field": "training_file",
    "model": "model",
    "model.name_or_path": "model",
    "training.num_train_epochs": "hyperparameters.n_epochs",
    "training.per_device_train_batch_size": "hyperparameters.batch_size",
    "training.learning_rate": "hyperparameters.learning_rate_multiplier",
    "training.dpo.beta": "method.dpo.hyperparameters.beta",
    "training.seed": "seed",
    "integrations.wandb": "integrations",
}


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TYPE_NAMES = frozenset({"int", "float", "str", "bool", "list", "dict", "none"})


def under_v1(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class OpenAIError(FtqError, status=400, code="invalid_request_error"):
    """A `/v1` refusal that names the parameter (`hyperparameters.n_epochs`, `training_file`)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status_code = status
        self.openai_code = code

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.openai_code or self.code}


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(message, param=param, code=code)


def not_found(message: str, param: str | None = None) -> NotFound:
    err = NotFound(message)
    err.param = param  # type: ignore[attr-defined]
    return err


def _body(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def envelope(
    status: int, message: str, *, param: str | None = None, code: str | None = None, headers: Any = None
) -> JSONResponse:
    return JSONResponse(_body(status, message, param, code), status_code=status, headers=headers)


def body_of(err: FtqError) -> dict[str, Any]:
    """The envelope of an error answered by middleware (the guard, the body-size cap)."""
    return _body(err.status_code, err.message, getattr(err, "param", None), _CODES.get(err.code, err.code))


def param_of(loc: list[Any] | tuple[Any, ...]) -> str | None:
    """A validation error's location as OpenAI's `param` (`hyperparameters.n_epochs`); a native spec
    field as the `/v1` parameter it came from."""
    parts: list[str] = []
    for part in loc:
        if part in ("body", "query", "path", "header"):
            continue
        # A union's branch (`literal['auto']`, `int`) or a list index is no part of the parameter's name.
        if isinstance(part, int) or not _NAME.match(str(part)) or part in _TYPE_NAMES:
            break
        parts.append(str(part))
    if not parts:
        return None
    dotted = ".".join(parts)
    for native in sorted(_PARAMS, key=len, reverse=True):
        if dotted == native or dotted.startswith(native + "."):
            return _PARAMS[native]
    return dotted


def from_ftq(err: FtqError) -> JSONResponse:
    param = getattr(err, "param", None)
    if isinstance(err, OpenAIError):
        return envelope(err.status_code, err.message, param=param, code=err.openai_code, headers=err.headers)
    if isinstance(err, SpecError):
        # A spec the /v1 request was translated into, refused by planning: a 400 naming the /v1 parameter.
        first = err.errors[0] if err.errors else {}
        loc = list(first.get("loc", []))
        return envelope(
            400, _message(err.errors), param=param_of(loc), code=str(first.get("type") or "") or None
        )
    code = _CODES.get(err.code, err.code)
    return envelope(err.status_code, err.message, param=param, code=code, headers=err.headers)


def from_validation(errors: list[dict[str, Any]]) -> JSONResponse:
    """FastAPI's validation errors of a `/v1` request: a 400 naming the first parameter."""
    first = errors[0] if errors else {}
    loc = list(first.get("loc", []))
    return envelope(400, _message(errors), param=param_of(loc), code=str(first.get("type") or "") or None)


def from_http(status: int, detail: Any, method: str, path: str, headers: Any = None) -> JSONResponse:
    if status == 404:
        return envelope(404, f"Invalid URL ({method} {path})", code="not_found", headers=headers)
    if status == 405:
        return envelope(405, f"Method {method} is not allowed on {path}", headers=headers)
    return envelope(status, str(detail), headers=headers)


def _message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors[:5]:
        where = param_of(list(e.get("loc", [])))
        msg = str(e.get("msg", "invalid"))
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "invalid request"
