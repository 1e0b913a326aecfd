"""What the Tinker API keeps in the API process's memory (this slice: one API process, `ftq up`'s
default): the futures the SDK polls, each training client's queue of calls in seq_id order, the hosts'
addresses, and the sampling sessions.

- A future is resolved by a thread: a training call by its model's queue thread (one per model, so a
  model's calls reach its host one at a time and in the order of their seq_ids, whatever order the SDK's
  concurrent submissions arrive in), a create by the thread that waits for the host to answer, a sample
  by the sampling pool.
- A retried call (the same model and seq_id) is answered with the future of the first (idempotent).
- A seq_id the SDK never sends (a submission it gave up on) would stall its model: after
  `GAP_SECONDS` with later calls waiting, the queue goes on with the next one it has.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from ftq.contract.tinker import KEY_HEADER

log = logging.getLogger(__name__)

GAP_SECONDS = 30.0
# Results the SDK has not fetched within this long are dropped (it caches what it fetched).
FUTURE_TTL_SECONDS = 3600.0


class CallFailed(Exception):
    """A call that ended in an error the SDK is told about (`category`: user or server)."""

    def __init__(self, message: str, category: str = "server"):
        super().__init__(message)
        self.category = category


@dataclass
class Future:
    id: str
    owner: str
    proto: bool = False  # the result is protobuf bytes (forward_backward, sample)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: CallFailed | None = None
    created: float = field(default_factory=time.monotonic)

    def resolve(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except CallFailed as exc:
            self.error = exc
        except Exception as exc:
            log.exception("tinker future %s failed", self.id)
            self.error = CallFailed(f"{type(exc).__name__}: {exc}", "server")
        self.done.set()


@dataclass(frozen=True)
class Host:
    url: str
    key: str


@dataclass(frozen=True)
class Sampler:
    """A sampling session: whose, on which training client's host, with which weights."""

    id: str
    owner: str
    model_id: str
    base: str  # the catalog alias (what the SDK loads a tokenizer by)
    adapter: str | None  # sampler weights' folder; None: the base alone (base_only) or resident
    base_only: bool
    model_path: str | None


class ModelQueue:
    """One model's calls, run one at a time in seq_id order by a thread of its own."""

    def __init__(self, model_id: str, next_seq: int = 1):
        self.model_id = model_id
        self.next_seq = next_seq
        self.pending: dict[int, tuple[Future, Callable[[], Any]]] = {}
        self.cond = threading.Condition()
        # Held while one of its calls reaches its host (a training call, or a sample): the idle save
        # takes it, so no call runs on a host whose state is being saved and whose run is about to stop.
        self.running = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"tinker-{model_id}", daemon=True)
        self.thread.start()

    def put(self, seq_id: int, future: Future, fn: Callable[[], Any]) -> None:
        with self.cond:
            self.pending[seq_id] = (future, fn)
            self.cond.notify()

    def _next(self) -> tuple[int, Future, Callable[[], Any]]:
        with self.cond:
            waited_since: float | None = None
            while True:
                if self.next_seq in self.pending:
                    seq = self.next_seq
                    break
                earlier = [s for s in self.pending if s < self.next_seq]
                if earlier:  # below the line (a model loaded at seq 0, or a gap already passed)
                    seq = min(earlier)
                    break
                if self.pending:
                    waited_since = waited_since or time.monotonic()
                    if time.monotonic() - waited_since > GAP_SECONDS:
                        seq = min(self.pending)
                        log.warning(
                            "model %s: seq_id %d never came; going on with %d",
                            self.model_id,
                            self.next_seq,
                            seq,
                        )
                        break
                self.cond.wait(timeout=1.0)
            future, fn = self.pending.pop(seq)
            self.next_seq = max(self.next_seq, seq + 1)
            return seq, future, fn

    def _run(self) -> None:
        while True:
            _, future, fn = self._next()
            with self.running:
                future.resolve(fn)


class Runtime:
    """The API process's Tinker state (see the module's docstring): `app.state.tinker`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.futures: dict[str, Future] = {}
        self.by_call: dict[tuple[str, str, int], str] = {}  # (owner, model or session, seq) -> future id
        self.queues: dict[str, ModelQueue] = {}
        self.hosts: dict[str, Host] = {}
        self.samplers: dict[str, Sampler] = {}
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tinker")
        self.http = httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0), trust_env=False)
        self.closed = threading.Event()
        self.sweeper: threading.Thread | None = None
        self.routes_noted: set[str] = set()  # samplers whose way of sampling was logged

    def note_route(self, sampler_id: str) -> bool:
        """True the first time for a sampler: its way of sampling (engine or host) is logged once."""
        with self.lock:
            if sampler_id in self.routes_noted:
                return False
            self.routes_noted.add(sampler_id)
            return True

    def close(self) -> None:
        self.closed.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()

    def start_sweeper(self, every: float, sweep: Callable[[], Any]) -> None:
        """The idle sweep's thread (from the first training client on): `sweep` every `every` seconds."""
        with self.lock:
            if self.sweeper is not None:
                return

            def run() -> None:
                while not self.closed.wait(every):
                    try:
                        sweep()
                    except Exception:  # a sweep that fails must not end the thread
                        log.exception("tinker idle sweep failed")

            self.sweeper = threading.Thread(target=run, name="tinker-idle-sweep", daemon=True)
            self.sweeper.start()

    # Futures ------------------------------------------------------------------------------------------

    def new_future(self, owner: str, *, proto: bool = False) -> Future:
        future = Future("req_" + secrets.token_hex(12), owner, proto=proto)
        with self.lock:
            self._expire()
            self.futures[future.id] = future
        return future

    def _expire(self) -> None:
        now = time.monotonic()
        for fid in [f for f, fut in self.futures.items() if now - fut.created > FUTURE_TTL_SECONDS]:
            del self.futures[fid]
        alive = set(self.futures)
        self.by_call = {k: v for k, v in self.by_call.items() if v in alive}

    def future(self, owner: str, future_id: str) -> Future | None:
        with self.lock:
            f = self.futures.get(future_id)
        return f if f is not None and f.owner == owner else None

    def once(self, owner: str, scope: str, seq_id: int, *, proto: bool = False) -> tuple[Future, bool]:
        """The future of the call (owner, model, seq_id): a new one (True), or the first's on a retry."""
        key = (owner, scope, seq_id)
        with self.lock:
            existing = self.by_call.get(key)
            if existing is not None and existing in self.futures:
                return self.futures[existing], False
        future = self.new_future(owner, proto=proto)
        with self.lock:
            existing = self.by_call.get(key)
            if existing is not None and existing in self.futures:
                self.futures.pop(future.id, None)
                return self.futures[existing], False
            self.by_call[key] = future.id
        return future, True

    def in_background(self, future: Future, fn: Callable[[], Any]) -> None:
        self.pool.submit(future.resolve, fn)

    # Models --------------------------------------------------------------------------------------------

    def queue(self, model_id: str, next_seq: int = 1) -> ModelQueue:
        with self.lock:
            q = self.queues.get(model_id)
            if q is None:
                q = self.queues[model_id] = ModelQueue(model_id, next_seq)
            return q

    def call(self, host: Host, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """One operation on a host; its refusal as the SDK's user error, anything else a server error."""
        try:
            r = self.http.post(f"{host.url}/{op}", json=body, headers={KEY_HEADER: host.key})
        except httpx.HTTPError as exc:
            raise CallFailed(f"the training client's process did not answer {op} ({exc})", "server") from None
        try:
            answer: dict[str, Any] = r.json()
        except ValueError:
            answer = {"error": r.text[:2000]}
        if r.status_code == 400:
            raise CallFailed(str(answer.get("error")), "user")
        if r.status_code != 200:
            raise CallFailed(f"{op}: {answer.get('error') or r.status_code}", "server")
        return answer
