"""The API process's hold on its engines: one per (owner, base model), never shared between owners, with
the owner's adapters on that base loaded into it on first use; asked for on the first call (which waits
for it), stopped after FTQ_SERVE_IDLE_SECONDS without a request by a background sweep.

Each engine is a deployment (service.serving.deployed): a run the one scheduler places with the jobs
(devices, quotas, fair share, /usage) and the worker launches on local devices or on SLURM. This module
keeps what one API process knows of them: calls in flight (an engine is never stopped under one), the
adapters it loaded, and the caps on how many engines it holds. What every process shares (status, use,
tokens in and out) is in the store; `GET /deployments` reads it there.

Engines are asked for from one thread that lives as long as the manager (`_starter`)."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from ftq.engine import INSTALL_COMMAND, Engine, EngineConfig, EngineError, EngineNotInstalled
from ftq.planning.serving import TooLarge, engine_size
from ftq.runtime.settings import Settings
from service.errors import ServiceUnavailable, TooManyRequests
from service.openai.errors import OpenAIError
from service.serving.deployed import EngineRefused, EngineRun, ScheduledEngine, record_use
from service.serving.service import Target, not_servable

log = logging.getLogger(__name__)

# Makes the engine a manager asks for: a deployment (ScheduledEngine) here; a fake in tests.
EngineFactory = Callable[[EngineRun], Engine]
_POLL_SECONDS = 0.2  # how often a waiting call looks at a starting engine


@dataclass(eq=False)
class _Entry:
    """One engine and what the manager knows of it."""

    id: str
    owner: str
    key: str
    label: str
    device: str
    engine: Engine
    log_path: Path
    started_at: float  # wall clock
    last_used: float  # monotonic
    last_used_at: float  # wall clock
    status: str = "starting"  # starting | ready | failed | stopping
    ready_at: float | None = None
    error: str | None = None
    not_installed: bool = False
    refused: str | None = None  # the scheduler's refusal, for its owner to read (their quota)
    in_flight: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    adapters: dict[str, tuple[Path, float]] = field(default_factory=dict)  # name -> (folder, loaded at)
    load_lock: threading.Lock = field(default_factory=threading.Lock)
    started_mono: float = field(default_factory=time.monotonic)
    ready_event: threading.Event = field(default_factory=threading.Event)


class Lease:
    """One call's hold on a ready engine: the engine is not stopped for idleness while a lease is out."""

    def __init__(self, manager: EngineManager, entry: _Entry, target: Target):
        self._manager = manager
        self._entry = entry
        self.target = target
        self._released = False

    @property
    def base_url(self) -> str:
        return self._entry.engine.base_url

    @property
    def headers(self) -> dict[str, str]:
        """The engine's own key, sent with every request to it."""
        return self._entry.engine.headers

    @property
    def engine_model(self) -> str:
        """The `model` the engine serves this target as: the adapter's name, or the engine's base name."""
        return self.target.name if self.target.adapter is not None else self._entry.engine.model

    def record(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Count a request's tokens in and out (from the engine's `usage`)."""
        self._manager._record(self._entry, prompt_tokens, completion_tokens)

    def adapter_gone(self) -> None:
        """The engine no longer serves this lease's adapter: load it again on the next call."""
        with self._entry.load_lock:
            self._entry.adapters.pop(self.target.name, None)

    def broken(self, why: str) -> None:
        """The engine stopped answering: forget it (the next call starts another)."""
        self._manager._fail(self._entry, why)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._manager._release(self._entry)

    async def finish(self) -> None:
        """Release it, and wait until its use is in the store (so that a client that got its answer sees
        it counted in /deployments)."""
        self.release()
        pending = self._manager._pending
        if pending is not None:
            await anyio.to_thread.run_sync(pending.result)


class EngineManager:
    """The API process's engines (see the module's docstring)."""

    def __init__(self, settings: Settings, factory: EngineFactory | None = None):
        self.settings = settings
        self._factory: EngineFactory = factory or (lambda run: ScheduledEngine(run, settings))
        # The store's counts of each engine's use, written in order off the event loop.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftq-engine-use")
        self._pending: Future[None] | None = None
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._stopping: dict[str, _Entry] = {}
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftq-engine-start")
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()
        self._atexit = False

    # A call's engine ---------------------------------------------------------------------------------------

    async def acquire(self, owner: str, target: Target) -> Lease:
        """A lease on the owner's engine for `target`'s base, ready and with `target`'s adapter loaded:
        started first where there is none (the call waits for it, up to FTQ_SERVE_START_SECONDS)."""
        entry, fresh = self._claim(owner, target)
        try:
            if fresh:
                self._starter.submit(self._start, entry, target)
            deadline = time.monotonic() + self.settings.serve_start_seconds
            while entry.status == "starting":
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(
                        f"the engine for {target.label} is still starting after "
                        f"{self.settings.serve_start_seconds:.0f} s (FTQ_SERVE_START_SECONDS); retry shortly",
                        retry_after=10,
                    )
                await anyio.sleep(_POLL_SECONDS)
            if entry.status != "ready":
                raise _start_failed(entry, target)
            if target.adapter is not None and target.name not in entry.adapters:
                await anyio.to_thread.run_sync(self._load, entry, target)
            return Lease(self, entry, target)
        except BaseException:
            self._release(entry)
            raise

    def _claim(self, owner: str, target: Target) -> tuple[_Entry, bool]:
        """The owner's entry for the target's base, in use by one more call; a new one where there is
        none, within FTQ_SERVE_ENGINES_PER_OWNER and FTQ_SERVE_MAX_ENGINES (stopping the least recently
        used idle engine to make room)."""
        if self._closed.is_set():
            raise ServiceUnavailable("the server is shutting down")
        now, wall = time.monotonic(), time.time()
        victims: list[_Entry] = []
        with self._lock:
            entry = self._entries.get((owner, target.key))
            if entry is not None:
                entry.in_flight += 1
                entry.last_used, entry.last_used_at = now, wall
                return entry, False
            own = [e for e in self._entries.values() if e.owner == owner]
            if len(own) >= self.settings.serve_engines_per_owner:
                victim = _idlest(own)
                if victim is None:
                    raise TooManyRequests(
                        f"your {len(own)} engine(s) (FTQ_SERVE_ENGINES_PER_OWNER) are all answering calls; "
                        "retry when one is free",
                        retry_after=5,
                    )
                victims.append(self._drop(victim))
            if len(self._entries) >= self.settings.serve_max_engines:
                victim = _idlest(list(self._entries.values()))
                if victim is None:
                    raise ServiceUnavailable(
                        f"all {len(self._entries)} engines of this server (FTQ_SERVE_MAX_ENGINES) are "
                        "answering calls; retry shortly",
                        retry_after=5,
                    )
                victims.append(self._drop(victim))
            entry = self._new_entry(owner, target, now, wall)
            self._entries[(owner, target.key)] = entry
            self._start_sweeper()
        for victim in victims:
            self._stop_later(victim, "to make room for another engine")
        return entry, True

    def _new_entry(self, owner: str, target: Target, now: float, wall: float) -> _Entry:
        config = EngineConfig(
            model=target.base,
            name=target.engine_name,
            device=self.settings.serve_device,
            max_lora_rank=self.settings.serve_max_lora_rank,
            max_model_len=target.max_model_len,
            tensor_parallel=self._tensor_parallel(target),
        )
        engine_id = "dep_" + secrets.token_hex(8)
        log_path = self.settings.state_path("engines") / f"{engine_id}.log"
        engine = self._factory(EngineRun(engine_id, owner, target.key, target.label, config, log_path))
        return _Entry(
            id=engine_id,
            owner=owner,
            key=target.key,
            label=target.label,
            device=self.settings.serve_device,
            engine=engine,
            log_path=log_path,
            started_at=wall,
            last_used=now,
            last_used_at=wall,
            in_flight=1,
        )

    def _tensor_parallel(self, target: Target) -> int:
        """The GPUs the base needs (ftq.planning.serving, from the estimate's count of its weights); a
        base no node can hold is a 400 saying what it would take."""
        if self.settings.serve_device != "cuda":
            return 1
        try:
            model_config = json.loads((target.base / "config.json").read_text())
        except (OSError, ValueError):
            return 1
        pool = len(self.settings.gpu_indices) if self.settings.serve_launcher == "local" else 0
        per_node = min(self.settings.serve_gpus_per_node, pool) if pool else self.settings.serve_gpus_per_node
        try:
            size = engine_size(
                model_config,
                device="cuda",
                gpu_memory_bytes=self.settings.gpu_memory_bytes_for(None),
                gpus_per_node=per_node,
            )
        except TooLarge as exc:
            raise not_servable(f"{target.label} cannot be served here: {exc}") from None
        return size.tensor_parallel

    def _start(self, entry: _Entry, target: Target) -> None:
        """In the starter thread: ask for the engine (quick), then wait for it in a thread of its own."""
        try:
            entry.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            entry.engine.start()
            entry.id = getattr(entry.engine, "id", entry.id)  # an adopted deployment keeps its own
        except Exception as exc:
            entry.not_installed = isinstance(exc, EngineNotInstalled)
            self._fail(entry, exc)
            return
        log.info("engine %s: starting for %s (%s) of %s", entry.id, target.label, entry.device, entry.owner)
        threading.Thread(target=self._wait_ready, args=(entry,), name=f"ftq-{entry.id}", daemon=True).start()

    def _wait_ready(self, entry: _Entry) -> None:
        try:
            entry.engine.wait_ready(timeout=max(self.settings.serve_start_seconds, 60.0))
        except Exception as exc:
            entry.refused = str(exc) if isinstance(exc, EngineRefused) else None
            self._fail(entry, exc)
            return
        with self._lock:
            if entry.status == "starting":
                entry.status, entry.ready_at = "ready", time.time()
        entry.ready_event.set()
        log.info("engine %s: ready in %.1f s", entry.id, time.monotonic() - entry.started_mono)

    def _load(self, entry: _Entry, target: Target) -> None:
        """Load the target's adapter into the entry's engine (once, however many calls ask at once)."""
        assert target.adapter is not None
        with entry.load_lock:
            if target.name in entry.adapters:
                return
            try:
                entry.engine.load_adapter(target.name, target.adapter)
            except EngineError as exc:
                # The engine's message names the folder: the caller sees the model's name instead.
                reason = str(exc).replace(str(target.adapter.resolve()), target.name)
                reason = reason.replace(str(target.adapter), target.name)
                log.warning("engine %s: loading %s failed: %s", entry.id, target.name, exc)
                raise OpenAIError(
                    f"{target.name} could not be loaded into its engine: {reason[:500]}",
                    param="model",
                    code="model_not_servable",
                ) from None
            entry.adapters[target.name] = (target.adapter, time.time())
        log.info("engine %s: loaded %s", entry.id, target.name)

    # Accounting and release ---------------------------------------------------------------------------

    def _record(self, entry: _Entry, prompt_tokens: int, completion_tokens: int) -> None:
        self._store_use(entry, prompt_tokens, completion_tokens)
        with self._lock:
            entry.requests += 1
            entry.prompt_tokens += prompt_tokens
            entry.completion_tokens += completion_tokens

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.in_flight = max(0, entry.in_flight - 1)
            entry.last_used, entry.last_used_at = time.monotonic(), time.time()
        if entry.status == "ready":
            self._store_use(entry, 0, 0)

    def _store_use(self, entry: _Entry, prompt_tokens: int, completion_tokens: int) -> None:
        """The deployment's use in the store (its last use, which the worker's backstop reads; its tokens),
        written in order by one thread; `_pending` is the newest write."""
        if isinstance(entry.engine, ScheduledEngine) and not self._closed.is_set():
            with contextlib.suppress(RuntimeError):  # the writer is shut down: the process is ending
                self._pending = self._writer.submit(
                    _stored, entry.owner, entry.id, prompt_tokens, completion_tokens
                )

    def _fail(self, entry: _Entry, why: Exception | str) -> None:
        """The engine failed to start or stopped answering: forgotten, so that the next call starts
        another; its log is kept."""
        with self._lock:
            entry.status = "failed"
            entry.error = str(why)
            if self._entries.get((entry.owner, entry.key)) is entry:
                del self._entries[(entry.owner, entry.key)]
        entry.ready_event.set()
        log.error("engine %s (%s of %s) failed: %s", entry.id, entry.label, entry.owner, why)
        with contextlib.suppress(Exception):
            entry.engine.stop()

    # Scale to zero ----------------------------------------------------------------------------------------

    def sweep(self, now: float | None = None) -> list[str]:
        """Stop the engines no call has used for FTQ_SERVE_IDLE_SECONDS (none in flight); their ids."""
        now = time.monotonic() if now is None else now
        idle = self.settings.serve_idle_seconds
        with self._lock:
            stale = [
                e
                for e in self._entries.values()
                if e.in_flight == 0 and e.status == "ready" and now - e.last_used >= idle
            ]
            for e in stale:
                self._drop(e)
        for e in stale:
            self._stop_later(e, f"idle for {idle:.0f} s")
        return [e.id for e in stale]

    def forget(self, owner: str, deployment_id: str) -> None:
        """The deployment was stopped from outside (DELETE /deployments/{id}): calls no longer reach it;
        the next one asks for another."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.owner == owner and entry.id == deployment_id:
                    del self._entries[key]
                    entry.status = "stopping"

    def _drop(self, entry: _Entry) -> _Entry:
        """Under the lock: no longer found by calls; shown as stopping until its stop is done."""
        self._entries.pop((entry.owner, entry.key), None)
        entry.status = "stopping"
        self._stopping[entry.id] = entry
        return entry

    def _stop_later(self, entry: _Entry, why: str) -> None:
        def stop() -> None:
            log.info("engine %s (%s of %s): stopping, %s", entry.id, entry.label, entry.owner, why)
            try:
                entry.engine.stop()
                with contextlib.suppress(OSError):
                    entry.log_path.unlink()
            finally:
                with self._lock:
                    self._stopping.pop(entry.id, None)

        threading.Thread(target=stop, name=f"ftq-stop-{entry.id}", daemon=True).start()

    def _start_sweeper(self) -> None:
        """Under the lock: the sweep thread, and the stop of every engine at exit, from the first engine."""
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True
        if self._sweeper is not None:
            return
        every = max(0.5, min(30.0, self.settings.serve_idle_seconds / 4))

        def run() -> None:
            while not self._closed.wait(every):
                try:
                    self.sweep()
                except Exception:  # a sweep that fails must not end the thread
                    log.exception("engine sweep failed")

        self._sweeper = threading.Thread(target=run, name="ftq-engine-sweep", daemon=True)
        self._sweeper.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop every engine (at the API's shutdown); idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            entries = list(self._entries.values()) + list(self._stopping.values())
            self._entries.clear()
        threads = [threading.Thread(target=e.engine.stop, args=(timeout,), daemon=True) for e in entries]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 10)
        self._starter.shutdown(wait=False, cancel_futures=True)
        self._writer.shutdown(wait=True)


def _stored(owner: str, deployment_id: str, prompt_tokens: int, completion_tokens: int) -> None:
    try:
        record_use(owner, deployment_id, prompt_tokens, completion_tokens)
    except Exception:  # the count is not worth a failed call; the log says it was lost
        log.exception("deployment %s: its use was not stored", deployment_id)


def _idlest(entries: list[_Entry]) -> _Entry | None:
    """The least recently used ready engine with no call in flight."""
    idle = [e for e in entries if e.in_flight == 0 and e.status == "ready"]
    return min(idle, key=lambda e: e.last_used) if idle else None


def _start_failed(entry: _Entry, target: Target) -> Exception:
    """What a call waiting for an engine that failed to start is told: for a missing engine, the command
    that installs it; otherwise that it failed (the reason, with the engine's log, is in the API's log)."""
    if entry.refused is not None:
        return OpenAIError(
            f"the engine for {target.label} was refused: {entry.refused}",
            code="quota_exceeded",
            status=429,
        )
    if entry.not_installed:
        return OpenAIError(
            f"vLLM, the generation engine, is not installed on this server: `{INSTALL_COMMAND}` installs it "
            "(the operator runs it in the server's checkout)",
            code="engine_not_installed",
            status=503,
        )
    return ServiceUnavailable(
        f"the engine for {target.label} failed to start (engine {entry.id}; the server's log says why); "
        "retry, or ask the operator"
    )
