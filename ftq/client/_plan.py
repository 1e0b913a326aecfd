"""Calls described as data, so that `Client` and `AsyncClient` run the same description.

A call that is one request is a `Call`: method, path, parameters, body, and how its answer is read.
A call that takes more (paging, following a log, waiting for a job, a resumable download) is a *flow*:
a generator that yields the steps it needs (`Call`, `Open` and `Next` to read a streamed response,
`Sleep`, `Blocking` for disk work), is sent each step's result or has its failure thrown in where it
asked, yields the items an iterator hands out, and returns the call's result. Each client runs every
flow with one loop of its own (blocking or async), so paging and following are written once, in
`ftq.client._api`, and the two clients cannot drift apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Never, TypeAlias, TypeVar, cast

import anyio
import httpx

from ftq.client._core import CHUNK_BYTES

A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)
T = TypeVar("T")
U = TypeVar("U")
R = TypeVar("R")

Progress: TypeAlias = Callable[[int, int], None]


class Step:
    """Something a flow asks its client to do."""


@dataclass(frozen=True)
class Upload:
    """A request body streamed from a file; progress(sent, total) after each chunk."""

    path: Path
    progress: Progress | None = None

    def chunks(self) -> Iterator[bytes]:
        report = self._reporter()
        with open(self.path, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk
                report(len(chunk))

    async def achunks(self) -> AsyncIterator[bytes]:
        report = self._reporter()
        async with await anyio.open_file(self.path, "rb") as f:
            while chunk := await f.read(CHUNK_BYTES):
                yield chunk
                report(len(chunk))

    def _reporter(self) -> Callable[[int], None]:
        """Counts what was sent and tells `progress` once the chunk went out."""
        total, sent = os.stat(self.path).st_size, 0

        def report(n: int) -> None:
            nonlocal sent
            sent += n
            if self.progress is not None:
                self.progress(sent, total)

        return report


@dataclass(frozen=True)
class Call(Step, Generic[A_co]):
    """One request; its answer is `read(response, server URL)`. A status >= 400 is its typed error."""

    method: str
    path: str
    read: Callable[[httpx.Response, str], A_co]
    params: Mapping[str, Any] = field(default_factory=dict)  # a None value is left out of the query
    content: bytes | Upload | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Open(Step):
    """A GET whose body is read as it comes: answered with the response (status, headers), whose body
    then comes by `Next` steps, as lines or as chunks of bytes. It stays open while the flow does other
    steps (hashing what a download already has), until the flow opens another or ends."""

    path: str
    lines: bool
    params: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Next(Step):
    """The next line or chunk of the response that `Open` opened; None at its end."""


# The steps a client does itself come with how each kind of client does them, a pair of methods as
# `Upload.chunks` and `achunks`: the only lines of the client where the two differ in more than `await`
# (so `_sync.py` is `_async.py` with the names swapped, see bin/unasync_sdk.py).


@dataclass(frozen=True)
class Sleep(Step):
    seconds: float

    def run(self) -> None:
        time.sleep(self.seconds)

    async def arun(self) -> None:
        await anyio.sleep(self.seconds)


@dataclass(frozen=True)
class Blocking(Step):
    """Disk work (hashing a large file): done in a worker thread by the async client."""

    fn: Callable[[], Any]

    def run(self) -> Any:
        return self.fn()

    async def arun(self) -> Any:
        return await anyio.to_thread.run_sync(self.fn)


# A flow that yields items T and returns R; Flow[Never, R] yields no items.
Flow: TypeAlias = Generator[Step | T, Any, R]


# The steps, as a flow writes them: `job = yield from fetch(call)` has the answer's type.


def fetch(call: Call[A]) -> Flow[Never, A]:
    return cast(A, (yield call))


def blocking(fn: Callable[[], A]) -> Flow[Never, A]:
    return cast(A, (yield Blocking(fn)))


def sleep(seconds: float) -> Flow[Never, None]:
    yield Sleep(seconds)


def open_stream(
    path: str,
    *,
    lines: bool,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Flow[Never, httpx.Response]:
    return cast(httpx.Response, (yield Open(path, lines, params or {}, headers or {})))


def next_line() -> Flow[Never, str | None]:
    return cast(str | None, (yield Next()))


def next_bytes() -> Flow[Never, bytes | None]:
    return cast(bytes | None, (yield Next()))


class Run(Generic[T, R]):
    """A flow being run. Iterating gives what it yields: a `Step`, which the client does and then
    answers (`answer`) or fails (`fail`, thrown into the flow where it asked), or an item for the
    caller. When the iteration ends, `result` is what the flow returned."""

    def __init__(self, flow: Flow[T, R]) -> None:
        self._flow = flow
        self._answer: Any = None
        self._error: Exception | None = None
        self.result: R
        # The path of the last request (for a transport error's message), and the lines or chunks of
        # the response the flow has open: the client's own (async or not) iterator, for its Next steps.
        self.path = ""
        self.reading: Any = None

    def answer(self, value: Any) -> None:
        self._answer = value

    def fail(self, error: Exception) -> None:
        self._error = error

    def __iter__(self) -> Iterator[Step | T]:
        try:
            while True:
                answer, error = self._answer, self._error
                self._answer, self._error = None, None
                out = self._flow.throw(error) if error is not None else self._flow.send(answer)
                if isinstance(out, Call | Open):
                    self.path = out.path
                yield out
        except StopIteration as done:
            self.result = done.value
        finally:
            self._flow.close()


def each_item(flow: Flow[T, R], into: Callable[[T], Iterator[U]]) -> Flow[U, R]:
    """`flow` with each item it yields replaced by the items `into(item)` gives; its steps pass through."""
    run = Run(flow)
    for out in run:
        if isinstance(out, Step):
            try:
                run.answer((yield out))
            except Exception as exc:
                run.fail(exc)
        else:
            yield from into(out)
    return run.result
