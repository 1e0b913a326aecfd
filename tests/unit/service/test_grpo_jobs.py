"""A GRPO job through the native API in process (service/jobs/planning.py `check_grpo_policy`): the plan
names trl.GRPOTrainer and counts the generation; a bad grader and a score model the operator does not allow
are 422s naming their field; use_vllm is checked by the launch, on the nodes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.harness.inprocess import MakeClient

GRADER = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.completion}}",
    "operation": "eq",
}


@pytest.fixture
def grpo_job(tiny_job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(tiny_job)
    job["dataset"] = {
        "name_or_path": job["dataset"]["name_or_path"].replace("data/train", "prompt_completion/train")
    }
    job["training"].update(
        method="grpo",
        per_device_train_batch_size=4,
        grpo={"num_generations": 4, "max_completion_length": 16},
        grader=copy.deepcopy(GRADER),
    )
    return job


def _loc(r: Any) -> list[Any]:
    assert r.status_code == 422, r.text
    return list(r.json()["detail"][0]["loc"])


def test_a_grpo_plan_names_its_trainer_and_counts_the_generation(
    make_client: MakeClient, grpo_job: dict[str, Any]
) -> None:
    client = make_client()
    r = client.post("/jobs?dry_run=true", json=grpo_job)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["trainer"] == "trl.GRPOTrainer"
    assert plan["estimate"]["breakdown"]["generation_kv_cache"] > 0
    assert any(a.startswith("generation:") for a in plan["time_estimate"]["assumptions"])


def test_grpo_refusals_name_their_field(make_client: MakeClient, grpo_job: dict[str, Any]) -> None:
    client = make_client(grader_score_models="./tiny/model")
    bad = copy.deepcopy(grpo_job)
    bad["training"]["grader"]["operation"] = "contains"
    assert _loc(client.post("/jobs", json=bad)) == ["body", "training", "grader", "operation"]
    batch = copy.deepcopy(grpo_job)
    batch["training"]["grpo"]["num_generations"] = 3
    assert _loc(client.post("/jobs", json=batch)) == ["body", "training", "grpo", "num_generations"]
    scored = copy.deepcopy(grpo_job)
    scored["training"]["grader"] = {
        "type": "multi",
        "graders": {
            "ok": {
                "type": "score_model",
                "model": "./tiny/model",
                "input": [{"role": "user", "content": "x"}],
            },
            "no": {"type": "score_model", "model": "org/judge", "input": [{"role": "user", "content": "x"}]},
        },
        "calculate_output": "ok + no",
    }
    r = client.post("/jobs", json=scored)
    assert _loc(r) == ["body", "training", "grader", "graders", "no", "model"]
    assert "FTQ_GRADER_SCORE_MODELS" in r.text
    # use_vllm is checked where the job runs (issue 51): the API's environment says nothing of the nodes'.
    vllm = copy.deepcopy(grpo_job)
    vllm["training"]["grpo"]["use_vllm"] = True
    vllm["resources"]["device"] = "cuda"
    r = client.post("/jobs?dry_run=true", json=vllm)
    assert r.status_code == 200, r.text
    assert "use_vllm needs vllm" in r.json()["launch_script"]


def test_continuous_batching_under_sharded_weights_is_refused_naming_the_field(
    make_client: MakeClient, grpo_job: dict[str, Any]
) -> None:
    """transformers' continuous batching ignores synced_gpus, so under FSDP or ZeRO-3 on several processes
    the trainer would have to turn it off: asked for there, it is a 422 naming the field and why; unset, the
    job is planned (resolved to off: padded generate() in lockstep)."""
    client = make_client()
    for distributed in (
        {"strategy": "fsdp", "fsdp": {"version": 2}},
        {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
    ):
        sharded = copy.deepcopy(grpo_job)
        sharded["distributed"] = distributed
        sharded["resources"].update(device="cuda", processes_per_node=2)
        sharded["training"]["mixed_precision"] = "bf16"
        sharded["training"]["grpo"]["use_transformers_continuous_batching"] = True
        r = client.post("/jobs?dry_run=true", json=sharded)
        assert _loc(r) == ["body", "training", "grpo", "use_transformers_continuous_batching"]
        assert "synced_gpus" in r.text and "lockstep" in r.text
        del sharded["training"]["grpo"]["use_transformers_continuous_batching"]
        r = client.post("/jobs?dry_run=true", json=sharded)
        assert r.status_code == 200, r.text  # unset: resolved to off (test_real_scale_plans)
    # One process holds the whole model: continuous batching may be asked for.
    alone = copy.deepcopy(grpo_job)
    alone["resources"].update(device="cuda", processes_per_node=1)
    alone["training"]["mixed_precision"] = "bf16"
    alone["training"]["grpo"]["use_transformers_continuous_batching"] = True
    r = client.post("/jobs?dry_run=true", json=alone)
    assert r.status_code == 200, r.text
