"""What the security tests share: the owners' tokens, the operator's secrets the servers are given, the
limits of the limited server, a spec on config-only assets, and the stand-in interpreter for launches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.harness import Deployment, config_only_model, text_dataset
from tests.harness.inprocess import MakeClient

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

# The server_factory fixture: server_factory(command="api", *, data_name="data", **settings) -> a started
# Deployment, stopped at the end of the module.
ServerFactory = Callable[..., Deployment]

TOKENS = {
    "alice": "alice-secret-token-0001",
    "bob": "bob-secret-token-0002",
    "mallory": "mallory-token-0003",
    "sec": "sec-token-0004",
}
# Fixed values: test modules import them, and must see the ones the servers were given.
HF_TOKEN = "hf_9f3c2a7be1d04c5e8a6b9d2f1c3e5a7b"
WANDB_KEY = "wandb-4e8d1c7a2b9f6e3d5c0a8b1f"
# The operator's secrets, in the environment of the shared servers (FTQ_PASS_ENV names them).
OPERATOR_ENV = {"HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_KEY}

# Stands in for the interpreter that runs `accelerate launch` (FTQ_PYTHON):
# - with STUB_OUT set (a test running a rendered script itself): record argv there, start nothing;
# - for a job named `leaky`: prove the secret arrived (its hash, in the run dir), print it the way a
#   careless library would, and fail with the trainer's `ftq-error:` line quoting it;
# - for a job named `envdump`: write the environment it was launched with to env.json in its run dir;
# - otherwise: the real interpreter, so `ftq up` runs the real accelerate and trainer.
STUB_PYTHON = """#!{python}
import hashlib, json, os, sys
argv = sys.argv[1:]
out = os.environ.get("STUB_OUT")
if out:
    with open(out, "a") as f:
        f.write(json.dumps(argv) + "\\n")
    sys.exit(0)
spec = argv[argv.index("--spec") + 1] if "--spec" in argv else ""
name = json.load(open(spec)).get("name") if os.path.isfile(spec) else None
if name == "leaky":
    value = os.environ.get("HF_TOKEN", "")
    with open("received.sha256", "w") as f:
        f.write(hashlib.sha256(value.encode()).hexdigest())
    print("requests: GET https://huggingface.co/api/models?token=" + value, flush=True)
    print("ftq-error: model_error: the hub refused token " + value + " for this model", flush=True)
    sys.exit(1)
if name == "envdump":
    with open("env.json", "w") as f:
        json.dump(dict(os.environ), f)
    sys.exit(0)
os.execv({python!r}, [{python!r}, *argv])
"""
STUB_SRUN = """#!/bin/bash
# srun: drop its own options, then run the step command on "this node".
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
export SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0
exec "$@"
"""
STUB_SCONTROL = """#!/bin/bash
echo node-a
"""


LIMITS = {"max_body_bytes": 4096, "max_active": 3, "rate": 6, "ttl_hours": 0.001}
LIMIT_TOKENS = {o: f"lim-{o}" for o in ("big", "cap", "rate", "other", "ttl")}


def base_spec(**resources: Any) -> dict[str, Any]:
    """A valid CPU spec on the assets' model and data (relative paths resolve under the roots)."""
    return {
        "name": "sec",
        "model": {"name_or_path": "./model"},
        "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
        "training": {"max_steps": 2, "max_seq_len": 32, "logging_steps": 1, "mixed_precision": "no"},
        "resources": {"device": "cpu", "processes_per_node": 1, **resources},
    }


def spec(**model: object) -> dict[str, Any]:
    """A valid CPU spec on the assets `live_api` puts in its data dir (relative paths resolve there)."""
    return {
        "name": "hostile",
        "model": {"name_or_path": "./model", **model},
        "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
        "training": {"max_steps": 2, "max_seq_len": 32, "logging_steps": 1, "mixed_precision": "no"},
        "resources": {"device": "cpu", "processes_per_node": 1},
    }


def spec_assets(data_dir: Path) -> None:
    """What `spec()` names, in a data dir: a config-only model and a dataset."""
    config_only_model(data_dir / "model")
    text_dataset(data_dir / "data" / "train.jsonl")


@contextmanager
def live_api(workdir: Path, **settings: str) -> Iterator[Deployment]:
    """`ftq api` with the given FTQ_ settings (names without the prefix) and `spec()`'s assets in its
    data dir; stopped on exit."""
    spec_assets(workdir / "data")
    with Deployment(workdir, mode="api", settings=settings) as dep:
        yield dep


def in_process_api(make_client: MakeClient, data_dir: Path, **settings: str) -> TestClient:
    """live_api's server in the test process (the app factory, the same settings): for an answer that
    one setting decides, without a server's start-up. `data_dir` is the ftq_env fixture's."""
    spec_assets(data_dir)
    return make_client(**settings)
