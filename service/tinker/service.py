"""The Tinker API's rules (issue 52): sessions, training clients (runs the one scheduler places, each a
`trainer.tinker_host` process), their calls in seq_id order, checkpoints, sampling sessions, and the REST
client's views. Every read of the store goes through the owner filter (`TinkerRepository`): another
owner's session, model, sampler or checkpoint is the 404 of one that does not exist.

What lives in the API process's memory (`service.tinker.runtime`): futures, the per-model queues, the
hosts' addresses and the sampling sessions. A restarted API forgets them: the SDK's pending futures then
fail, and a model is reached again once its next call finds its host running (its address is in the
store and its folder)."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract.runs import read_endpoint
from ftq.contract.spec import looks_local
from ftq.contract.status import TERMINAL, JobStatus
from ftq.contract.tinker import (
    IDLE_KIND,
    IDLE_NAME,
    LOSS_FNS,
    TinkerPath,
    checkpoint_folder,
    client_folder,
    valid_name,
)
from ftq.runtime import queue
from ftq.runtime.settings import Settings
from ftq.store.db import session_scope
from ftq.store.models import TinkerCheckpoint, TrainingClient
from ftq.store.training_clients import (
    ACTIVE,
    TinkerRepository,
    get_training_client,
    mark_idle_saved,
    next_model_seq,
    unused_since,
)
from ftq.store.transitions import utcnow
from service.errors import BadRequest, NotFound
from service.openai.models import catalog
from service.paths import PathRefused, resolve_local
from service.serving.engines import EngineManager
from service.tinker.runtime import CallFailed, Host, Runtime, Sampler

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 900.0
META_FILE = "tinker_state.json"  # trainer.tinker_host's record of a saved state's LoRA and base


def wake(model_id: str) -> None:
    """Ask the worker to act on the training client now; its reconcile sweep does otherwise."""
    try:
        queue.send(queue.TASK_TRAINING_CLIENTS, model_id)
    except Exception as exc:
        log.warning(
            "training client %s: the worker was not woken now (%s); its sweep will act", model_id, exc
        )


def unsupported(what: str) -> BadRequest:
    return BadRequest(f"{what} is not supported by this server (ftq's Tinker API; see docs/tinker.md)")


def _saved_idle(row: TrainingClient) -> bool:
    """Saved idle, its run stopping or stopped: its next call brings it back."""
    return row.idle_state is not None and row.status in (JobStatus.running, JobStatus.paused)


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


class TinkerService:
    def __init__(self, settings: Settings, runtime: Runtime, engines: EngineManager | None = None):
        self.settings = settings
        self.rt = runtime
        self.engines = engines  # the serving engines (service.serving), where samples go when they can

    @property
    def tinker_dir(self) -> Path:
        return self.settings.state_path("tinker")

    # Sessions ------------------------------------------------------------------------------------------

    def create_session(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("user_metadata") if isinstance(body.get("user_metadata"), dict) else None
        row = TinkerRepository(session, owner).add_session(meta)
        session.commit()
        return {"session_id": row.id, "type": "create_session"}

    def heartbeat(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        if not TinkerRepository(session, owner).heartbeat(str(body.get("session_id"))):
            raise NotFound("no such session")
        session.commit()
        return {"type": "session_heartbeat"}

    def finish_session(self, session: Session, owner: str, session_id: str) -> None:
        """The SDK's close(): the session's training clients stop (their devices go back, their time is in
        the owner's usage); what they saved stays."""
        repo = TinkerRepository(session, owner)
        if repo.get_session(session_id) is None:
            raise NotFound("no such session")
        repo.finish_session(session_id)
        stopped = [r.id for r in repo.clients_of_session(session_id) if repo.request_cancel(r.id)]
        session.commit()
        for model_id in stopped:
            wake(model_id)

    def _owned_session(self, repo: TinkerRepository, session_id: Any) -> None:
        if not isinstance(session_id, str) or repo.get_session(session_id) is None:
            raise NotFound("no such session")

    # Bases ---------------------------------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        cat = catalog(self.settings.openai_models)
        return {
            "supported_models": [
                {"model_name": alias, "trainable": True, "sampleable": True}
                for alias in sorted(cat.templates)
            ]
        }

    def _base(self, alias: Any) -> tuple[str, Path, dict[str, Any]]:
        """A catalog alias's local folder and template; a name not in the catalog is a 400 naming them."""
        templates = catalog(self.settings.openai_models).templates
        if not isinstance(alias, str) or alias not in templates:
            raise BadRequest(
                f"base_model {alias!r} is not in this server's catalog; trainable bases: "
                + ", ".join(sorted(templates))
            )
        template = templates[alias]
        name = str((template.get("model") or {}).get("name_or_path"))
        try:
            if looks_local(name):
                return alias, Path(resolve_local(name, self.settings.allowed_roots)), template
            from huggingface_hub import snapshot_download

            return alias, Path(snapshot_download(name, local_files_only=True)), template
        except (PathRefused, Exception):
            raise BadRequest(
                f"base_model {alias!r} is not on this server (its model folder is gone)"
            ) from None

    def _tokenizer_id(self, alias: str) -> str:
        """What the SDK loads the tokenizer by: the catalog's `tokenizer_id`, else its hub id, else the base's
        local folder (readable where the client shares this server's file system)."""
        template = catalog(self.settings.openai_models).templates.get(alias) or {}
        if template.get("tokenizer_id"):
            return str(template["tokenizer_id"])
        try:
            return str(self._base(alias)[1])
        except BadRequest:
            return alias

    # Training clients ----------------------------------------------------------------------------------

    def create_model(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        repo = TinkerRepository(session, owner)
        self._owned_session(repo, body.get("session_id"))
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise unsupported(f"optimizer {optimizer!r}")
        lora = body.get("lora_config") or {}
        rank = int(lora.get("rank") or 32)
        if not 1 <= rank <= 512:
            raise BadRequest(f"lora_config.rank {rank} is outside 1..512")
        alias, folder, template = self._base(body.get("base_model"))
        config = {
            "base": alias,
            "base_folder": str(folder),
            "lora": {
                "rank": rank,
                "seed": lora.get("seed"),
                "train_attn": bool(lora.get("train_attn", True)),
                "train_mlp": bool(lora.get("train_mlp", True)),
                "train_unembed": bool(lora.get("train_unembed", True)),
            },
        }
        return self._add_client(session, owner, body, alias, template, config, rank, load=None)

    def _add_client(
        self,
        session: Session,
        owner: str,
        body: dict[str, Any],
        alias: str,
        template: dict[str, Any],
        config: dict[str, Any],
        rank: int,
        load: dict[str, Any] | None,
    ) -> dict[str, Any]:
        repo = TinkerRepository(session, owner)
        self.start_idle_sweep()
        seq = int(body.get("model_seq_id") or 0)
        model_id = f"{body['session_id']}:train:{seq}"
        future, new = self.rt.once(owner, body["session_id"], -1 - seq)
        if not new:
            return {"request_id": future.id, "model_id": model_id}
        existing = get_training_client(session, model_id)
        if existing is not None and existing.owner != owner:
            raise NotFound("no such session")
        if existing is None:
            resources = template.get("resources") or {}
            repo.add_client(
                model_id,
                session_id=body["session_id"],
                base=alias,
                launcher=str(resources.get("launcher") or "local"),
                device=str(resources.get("device") or "cpu"),
                devices=1,
                priority="normal",
                config={**config, "load": load} if load else config,
                lora_rank=rank,
                user_metadata=body.get("user_metadata")
                if isinstance(body.get("user_metadata"), dict)
                else None,
            )
            next_model_seq(session, owner, body["session_id"], seq)
            session.commit()
            wake(model_id)
        answer = {"model_id": model_id, "type": "create_model"}
        if load is not None:
            answer = {"model_id": model_id, "path": load["path"], "type": "load_weights"}
        self.rt.in_background(future, lambda: (self._host(owner, model_id), answer)[1])
        return {"request_id": future.id, "model_id": model_id}

    def _host(self, owner: str, model_id: str, timeout: float = READY_TIMEOUT_SECONDS) -> Host:
        """The model's host, once its run is up and answers (waits for the scheduler and the load)."""
        known = self.rt.hosts.get(model_id)
        if known is not None:
            return known
        deadline = time.monotonic() + timeout
        while True:
            with session_scope() as session:
                row = TinkerRepository(session, owner).client(model_id)
                if row is None:
                    raise CallFailed("no such model", "user")
                status, key, seq = row.status, row.api_key, row.seq
                error = row.error_message or row.error_code or ""
                idle = row.idle_state is not None
            if status == JobStatus.paused and idle:
                # Saved idle: this call brings it back, a new run (queued like any) that loads the state.
                with session_scope() as session:
                    resumed = TinkerRepository(session, owner).resume_idle(model_id)
                    session.commit()
                if resumed:
                    log.info("training client %s: a call came after its idle save; queued again", model_id)
                    wake(model_id)
                continue
            if status in TERMINAL or status == JobStatus.cancelling or status == JobStatus.paused:
                raise CallFailed(
                    f"the training client's run is {status}{': ' + error if error else ''}; create another",
                    "user",
                )
            if status == JobStatus.running and not idle:
                url = read_endpoint(client_folder(self.tinker_dir, seq))
                if url is not None and self._answers(url):
                    host = Host(url, key)
                    self.rt.hosts[model_id] = host
                    with session_scope() as session:
                        TinkerRepository(session, owner).used(model_id, endpoint=url)
                        session.commit()
                    return host
            if time.monotonic() > deadline:
                raise CallFailed(
                    f"the training client did not start within {timeout:.0f} s ({status})", "server"
                )
            time.sleep(0.25)

    def _answers(self, url: str) -> bool:
        try:
            return self.rt.http.get(f"{url}/health", timeout=2.0).status_code == 200
        except Exception:
            return False

    def _client(self, session: Session, owner: str, model_id: Any) -> TrainingClient:
        row = TinkerRepository(session, owner).client(str(model_id)) if isinstance(model_id, str) else None
        if row is None:
            raise NotFound("no such model")
        return row

    def get_info(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        row = self._client(session, owner, body.get("model_id"))
        return {
            "model_id": row.id,
            "model_data": {
                "arch": "lora",
                "model_name": row.base,
                "tokenizer_id": self._tokenizer_id(row.base),
            },
            "is_lora": True,
            "lora_rank": row.lora_rank,
            "model_name": row.base,
            "type": "get_info",
        }

    def submit(
        self,
        session: Session,
        owner: str,
        model_id: Any,
        seq_id: Any,
        op: str,
        body: dict[str, Any],
        **how: Any,
    ) -> dict[str, Any]:
        """Queue one training call on the owner's model at its seq_id; the SDK's future for it."""
        row = self._client(session, owner, model_id)
        if row.status not in ACTIVE and not _saved_idle(row):
            raise BadRequest(f"the training client is {row.status}: create another, or load a saved state")
        return self.enqueue(owner, row.id, int(seq_id or 0), op, body, **how)

    def enqueue(
        self,
        owner: str,
        model_id: str,
        seq_id: int,
        op: str,
        body: dict[str, Any],
        *,
        proto: bool = False,
        then: Any = None,
    ) -> dict[str, Any]:
        future, new = self.rt.once(owner, model_id, seq_id, proto=proto)
        if new:

            def run() -> Any:
                started = time.monotonic()
                result = self.rt.call(self._host(owner, model_id), op, body)
                log.info("tinker %s %s seq %d: %.3f s", model_id, op, seq_id, time.monotonic() - started)
                with session_scope() as session:
                    TinkerRepository(session, owner).used(model_id)
                    session.commit()
                return then(result) if then is not None else result

            self.rt.queue(model_id).put(seq_id, future, run)
        return {"request_id": future.id, "model_id": model_id}

    def forward_backward(self, session: Session, owner: str, parsed: dict[str, Any]) -> dict[str, Any]:
        from service.tinker import proto

        op = parsed["op"]
        if op["loss_fn"] not in LOSS_FNS:
            raise unsupported(f"loss_fn {op['loss_fn']!r} (supported: {', '.join(LOSS_FNS)})")
        return self.submit(
            session, owner, parsed["model_id"], parsed["seq_id"], "forward_backward", op,
            proto=True, then=proto.forward_backward_output,
        )  # fmt: skip

    def optim_step(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        params = body.get("adam_params") or body.get("optim_params") or body.get("optimizer_params")
        if not isinstance(params, dict) or params.get("type", "adam") not in ("adam", "adamw"):
            raise unsupported("an optimizer other than Adam")
        return self.submit(
            session, owner, body.get("model_id"), body.get("seq_id"), "optim_step", {"adam_params": params},
            then=lambda r: {"metrics": r.get("metrics", {}), "type": "optim_step"},
        )  # fmt: skip

    def _checkpoint(
        self, session: Session, owner: str, body: dict[str, Any], kind: str
    ) -> tuple[TrainingClient, TinkerPath, Path]:
        row = self._client(session, owner, body.get("model_id"))
        name = body.get("path")
        if not isinstance(name, str) or not valid_name(name):
            raise BadRequest(f"path {name!r} must be a plain name (no '/'), at most 200 characters")
        path = TinkerPath(row.id, kind, name)
        return row, path, checkpoint_folder(self.tinker_dir, row.seq, kind, name)

    def _record(self, owner: str, path: TinkerPath, folder: Path, result: dict[str, Any], ttl: Any) -> None:
        with session_scope() as session:
            TinkerRepository(session, owner).add_checkpoint(
                path=str(path), model_id=path.model_id, kind=path.kind, name=path.name, folder=str(folder),
                size_bytes=result.get("size_bytes"),
            )  # fmt: skip
            session.commit()

    def save_weights(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        row, path, folder = self._checkpoint(session, owner, body, "weights")

        def then(result: dict[str, Any]) -> dict[str, Any]:
            self._record(owner, path, folder, result, body.get("ttl_seconds"))
            return {"path": str(path), "type": "save_weights"}

        return self.submit(
            session,
            owner,
            row.id,
            body.get("seq_id"),
            "save_state",
            {"folder": str(folder), "optimizer": True},
            then=then,
        )

    def save_weights_for_sampler(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("path") is None and body.get("sampling_session_seq_id") is not None:
            # save_weights_and_get_sampling_client: unnamed weights and a sampling session on them.
            row = self._client(session, owner, body.get("model_id"))
            n = int(body["sampling_session_seq_id"])
            folder = checkpoint_folder(
                self.tinker_dir, row.seq, "ephemeral", f"{int(body.get('seq_id') or 0)}"
            )
            sampler_id = f"{row.session_id}:sample:{n}"

            def then_session(result: dict[str, Any]) -> dict[str, Any]:
                self.rt.samplers[sampler_id] = Sampler(
                    sampler_id, owner, row.id, row.base, str(folder), False, None
                )
                return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

            return self.submit(
                session,
                owner,
                row.id,
                body.get("seq_id"),
                "save_sampler",
                {"folder": str(folder)},
                then=then_session,
            )
        row, path, folder = self._checkpoint(session, owner, body, "sampler_weights")

        def then(result: dict[str, Any]) -> dict[str, Any]:
            self._record(owner, path, folder, result, body.get("ttl_seconds"))
            return {"path": str(path), "type": "save_weights_for_sampler"}

        return self.submit(
            session, owner, row.id, body.get("seq_id"), "save_sampler", {"folder": str(folder)}, then=then
        )

    def _saved(self, session: Session, owner: str, path: Any, kinds: tuple[str, ...]) -> TinkerCheckpoint:
        parsed = TinkerPath.parse(path) if isinstance(path, str) else None
        found = TinkerRepository(session, owner).checkpoint(str(parsed)) if parsed is not None else None
        if found is None or found.kind not in kinds:
            raise NotFound(f"no such checkpoint: {path}")
        return found

    def load_weights(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        saved = self._saved(session, owner, body.get("path"), ("weights",))
        optimizer = bool(body.get("optimizer"))
        if body.get("model_id") is not None:
            # The legacy load_state on a live model: in its order with its other calls.
            return self.submit(
                session, owner, body["model_id"], body.get("seq_id"), "load_state",
                {"folder": saved.folder, "optimizer": optimizer},
                then=lambda r: {"path": body["path"], "type": "load_weights"},
            )  # fmt: skip
        repo = TinkerRepository(session, owner)
        self._owned_session(repo, body.get("session_id"))
        try:
            meta = json.loads((Path(saved.folder) / META_FILE).read_text())
        except (OSError, ValueError):
            raise BadRequest(f"{body.get('path')}: the saved state cannot be read") from None
        alias, folder, template = self._base(meta.get("base"))
        config = {"base": alias, "base_folder": str(folder), "lora": meta["lora"]}
        load = {"folder": saved.folder, "optimizer": optimizer, "path": str(body["path"])}
        answer = self._add_client(
            session, owner, body, alias, template, config, int(meta["lora"]["rank"]), load
        )
        # A model made from a state took seq 0 with the load itself: its calls start at 1.
        self.rt.queue(answer["model_id"], next_seq=1)
        return answer

    # Sampling ------------------------------------------------------------------------------------------

    def create_sampling_session(self, session: Session, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        repo = TinkerRepository(session, owner)
        self._owned_session(repo, body.get("session_id"))
        sampler_id = f"{body['session_id']}:sample:{int(body.get('sampling_session_seq_id') or 0)}"
        model_path = body.get("model_path")
        if model_path is not None:
            saved = self._saved(session, owner, model_path, ("sampler_weights", "weights"))
            row = self._client(session, owner, saved.model_id)
            sampler = Sampler(sampler_id, owner, row.id, row.base, saved.folder, False, str(model_path))
        else:
            alias = body.get("base_model")
            live = [
                r
                for r in repo.clients_of_session(body["session_id"])
                if r.base == alias and (r.status in ACTIVE or _saved_idle(r))
            ]
            if not live:
                raise unsupported(
                    f"sampling base_model {alias!r} without a training client of it in this session (this "
                    "slice samples in a training client's process; create one on that base first)"
                )
            sampler = Sampler(sampler_id, owner, live[-1].id, live[-1].base, None, True, None)
        self.rt.samplers[sampler_id] = sampler
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    def sampler(self, owner: str, sampler_id: str) -> Sampler:
        found = self.rt.samplers.get(sampler_id)
        if found is None or found.owner != owner:
            raise NotFound("no such sampler")
        return found

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        s = self.sampler(owner, sampler_id)
        out = {"sampler_id": s.id, "base_model": s.base}
        if s.model_path:
            out["model_path"] = s.model_path
        return out

    def asample(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        from service.tinker import proto

        sampler_id = body.get("sampling_session_id")
        if not isinstance(sampler_id, str):
            raise unsupported(
                "sampling without a sampling_session_id (legacy base_model/model_path addressing)"
            )
        s = self.sampler(owner, sampler_id)
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(name):
                raise unsupported(name)
        if body.get("target_prompt_logprobs") is not None:
            raise unsupported("target_prompt_logprobs")
        prompt: list[int] = []
        for chunk in (body.get("prompt") or {}).get("chunks") or []:
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise unsupported(f"prompt chunks of type {chunk.get('type')}")
            prompt.extend(int(t) for t in chunk.get("tokens") or [])
        n = int(body.get("num_samples") or 1)
        if not 1 <= n <= 64:
            raise BadRequest("num_samples must be 1..64")
        op = {
            "prompt": prompt,
            "num_samples": n,
            "sampling_params": body.get("sampling_params") or {},
            "prompt_logprobs": bool(body.get("prompt_logprobs")),
            "adapter": s.adapter,
            "base_only": s.base_only,
        }
        future, new = self.rt.once(owner, sampler_id, int(body.get("seq_id") or 0), proto=True)
        if new:

            def run() -> bytes:
                on_engine = self._sample_on_engine(owner, s, op)
                if on_engine is not None:
                    return proto.sample_output(on_engine)
                # A sample is a use of the model's host like a training call: never during its idle save.
                with self.rt.queue(s.model_id).running:
                    started = time.monotonic()
                    result = self.rt.call(self._host(owner, s.model_id), "sample", op)
                    log.info("tinker %s sample x%d: %.3f s", s.model_id, n, time.monotonic() - started)
                    with session_scope() as session:
                        TinkerRepository(session, owner).used(s.model_id)
                        session.commit()
                return proto.sample_output(result)

            self.rt.in_background(future, run)
        return {"request_id": future.id, "sample_sequence_ids": [f"{future.id}:{i}" for i in range(n)]}

    # Idle save ---------------------------------------------------------------------------------------

    def start_idle_sweep(self) -> None:
        every = max(0.5, min(30.0, self.settings.tinker_idle_seconds / 4))
        self.rt.start_sweeper(every, self.idle_sweep)

    def idle_sweep(self) -> list[str]:
        """Save the state of the training clients no call has used for FTQ_TINKER_IDLE_SECONDS and have
        the worker stop their runs (their devices go back; each waits `paused` for its next call, which
        brings it back from that state). The ids saved."""
        before = utcnow() - timedelta(seconds=self.settings.tinker_idle_seconds)
        with session_scope() as session:
            stale = unused_since(session, before, answered=True)
        saved = []
        for model_id in stale:
            q = self.rt.queue(model_id)
            if not q.running.acquire(blocking=False):
                continue  # a call is on its host now
            try:
                if q.pending or not self._save_idle(model_id, before):
                    continue
                saved.append(model_id)
            finally:
                q.running.release()
            wake(model_id)
        return saved

    def _save_idle(self, model_id: str, before: datetime) -> bool:
        """Under the model's `running` lock: its state into the server's idle folder, then the mark that
        the worker stops its run on. False when it was used meanwhile, or its host did not save."""
        with session_scope() as session:
            row = get_training_client(session, model_id)
            if row is None or row.status != JobStatus.running or row.idle_state is not None:
                return False
            last = row.last_used_at
            last = last if last.tzinfo else last.replace(tzinfo=before.tzinfo)
            if last >= before:
                return False
            owner, seq = row.owner, row.seq
        folder = checkpoint_folder(self.tinker_dir, seq, IDLE_KIND, IDLE_NAME)
        started = time.monotonic()
        try:
            host = self._host(owner, model_id, timeout=2.0)
            self.rt.call(host, "save_state", {"folder": str(folder), "optimizer": True, "grads": True})
        except CallFailed as exc:
            log.warning("training client %s: idle, its state not saved (%s); kept running", model_id, exc)
            return False
        with session_scope() as session:
            marked = mark_idle_saved(session, model_id, str(folder))
            session.commit()
        self.rt.hosts.pop(model_id, None)
        log.info(
            "training client %s: idle since %s; state saved in %.2f s to %s, its run stops",
            model_id, last.isoformat(), time.monotonic() - started, folder,
        )  # fmt: skip
        return marked

    def _sample_on_engine(self, owner: str, s: Sampler, op: dict[str, Any]) -> dict[str, Any] | None:
        """The sample from the owner's serving engine for the base, with the sampler folder as its adapter;
        None where the engine cannot serve it (the host samples: service.tinker.engine_sampling)."""
        from service.tinker import engine_sampling

        if self.engines is None:
            return None
        adapter = Path(s.adapter) if s.adapter else None
        try:
            base = self._base(s.base)[1]
        except BadRequest:
            return None
        why = engine_sampling.why_not(self.settings, s.base, base, adapter, op)
        if why or adapter is None:
            if self.rt.note_route(s.id):
                log.info("tinker sampler %s: sampled in the training client's process: %s", s.id, why)
            return None
        started = time.monotonic()
        try:
            target = engine_sampling.target(self.settings, s.base, base, adapter)
            result = engine_sampling.sample(self.engines, self.rt.http, owner, target, op, None)
        except Exception as exc:  # the engine failed, is refused or is too slow to start: the host samples
            log.warning("tinker sampler %s: the serving engine did not sample (%s); the host does", s.id, exc)
            return None
        n = int(op.get("num_samples") or 1)
        if self.rt.note_route(s.id):
            log.info("tinker sampler %s: sampled by the serving engine (%s)", s.id, result.get("engine"))
        log.info("tinker %s sample x%d on the engine: %.3f s", s.model_id, n, time.monotonic() - started)
        return result

    # REST ----------------------------------------------------------------------------------------------

    def _checkpoint_json(self, c: TinkerCheckpoint) -> dict[str, Any]:
        return {
            "checkpoint_id": f"{c.kind}/{c.name}",
            "checkpoint_type": "training" if c.kind == "weights" else "sampler",
            "time": _iso(c.created_at),
            "tinker_path": c.path,
            "size_bytes": c.size_bytes,
            "public": False,
            "expires_at": _iso(c.expires_at),
        }

    def _run_json(self, session: Session, owner: str, row: TrainingClient) -> dict[str, Any]:
        checkpoints = TinkerRepository(session, owner).checkpoints(row.id)
        last = next((c for c in checkpoints if c.kind == "weights"), None)
        last_sampler = next((c for c in checkpoints if c.kind == "sampler_weights"), None)
        meta = {str(k): str(v) for k, v in (row.user_metadata or {}).items()}
        return {
            "training_run_id": row.id,
            "base_model": row.base,
            "model_owner": owner,
            "is_lora": True,
            "corrupted": row.status == JobStatus.failed,
            "lora_rank": row.lora_rank,
            "last_request_time": _iso(row.last_used_at),
            "last_checkpoint": self._checkpoint_json(last) if last else None,
            "last_sampler_checkpoint": self._checkpoint_json(last_sampler) if last_sampler else None,
            "user_metadata": meta or None,
            # ftq's own: where the run is (its status) and what it used.
            "status": row.status,
        }

    def training_runs(self, session: Session, owner: str, limit: int, offset: int) -> dict[str, Any]:
        rows, total = TinkerRepository(session, owner).clients(limit, offset)
        return {
            "training_runs": [self._run_json(session, owner, r) for r in rows],
            "cursor": {"offset": offset, "limit": limit, "total_count": total},
        }

    def training_run(self, session: Session, owner: str, run_id: str) -> dict[str, Any]:
        return self._run_json(session, owner, self._client(session, owner, run_id))

    def checkpoints(self, session: Session, owner: str, run_id: str | None) -> dict[str, Any]:
        if run_id is not None:
            self._client(session, owner, run_id)
        rows = TinkerRepository(session, owner).checkpoints(run_id)
        return {"checkpoints": [self._checkpoint_json(c) for c in rows]}
