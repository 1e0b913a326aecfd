"""Issue 18 item 7 against real servers: the operator's caps on what one owner's job may take.

Over HTTP to an `ftq api` with small caps: nodes, GPUs and processes per job and the time limit are each a
422 naming the field and the cap; a cpu job is checked against the host's RAM (FTQ_HOST_MEMORY_GB), not
GPU memory; `allow_oversubscribe` skips neither that check nor the disk check unless the operator lets
the owner (FTQ_ALLOW_OVERSUBSCRIBE). Against an `ftq up`: a local job that runs past
FTQ_MAX_TIME_LIMIT_HOURS is stopped, and fails with time_limit.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.security.common import base_spec
from tests.harness import Deployment, config_only_model, run_pids, text_dataset, wait_gone, wait_until

TOKENS = {"capped": "caps-token-01", "trusted": "caps-token-02"}
CAPS = {
    "max_nodes_per_job": 2,
    "max_gpus_per_job": 4,
    "max_processes_per_job": 3,
    "max_time_limit_hours": 2,
    "host_memory_gb": 8,
}
# TinyLlama-1.1B's shapes: a full fine-tune in fp32 needs ~18 GiB per process, which fits an 80 GiB GPU
# but not 8 GiB of host RAM; its checkpoints are ~13 GB each.
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("caps")
    config_only_model(root / "data" / "model")
    text_dataset(root / "data" / "data" / "train.jsonl")
    llama = config_only_model(root / "data" / "llama-1b")
    (llama / "config.json").write_text(json.dumps(LLAMA_1B))
    # One GPU in the local pool: a local cuda job is refused at POST on a server without any.
    settings: dict[str, object] = {
        **CAPS,
        "allow_oversubscribe": "trusted",
        "post_rate_per_minute": 100000,
        "gpu_pool": "0",
    }
    with Deployment(root, mode="api", tokens=TOKENS, settings=settings) as dep:
        yield dep


def _spec(**resources: Any) -> dict[str, Any]:
    body = base_spec()
    body["resources"] = {"device": "cpu", "processes_per_node": 1, **resources}
    if body["resources"]["processes_per_node"] * body["resources"].get("num_nodes", 1) > 1:
        body["distributed"] = {"strategy": "ddp"}
    return body


def _refusals(r: httpx.Response) -> dict[tuple[str, ...], str]:
    assert r.status_code == 422, r.text
    out: dict[tuple[str, ...], str] = {}
    for e in r.json()["detail"]:
        loc = tuple(e["loc"])
        out[loc] = f"{out[loc]} | {e['msg']}" if loc in out else e["msg"]
    return out


SLURM = {"launcher": "slurm", "device": "cuda"}
CAP_CASES = [
    # (resources, the field refused, the cap it names)
    ({**SLURM, "num_nodes": 3, "processes_per_node": 1}, "num_nodes", "FTQ_MAX_NODES_PER_JOB=2"),
    ({**SLURM, "num_nodes": 2, "processes_per_node": 4}, "processes_per_node", "FTQ_MAX_GPUS_PER_JOB=4"),
    ({"device": "cpu", "processes_per_node": 4}, "processes_per_node", "FTQ_MAX_PROCESSES_PER_JOB=3"),
    (
        {**SLURM, "slurm": {"time_limit": "160-00:00:00"}},
        "slurm.time_limit",
        "FTQ_MAX_TIME_LIMIT_HOURS=2",
    ),
    # The 160-day CPU job of the report: a local job may not ask for more than the cap either.
    (
        {"device": "cpu", "slurm": {"time_limit": "160-00:00:00"}},
        "slurm.time_limit",
        "FTQ_MAX_TIME_LIMIT_HOURS=2",
    ),
]


@pytest.mark.parametrize(("resources", "field", "cap"), CAP_CASES)
def test_each_cap_is_a_422_naming_it(
    api: Deployment, resources: dict[str, Any], field: str, cap: str
) -> None:
    with api.client(TOKENS["capped"]) as c:
        for params in ({}, {"dry_run": "true"}):
            refusals = _refusals(c.post("/jobs", params=params, json=_spec(**resources)))
            loc = ("body", "resources", *field.split("."))
            assert loc in refusals, refusals
            assert cap in refusals[loc] and "exceeds the operator's cap" in refusals[loc]
        assert c.get("/jobs").json()["data"] == []


def test_within_the_caps_is_accepted(api: Deployment) -> None:
    within = _spec(**SLURM, num_nodes=2, processes_per_node=1, slurm={"time_limit": "2:00:00"})
    with api.client(TOKENS["capped"]) as c:
        assert c.post("/jobs", params={"dry_run": "true"}, json=within).status_code == 200
        r = c.post("/jobs", json=_spec(processes_per_node=3))
        assert r.status_code == 201, r.text
        c.post(f"/jobs/{r.json()['id']}/cancel")


def test_cpu_jobs_are_checked_against_host_ram_and_oversubscribe_needs_the_operator(api: Deployment) -> None:
    cpu = _spec()
    cpu["model"]["name_or_path"] = "./llama-1b"
    cpu["lora"] = None
    with api.client(TOKENS["capped"]) as c, api.client(TOKENS["trusted"]) as trusted:
        plan = c.post("/jobs", params={"dry_run": "true"}, json=cpu).json()
        # Fits an 80 GiB GPU; what it is checked against is the host's 8 GiB.
        assert plan["estimate"]["device_memory_bytes"] == 8 * 1024**3 and plan["estimate"]["fits"] is False
        msg = _refusals(c.post("/jobs", json=cpu))[("body", "resources", "device")]
        assert "host RAM" in msg and "FTQ_HOST_MEMORY_GB" in msg
        over = {**cpu, "allow_oversubscribe": True}
        msg = _refusals(c.post("/jobs", json=over))[("body", "resources", "device")]
        assert "FTQ_ALLOW_OVERSUBSCRIBE" in msg
        # An owner the operator lets oversubscribe may.
        r = trusted.post("/jobs", json=over)
        assert r.status_code == 201, r.text
        trusted.post(f"/jobs/{r.json()['id']}/cancel")


def test_the_disk_check_is_not_skipped_by_allow_oversubscribe_alone(api: Deployment) -> None:
    # One GPU, so only the disk is in question: 100 000 checkpoints of ~13 GB.
    hog = _spec(device="cuda")
    hog["model"]["name_or_path"] = "./llama-1b"
    hog["lora"] = None
    hog["training"].update(max_steps=100_000, save_steps=1)
    hog["allow_oversubscribe"] = True
    with api.client(TOKENS["capped"]) as c, api.client(TOKENS["trusted"]) as trusted:
        msg = _refusals(c.post("/jobs", json=hog))[("body", "training", "save_steps")]
        assert "is free where runs are stored" in msg and "FTQ_ALLOW_OVERSUBSCRIBE" in msg
        r = trusted.post("/jobs", json=hog)
        assert r.status_code == 201, r.text
        trusted.post(f"/jobs/{r.json()['id']}/cancel")


# Stands in for the interpreter of launches: the job named `sleeper` sleeps (a run that never ends on
# its own); anything else runs the real interpreter.
SLEEPER_PYTHON = """#!{python}
import json, os, sys, time
argv = sys.argv[1:]
spec = argv[argv.index("--spec") + 1] if "--spec" in argv else ""
if os.path.isfile(spec) and json.load(open(spec)).get("name") == "sleeper":
    print("sleeper: started", flush=True)
    time.sleep(600)
os.execv({python!r}, [{python!r}, *argv])
"""


@pytest.mark.slow
def test_a_local_job_past_the_time_limit_is_stopped_and_fails(tmp_path: Path) -> None:
    stub = tmp_path / "python"
    stub.write_text(SLEEPER_PYTHON.format(python=sys.executable))
    stub.chmod(0o755)
    limit_s = 8
    config_only_model(tmp_path / "data" / "model")
    text_dataset(tmp_path / "data" / "data" / "train.jsonl")
    settings: dict[str, object] = {
        "python": stub,
        "max_time_limit_hours": limit_s / 3600,
        "cancel_grace_seconds": 2,
        "reconcile_interval_seconds": 1,
    }
    with Deployment(tmp_path, settings=settings) as up:
        job = up.post_job({**base_spec(), "name": "sleeper"})
        running = up.wait_for(job["id"], lambda j: j["status"] == "running", timeout=60)
        pids = wait_until("the sleeper's processes", lambda: run_pids(job["id"]), timeout=30)
        t0 = time.monotonic()
        ended = up.wait_terminal(job["id"], timeout=120)
        assert ended["status"] == "failed", ended
        assert ended["error"]["code"] == "time_limit", ended["error"]
        assert "FTQ_MAX_TIME_LIMIT_HOURS" in ended["error"]["message"]
        # It ran about its limit, not until the stub's own end (600 s).
        assert time.monotonic() - t0 < 120 and running["started_at"]
        wait_gone(pids, timeout=30)
        assert "sleeper: started" in up.train_log(job["id"])
