"""What the Tinker API (issue 52) shares between the service, the worker and the host process
(`trainer.tinker_host`): the files of a training client's folder, the host's RPC, and `tinker://` paths.

A training client's folder (`<data dir>/tinker/clients/<n>/`, the server's choice) holds `host.json`
(what to load: the base folder, the LoRA, the seed), `host.key` (the host's own key, owner-only: the
API sends it as `X-Host-Key` with each call, and the host refuses any other caller) and, once the host
listens, `endpoint.json` (`{"url": ...}` on 127.0.0.1, or the node's name on SLURM)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

HOST_MODULE = "trainer.tinker_host"
REQUEST = "host.json"
KEY = "host.key"
ENDPOINT = "endpoint.json"
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


def write_endpoint(folder: Path, url: str) -> None:
    tmp = folder / f".{ENDPOINT}.tmp"
    tmp.write_text(json.dumps({"url": url}))
    tmp.replace(folder / ENDPOINT)


def read_endpoint(folder: Path) -> str | None:
    try:
        url = json.loads((folder / ENDPOINT).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if isinstance(url, str) else None
