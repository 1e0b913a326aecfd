"""The rules of the grader routes: which score models a grader may name, who a python grader runs as,
how the process's grading slots are shared among owners, and a grader's reward with what went wrong, in
OpenAI's `{reward, metadata}`.

Slots: a grader is scored in one of two lanes, `process` (it has a python grader, which starts a child
process, or a score_model one, which runs a model) and `light` (string_check and text_similarity only,
scored in a thread, bounded by the contract's sizes). In each lane at most FTQ_GRADER_SLOTS graders are
scored at once, at most FTQ_GRADER_SLOTS_PER_OWNER of one owner's; an owner's further requests wait in a
queue of that owner's own (FTQ_GRADER_QUEUE_PER_OWNER long; one more is a 429 with Retry-After), and a
freed slot goes to the waiting owner that holds the fewest slots (among equals, the one served longest
ago). So one owner's
flood fills its own queue: it takes neither the other owners' slots nor their place in line. A python
grader, or a multi grader's python graders together, get FTQ_GRADER_TIMEOUT_SECONDS of wall clock per
request."""

from __future__ import annotations

import asyncio
import contextlib
import math
import pwd
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import anyio

from ftq.contract.graders import (
    Grader,
    GraderRunMetadata,
    GraderRunRequest,
    GraderRunResponse,
    needs_process,
    score_models,
)
from ftq.grading import model as score_model
from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits
from ftq.grading.score import sample_dict, score
from ftq.runtime.settings import Settings
from service.errors import SpecError, TooManyRequests

# The threads graders are scored in: more than the two lanes' slots can ever hold (FTQ_GRADER_SLOTS is at
# most 64), so the lanes decide who waits, and a grader never waits on a sync route's thread.
_THREADS = anyio.CapacityLimiter(2 * 64)


class _Waiter:
    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.granted = False


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Lane:
    """Slots shared fairly among owners: at most `slots` held at once and `per_owner` by one owner; an
    owner's requests past that wait in its own queue (at most `queue`; one more is a TooManyRequests),
    and a freed slot goes to the owner with a request waiting that holds the fewest slots (under
    `per_owner`), among equals the one given a slot longest ago.
    The sizes come with each request (the settings of the moment). Safe across threads and event loops
    (a test's apps each run their own loop): a waiter is woken on its own loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._queues: dict[str, deque[_Waiter]] = {}  # each owner's requests waiting, oldest first
        self._busy = 0
        self._slots = 1
        self._per_owner = 1
        self._seconds: dict[str, float] = {}  # how long each owner's requests hold a slot, on average
        self._served: dict[str, int] = {}  # when each owner with a slot or a queue was last given one
        self._grants = 0

    def counts(self, owner: str) -> tuple[int, int]:
        """(slots held, requests waiting) of the owner."""
        with self._lock:
            return self._held.get(owner, 0), len(self._queues.get(owner, ()))

    @contextlib.asynccontextmanager
    async def slot(self, owner: str, slots: int, per_owner: int, queue: int) -> AsyncIterator[None]:
        waiter = self._enter(owner, slots, per_owner, queue)
        if waiter is not None:
            await self._wait(owner, waiter)
        started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                seconds = time.monotonic() - started
                self._seconds[owner] = 0.7 * self._seconds.get(owner, seconds) + 0.3 * seconds
                self._release(owner)

    def _enter(self, owner: str, slots: int, per_owner: int, queue: int) -> _Waiter | None:
        with self._lock:
            self._slots, self._per_owner = slots, per_owner
            self._dispatch()
            waiting = self._queues.get(owner)
            if not waiting and self._busy < slots and self._held.get(owner, 0) < per_owner:
                self._take(owner)
                return None
            if len(waiting or ()) >= queue:
                held = self._held.get(owner, 0)
                ahead = held + len(waiting or ())
                per_slot = self._seconds.get(owner, 1.0)
                retry = math.ceil(per_slot * max(1, ahead) / max(1, min(per_owner, slots)))
                raise TooManyRequests(
                    f"{held} of your graders are being scored and {len(waiting or ())} wait "
                    f"(FTQ_GRADER_SLOTS_PER_OWNER {per_owner}, FTQ_GRADER_QUEUE_PER_OWNER {queue}); "
                    "retry when one has finished",
                    retry_after=min(retry, 3600),
                )
            waiter = _Waiter(asyncio.get_running_loop())
            self._queues.setdefault(owner, deque()).append(waiter)
            return waiter

    async def _wait(self, owner: str, waiter: _Waiter) -> None:
        try:
            await waiter.future
        except BaseException:  # cancelled (the client left): the place in line or the slot goes back
            with self._lock:
                if waiter.granted:
                    self._release(owner)
                else:
                    waiting = self._queues.get(owner)
                    if waiting is not None and waiter in waiting:
                        waiting.remove(waiter)
                        if not waiting:
                            del self._queues[owner]
                            if owner not in self._held:
                                self._served.pop(owner, None)
            raise

    def _take(self, owner: str) -> None:
        self._held[owner] = self._held.get(owner, 0) + 1
        self._busy += 1
        self._grants += 1
        self._served[owner] = self._grants

    def _release(self, owner: str) -> None:
        self._held[owner] -= 1
        if not self._held[owner]:
            del self._held[owner]
            if owner not in self._queues:
                self._served.pop(owner, None)
        self._busy -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Give free slots to waiting owners (under the lock)."""
        while self._busy < self._slots:
            # The owner holding the fewest slots, among equals the one served longest ago: a newcomer is
            # served before an owner whose queue was there first.
            ready = [o for o in self._queues if self._held.get(o, 0) < self._per_owner]
            if not ready:
                return
            owner = min(ready, key=lambda o: (self._held.get(o, 0), self._served.get(o, -1)))
            waiting = self._queues[owner]
            waiter = waiting.popleft()
            if not waiting:
                del self._queues[owner]
            waiter.granted = True
            self._take(owner)
            try:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future)
            except RuntimeError:  # its loop has closed: nobody waits there any more
                waiter.granted = False
                self._held[owner] -= 1
                if not self._held[owner]:
                    del self._held[owner]
                self._busy -= 1


# One pair of lanes per API process.
PROCESS_LANE = Lane("process")
LIGHT_LANE = Lane("light")


def check_allowed(grader: Grader, settings: Settings) -> None:
    """A 422 naming each score_model grader's `model` that the operator does not allow."""
    allowed = set(settings.grader_score_model_names)
    errors = [
        {
            "loc": ["body", *loc],
            "msg": f"model {model!r} is not one this server allows for score_model graders "
            f"(FTQ_GRADER_SCORE_MODELS: {', '.join(sorted(allowed)) or 'none'})",
            "type": "value_error",
        }
        for loc, model in score_models(grader)
        if model not in allowed
    ]
    if errors:
        raise SpecError(errors)


def limits_for(settings: Settings, owner: str) -> Limits:
    """The sandbox's limits, and the owner's run user (FTQ_RUN_AS_USER) that python graders run as."""
    uid = gid = None
    try:
        name = settings.run_user_for(owner)
    except LookupError as e:
        raise SpecError([{"loc": ["body", "grader"], "msg": str(e), "type": "value_error"}]) from None
    if name is not None:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise SpecError(
                [
                    {
                        "loc": ["body", "grader"],
                        "msg": f"run user {name!r} does not exist",
                        "type": "value_error",
                    }
                ]
            ) from None
        if pw.pw_uid == 0 or pw.pw_gid == 0:
            raise SpecError(
                [
                    {
                        "loc": ["body", "grader"],
                        "msg": f"run user {name!r} is privileged",
                        "type": "value_error",
                    }
                ]
            )
        uid, gid = pw.pw_uid, pw.pw_gid
    return Limits(
        cpu_seconds=settings.grader_cpu_seconds,
        memory_mb=settings.grader_memory_mb,
        timeout_seconds=settings.grader_timeout_seconds,
        processes=settings.grader_processes,
        python=settings.grader_python or settings.python,
        uid=uid,
        gid=gid,
        bwrap=settings.sandbox_bwrap,
    )


def _errors_of(grader: Grader, err: GraderError) -> dict[str, Any]:
    errors: dict[str, Any] = {
        "code": str(err.code),
        "message": err.message,
        "grader": err.grader,
        "limit": err.limit,
    }
    if grader.type == "python" or err.limit is not None:
        # OpenAI's names for a python grader's failure, so its clients read them as they do there.
        errors["python_grader_runtime_error"] = err.limit is None
        errors["python_grader_runtime_error_details"] = err.message
        errors["timeout"] = err.limit == "wall_clock"
    else:
        errors["other_error"] = True
    return errors


def run_blocking(body: GraderRunRequest, limits: Limits) -> GraderRunResponse:
    started = time.monotonic()
    sub: dict[str, float] = {}
    errors: dict[str, Any] = {}
    deadline = started + limits.timeout_seconds  # the request's python graders share its wall clock
    try:
        sample = sample_dict(body.model_sample)
        result = score(body.grader, sample, body.item, limits, score_model.generate, deadline)
        reward, sub = result.reward, result.sub_rewards
    except GraderError as e:
        reward, errors = 0.0, _errors_of(body.grader, e)
    metadata = GraderRunMetadata(
        errors=errors,
        execution_time=time.monotonic() - started,
        name=body.grader.name,
        type=body.grader.type,
        sub_rewards=sub,
    )
    return GraderRunResponse(reward=reward, metadata=metadata, sub_rewards=sub)


def lane_of(grader: Grader) -> Lane:
    return PROCESS_LANE if needs_process(grader) else LIGHT_LANE


async def run(body: GraderRunRequest, settings: Settings, owner: str) -> GraderRunResponse:
    """The grader's reward, scored in a worker thread (a python grader waits on its child process there,
    not on the event loop) once the owner has a slot of the grader's lane (TooManyRequests when the owner's
    queue there is full)."""
    check_allowed(body.grader, settings)
    limits = limits_for(settings, owner)
    lane = lane_of(body.grader)
    slots, per_owner = settings.grader_slots, settings.grader_slots_per_owner
    async with lane.slot(owner, slots, per_owner, settings.grader_queue_per_owner):
        return await anyio.to_thread.run_sync(lambda: run_blocking(body, limits), limiter=_THREADS)
