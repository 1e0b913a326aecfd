"""What the Tinker API (issue 52) shares between the service, the worker and the host process
(`trainer.tinker_host`): the files of a training client's folder, the host's RPC, and `tinker://` paths.

A training client's folder (`<data dir>/tinker/clients/<n>/`, the server's choice) holds `host.json`
(what to load: the base folder, the LoRA, the seed), `host.key` (the host's own key, owner-only: the
API sends it as `X-Host-Key` with each call, and the host refuses any other caller) and, once the host
listens, `endpoint.json` (`{"url": ...}` on 127.0.0.1, or the node's name on SLURM)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

HOST_MODULE = "trainer.tinker_host"
REQUEST = "host.json"
KEY = "host.key"
KEY_HEADER = "X-Host-Key"

# The host's operations: POST /<op> with a JSON body, a JSON answer (`{"error": ..., "category":
# "user"|"server"}` with a 4xx/5xx when it refuses).
OPS = (
    "forward_backward",
    "optim_step",
    "save_state",
    "load_state",
    "save_sampler",
    "sample",
    "info",
)
# Loss functions the host computes (the SDK names more: cispo, dro, gspo, stable_reinforce, custom).
LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo")

# Where the API saves an idle training client's state (FTQ_TINKER_IDLE_SECONDS): a checkpoint folder of
# this kind and name, overwritten at each idle save, loaded by the client's next run.
IDLE_KIND, IDLE_NAME = "idle", "state"
GRADS_FILE = "grads.pt"  # gradients a forward_backward added and no optim_step used yet, saved idle


class TrainingClientEventType(StrEnum):
    """A training client's events (`GET /training_clients/{id}/events`), as a job's are named."""

    created = "training_client.created"  # data: base, rank
    started = "training_client.started"  # its run is up (the first, or one brought back from idle)
    idle_saved = "training_client.idle_saved"  # its state saved, its run stopped, its devices freed
    resumed = "training_client.resumed"  # a call came: a new run is queued that loads the saved state
    stopped = "training_client.stopped"  # its session closed (or it was stopped): data.error says why
    failed = "training_client.failed"  # data: error {code, message}


SCHEME = "tinker://"
KINDS = ("weights", "sampler_weights")


@dataclass(frozen=True)
class TinkerPath:
    """`tinker://<model_id>/<kind>/<name>`: a saved state (`weights`) or sampler weights."""

    model_id: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"

    @classmethod
    def parse(cls, path: str) -> TinkerPath | None:
        """The parts of a tinker path, or None for anything else (the SDK's own rule: three parts)."""
        if not path.startswith(SCHEME):
            return None
        parts = path[len(SCHEME) :].split("/")
        if len(parts) != 3 or parts[1] not in KINDS or not valid_name(parts[2]) or not parts[0]:
            return None
        return cls(parts[0], parts[1], parts[2])


def valid_name(name: str) -> bool:
    """A checkpoint name a caller may choose: one path component, nothing that climbs out of a folder."""
    return (
        0 < len(name) <= 200
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
        and not name.startswith(".")
        and all(c.isprintable() for c in name)
    )


def client_folder(tinker_dir: Path, seq: int) -> Path:
    """A training client's folder under the data dir's `tinker/` (by the row's number: a model id holds
    colons)."""
    return tinker_dir / "clients" / f"tc_{seq}"


def checkpoint_folder(tinker_dir: Path, seq: int, kind: str, name: str) -> Path:
    """Where a training client's saved state or sampler weights `name` lie (the server's choice)."""
    return tinker_dir / "checkpoints" / f"tc_{seq}" / kind / name


# ftq's own view of training clients (`GET /training_clients`, `ftq ls`, the dashboard) ----------------------


class TrainingClientInfo(BaseModel):
    """One Tinker training client of the caller's: a run the scheduler places (its status is a run's:
    `paused` while it waits saved idle for its next call)."""

    id: str = Field(description="The Tinker model id (`<session>:train:<n>`).")
    base: str = Field(description="The catalog alias it trains a LoRA on.")
    lora_rank: int
    status: str = Field(
        description="queued, starting, running, paused (saved idle: its next call brings it back), "
        "cancelling, cancelled (its session closed), failed (`error` says why)"
    )
    device: str
    devices: int
    launcher: str
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = Field(None, description="When its current run started.")
    finished_at: datetime | None = None
    last_used_at: datetime = Field(description="When a call last used it (the idle time counts from it).")
    device_seconds: float = Field(description="Its devices x the time its runs held them.")
    calls: int = Field(0, description="Calls its host answered (from its log).")
    last_step_seconds: float | None = Field(
        None, description="The last forward_backward's time on its host, in seconds (from its log)."
    )


class TrainingClientList(BaseModel):
    data: list[TrainingClientInfo]


class TrainingClientEvent(BaseModel):
    id: int
    model_id: str
    type: str = Field(description="One of ftq.contract.tinker.TrainingClientEventType.")
    time: datetime
    data: dict[str, Any]


class TrainingClientEvents(BaseModel):
    data: list[TrainingClientEvent]
    next_after: int = Field(description="The cursor for `?after=`: the last event's id (or the one given).")


class TrainingClientLog(BaseModel):
    text: str = Field(description="The end of its host's log: a line per call with its time.")
    size: int = Field(description="The log's size in bytes.")
