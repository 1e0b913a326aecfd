"""What the routers declare alike: an id in the path, the error answers the OpenAPI document lists
for a route (each with the `{"detail", "code"}` body of `service.errors`), and a stream that cleans up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Path
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ftq.contract.schemas import ErrorBody

Responses = dict[int | str, dict[str, Any]]


def error(description: str) -> dict[str, Any]:
    """One error answer of a route: when it happens."""
    return {"model": ErrorBody, "description": description}


UNAUTHORIZED = error("Missing or invalid bearer token")
# What the guard refuses when auth is off (service.guard): a browser's request from another site.
CROSS_SITE = error("Auth off: a cross-origin or cross-site request")


def owner_errors(not_found: str) -> Responses:
    """A route on one of the owner's things: 401 without a valid token, 404 for a thing that does not
    exist or is another owner's (the API does not tell them apart)."""
    return {401: UNAUTHORIZED, 404: error(not_found)}


# The longest id a route's path takes.
ID_MAX_LENGTH = 64


def id_in_path(description: str) -> Any:
    """The id of a job, file, export or webhook in a route's path."""
    return Path(min_length=1, max_length=ID_MAX_LENGTH, description=description)


class ClosingStream(StreamingResponse):
    """A stream that runs `close` however it ends: all sent, the client gone (Starlette cancels the
    body then, and an unfinished generator would keep what it holds until collected), an error."""

    def __init__(self, content: AsyncIterator[bytes], close: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._close()
