"""One SDK scenario for both clients: `sdk_client(style, url, token)` is a `Client` for "sync" and, for
"async", an `AsyncClient` that the scenario calls as it would a `Client`: each call runs in an event
loop of its own thread (anyio's blocking portal) and is awaited there, an async iterator read to a list.
Parametrise a test over `SDK_STYLES` and it checks what both clients do, written once."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ftq.client import AsyncClient, AsyncFiles, AsyncJobs, Client

SDK_STYLES = ("sync", "async")


@contextmanager
def sdk_client(style: str, url: str, token: str | None = None) -> Iterator[Client]:
    if style == "sync":
        with Client(url, token) as client:
            yield client
        return
    if style != "async":
        raise ValueError(f"an SDK style is one of {SDK_STYLES}, not {style!r}")
    with start_blocking_portal() as portal:
        async_client = AsyncClient(url, token)
        try:
            yield cast(Client, _Blocking(async_client, portal))
        finally:
            portal.call(async_client.aclose)


class _Blocking:
    """An async client, or its `jobs` or `files`, called from blocking code through `portal`."""

    def __init__(self, target: object, portal: BlockingPortal) -> None:
        self._target = target
        self._portal = portal

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if isinstance(attr, AsyncJobs | AsyncFiles):
            return _Blocking(attr, self._portal)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._portal.call(_settled, attr, args, kwargs)

        return call


async def _settled(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """fn's answer: awaited, or every item of an async iterator."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    if isinstance(result, AsyncIterator):
        return [item async for item in result]
    return result
