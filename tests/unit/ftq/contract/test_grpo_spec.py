"""GRPO in the spec (ftq/contract/spec.py: GrpoSpec, TrainingSpec.grader, JobSpec._check_grpo): TRL's
batch rule, the grader it needs, vLLM only on cuda, and a bad grader's field named down to its leaf."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from ftq.contract.graders import clean_loc
from ftq.contract.spec import GrpoSpec, JobSpec, SpecFieldError

GRADER = {
    "type": "string_check",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


def body(**grpo: Any) -> dict[str, Any]:
    return {
        "model": {"name_or_path": "org/model"},
        "dataset": {"name_or_path": "org/data"},
        "training": {
            "method": "grpo",
            "max_steps": 2,
            "per_device_train_batch_size": 2,
            "grpo": {"num_generations": 4, **grpo},
            "grader": copy.deepcopy(GRADER),
        },
        "resources": {"device": "cpu", "processes_per_node": 2},
        "distributed": {"strategy": "ddp"},
        "lora": {},
    }


def loc_of(spec: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """The 422's field and message, as the service builds them (cross-field errors carry their loc)."""
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(spec)
    err = info.value.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    loc = [str(p) for p in err["loc"]]
    if isinstance(cause, SpecFieldError):
        loc += [str(p) for p in cause.loc]
    return tuple(clean_loc(loc)), str(err["msg"])


def test_a_grpo_job_takes_trls_names_and_the_batch_holds_whole_groups() -> None:
    spec = JobSpec.model_validate(body(beta=0.04, loss_type="dr_grpo", scale_rewards="none"))
    grpo = spec.training.method_parameters()
    assert isinstance(grpo, GrpoSpec) and grpo.beta == 0.04 and grpo.loss_type == "dr_grpo"
    assert spec.training.grader is not None and spec.training.grader.type == "string_check"
    # 2 per device x 2 processes x 1 step = 4: a multiple of 4, not of 8 (nor of 3).
    for n in (3, 8):
        loc, msg = loc_of(body(num_generations=n))
        assert loc == ("training", "grpo", "num_generations")
        assert "multiple of num_generations" in msg and "= 4" in msg
    # steps_per_generation makes the generation batch larger: 2 x 2 x 2 = 8.
    JobSpec.model_validate(body(num_generations=8, steps_per_generation=2))


@pytest.mark.parametrize(
    ("grpo", "field"),
    [
        ({"num_generations": 1}, "num_generations"),  # TRL needs 2 to compare
        ({"beta": -0.1}, "beta"),
        ({"temperature": 0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"scale_rewards": "yes"}, "scale_rewards"),
        ({"epsilon": 0}, "epsilon"),
        ({"max_completion_length": 0}, "max_completion_length"),
        ({"loss_type": "luspo"}, "importance_sampling_level"),
        ({"epsilon": 0.3, "epsilon_high": 0.2}, "epsilon_high"),
        ({"sync_ref_model": True}, "sync_ref_model"),  # beta 0 loads no reference
        ({"use_vllm": True}, "use_vllm"),  # cpu
        ({"unknown": 1}, "unknown"),
    ],
)
def test_grpo_parameters_are_checked_and_named(grpo: dict[str, Any], field: str) -> None:
    loc, _ = loc_of(body(**grpo))
    assert loc == ("training", "grpo", field)


def test_the_grader_is_required_for_grpo_refused_elsewhere_and_named_to_its_leaf() -> None:
    spec = body()
    del spec["training"]["grader"]
    assert loc_of(spec)[0] == ("training", "grader")
    sft = body()
    sft["training"]["method"] = "sft"
    del sft["training"]["grpo"]
    loc, msg = loc_of(sft)
    assert loc == ("training", "grader") and "for method grpo" in msg
    bad = body()
    bad["training"]["grader"]["operation"] = "contains"
    assert loc_of(bad)[0] == ("training", "grader", "operation")
    multi = body()
    multi["training"]["grader"] = {
        "type": "multi",
        "graders": {"a": GRADER, "b": {**GRADER, "operation": "nope"}},
        "calculate_output": "a + b",
    }
    assert loc_of(multi)[0] == ("training", "grader", "graders", "b", "operation")
    multi["training"]["grader"]["graders"]["b"]["operation"] = "ne"
    multi["training"]["grader"]["calculate_output"] = "a + c"
    loc, msg = loc_of(multi)
    assert loc == ("training", "grader") and "calculate_output" in msg


def test_use_vllm_is_taken_on_cuda() -> None:
    spec = body(use_vllm=True)
    spec["resources"]["device"] = "cuda"
    assert JobSpec.model_validate(spec).training.grpo.use_vllm  # type: ignore[union-attr]
