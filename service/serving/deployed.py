"""An engine that is a deployment (issue 49): the API asks the one scheduler for it (a queued row of
`deployments`), the worker places and launches it like any run (its devices, the owner's quotas, fair
share, its device time in /usage), and this side waits for it to answer at the address it wrote
(`endpoint.json`), loads adapters into it, counts its use, and stops it (a cancel) when the manager says
it is idle. An engine an earlier API process asked for that still runs is adopted, not started again.

The engine's key is stored with its row: the API sends it with every call to the engine, which refuses any
other caller."""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session

from ftq.contract.errors import ErrorCode
from ftq.contract.runs import read_endpoint
from ftq.contract.serving import Deployment, DeploymentAdapter, DeploymentList, ServingUsage
from ftq.contract.status import TERMINAL, JobStatus
from ftq.engine import INSTALL_COMMAND, EngineConfig, EngineError, EngineNotInstalled, adapter_rank
from ftq.engine.local import default_venv
from ftq.runtime import queue
from ftq.runtime.settings import Settings
from ftq.store.db import session_scope
from ftq.store.deployments import DeploymentRepository, device_seconds, get_deployment
from ftq.store.models import Deployment as DeploymentRow

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class EngineRun:
    """What the manager asks of an engine: whose, which (its key within the owner's), shown as what."""

    id: str
    owner: str
    key: str
    label: str
    config: EngineConfig
    log_path: Path


def wake(deployment_id: str) -> None:
    """Ask the worker to act on the deployment now; its reconcile sweep does otherwise, within seconds."""
    try:
        queue.send(queue.TASK_DEPLOYMENTS, deployment_id)
    except Exception as exc:
        log.warning(
            "deployment %s: the worker was not woken now (%s); its sweep will act", deployment_id, exc
        )


class EngineRefused(EngineError):
    """The scheduler refused the engine for a reason its owner can act on (their quota): the message is
    the scheduler's, safe to show them."""


class ScheduledEngine:
    """The Engine protocol over a deployment (see the module's docstring)."""

    def __init__(self, run: EngineRun, settings: Settings):
        self.run = run
        self.settings = settings
        self.id = run.id
        self._key = secrets.token_urlsafe(32)
        self._url: str | None = None
        self._http = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0), trust_env=False)

    # The Engine protocol ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._url is None:
            raise EngineError("the engine is not ready")
        return self._url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"}

    @property
    def model(self) -> str:
        return self.run.config.name

    @property
    def folder(self) -> Path:
        return self.settings.state_path("engines") / self.id

    def start(self) -> None:
        """Ask for the deployment (or adopt the owner's running one for this base). Without vLLM on this
        server, EngineNotInstalled at once (the worker's launch would fail the same way, later)."""
        if not default_venv().joinpath("bin", "python").exists():
            raise EngineNotInstalled(f"{default_venv()} has no vLLM: `{INSTALL_COMMAND}` installs it")
        self._ask()

    def _ask(self) -> None:
        c = self.run.config
        with session_scope() as session:
            repo = DeploymentRepository(session, self.run.owner)
            row = repo.active(self.run.key)
            if row is not None:
                self.id, self._key = row.id, row.api_key
                log.info("engine %s: adopted for %s of %s", row.id, self.run.label, self.run.owner)
            else:
                row = repo.add(
                    deployment_id=self.run.id,
                    key=self.run.key,
                    label=self.run.label,
                    launcher=self.settings.serve_launcher,
                    device=c.device,
                    devices=c.tensor_parallel if c.device == "cuda" else 1,
                    tensor_parallel_size=c.tensor_parallel,
                    priority="normal",
                    config={
                        "model": str(c.model),
                        "name": c.name,
                        "device": c.device,
                        "dtype": c.dtype,
                        "max_loras": c.max_loras,
                        "max_lora_rank": c.max_lora_rank,
                        "max_model_len": c.max_model_len,
                        "tensor_parallel": c.tensor_parallel,
                        "kv_cache_bytes": c.kv_cache_bytes,
                    },
                    api_key=self._key,
                )
            session.commit()
        wake(self.id)

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Until the worker has launched it and it answers; EngineError when it ended first (with the
        reason its run gave) or the time is out."""
        deadline = time.monotonic() + timeout
        while True:
            with session_scope() as session:
                row = get_deployment(session, self.id)
                status = row.status if row is not None else None
                error = (row.error_message or row.error_code or "") if row is not None else "it is gone"
                code = row.error_code if row is not None else None
                if row is not None and row.status == JobStatus.running and row.ready_at is not None:
                    self._url = row.endpoint
            if status is None or status in TERMINAL or status == JobStatus.cancelling:
                if INSTALL_COMMAND in error:
                    raise EngineNotInstalled(error)
                if code == ErrorCode.quota_exceeded:
                    raise EngineRefused(error)
                raise EngineError(f"the engine's run ended ({status}) before it answered: {error}")
            if status == JobStatus.running:
                url = self._url or read_endpoint(self.folder)
                if url is not None and self._answers(url):
                    self._url = url
                    with session_scope() as session:
                        DeploymentRepository(session, self.run.owner).mark_ready(self.id, url)
                        session.commit()
                    return
            if time.monotonic() > deadline:
                raise EngineError(f"the engine did not answer within {timeout:.0f} s (it was {status})")
            time.sleep(_POLL_SECONDS)

    def healthy(self) -> bool:
        return self._url is not None and self._answers(self._url)

    def load_adapter(self, name: str, path: Path) -> None:
        rank = adapter_rank(path)
        if rank > self.run.config.lora_rank:
            raise EngineError(
                f"adapter {name!r} has LoRA rank {rank}, above this engine's max_lora_rank "
                f"{self.run.config.lora_rank}: start an engine with max_lora_rank >= {rank}"
            )
        # In place: an engine adopted from an earlier API process may hold it already (a plain load of a
        # name it holds is vLLM's 400), and a name whose folder has new weights is loaded again.
        body = {"lora_name": name, "lora_path": str(path.resolve()), "load_inplace": True}
        self._post("/load_lora_adapter", body)
        self._remember(name)

    def _remember(self, name: str) -> None:
        with session_scope() as session:
            repo = DeploymentRepository(session, self.run.owner)
            row = repo.get(self.id)
            if row is not None:
                repo.add_adapter(row, name, time.time())
            session.commit()

    def unload_adapter(self, name: str) -> None:
        self._post("/unload_lora_adapter", {"lora_name": name})
        self._forget(name)

    def _forget(self, name: str) -> None:
        with session_scope() as session:
            repo = DeploymentRepository(session, self.run.owner)
            row = repo.get(self.id)
            if row is not None:
                repo.drop_adapter(row, name)
            session.commit()

    def adapters(self) -> list[str]:
        r = self._request("GET", "/models")
        return [str(m["id"]) for m in r.json()["data"] if m["id"] != self.model]

    def stop(self, timeout: float = 30.0) -> None:
        """Stop it: the worker ends its run (at once when it was still queued)."""
        with session_scope() as session:
            moved = DeploymentRepository(session, self.run.owner).request_cancel(self.id)
            session.commit()
        if moved is not None:
            wake(self.id)
        self._http.close()

    # HTTP ----------------------------------------------------------------------------------------------

    def _answers(self, url: str) -> bool:
        try:
            root = url.removesuffix("/v1")
            return self._http.get(f"{root}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            r = self._http.request(method, self.base_url + path, json=body, headers=self.headers)
        except httpx.HTTPError as exc:
            raise EngineError(f"{method} {path}: the engine did not answer ({exc})") from None
        if r.status_code != 200:
            raise EngineError(f"{method} {path}: {r.status_code} {r.text[:2000]}")
        return r

    def _post(self, path: str, body: dict[str, Any]) -> None:
        self._request("POST", path, body)


def record_use(owner: str, deployment_id: str, prompt_tokens: int, completion_tokens: int) -> None:
    """A call used the deployment now (with the tokens it answered, where it answered)."""
    with session_scope() as session:
        DeploymentRepository(session, owner).used(deployment_id, prompt_tokens, completion_tokens)
        session.commit()


# The native view -------------------------------------------------------------------------------------------


def _status(row: DeploymentRow) -> str:
    """A run's status as a deployment's: launched and not yet answering is `starting`; its end by a stop
    (idle, or asked) is `stopped`."""
    if row.status == JobStatus.queued:
        return "queued"
    if row.status in (JobStatus.starting, JobStatus.running):
        return "ready" if row.ready_at is not None else "starting"
    if row.status == JobStatus.cancelling:
        return "stopping"
    if row.status == JobStatus.failed:
        return "failed"
    return "stopped"


def _unix(ts: object) -> float | None:
    return round(ts.timestamp(), 3) if ts is not None else None  # type: ignore[attr-defined]


def stop(session: Session, owner: str, deployment_id: str) -> Deployment | None:
    """Stop the owner's deployment (DELETE /deployments/{id}); None when they have none of that id."""
    repo = DeploymentRepository(session, owner)
    if repo.get(deployment_id) is None:
        return None
    if repo.request_cancel(deployment_id) is not None:
        session.commit()
        wake(deployment_id)
    session.expire_all()
    return next(d for d in listing(session, owner).data if d.id == deployment_id)


def listing(session: Session, owner: str) -> DeploymentList:
    """The owner's deployments (those not over, and the last few that are), oldest first, with why each
    queued one waits and the use of them all; never another owner's, never an engine's address."""
    repo = DeploymentRepository(session, owner)
    rows = repo.listing()
    queue = repo.queue_of(r.id for r in rows if r.status == JobStatus.queued)
    data = []
    for r in rows:
        place = queue.get(r.id)
        data.append(
            Deployment(
                id=r.id,
                base=r.label,
                status=_status(r),  # type: ignore[arg-type]
                device=r.device,  # type: ignore[arg-type]
                launcher=r.launcher,  # type: ignore[arg-type]
                devices=r.devices,
                tensor_parallel_size=r.tensor_parallel_size,
                queue_reason=place.reason if place is not None else None,
                error=r.error_message if r.status == JobStatus.failed else None,
                adapters=[
                    DeploymentAdapter(model=name, loaded_at=float(at))
                    for name, at in sorted((r.adapters or {}).items(), key=lambda kv: kv[1])
                ],
                started_at=_unix(r.created_at) or 0.0,
                ready_at=_unix(r.ready_at),
                last_used=_unix(r.last_used_at) or 0.0,
                device_seconds=round(device_seconds(r), 3),
                requests=r.requests,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
            )
        )
    since, requests, prompt, completion = repo.totals()
    usage = ServingUsage(
        since=_unix(since) or round(time.time(), 3),
        requests=requests,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )
    return DeploymentList(data=data, usage=usage)
