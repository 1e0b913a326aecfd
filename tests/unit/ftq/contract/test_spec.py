"""The shared job spec: defaults, ranges, cross-field rules, and the contract's example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from ftq.contract.spec import JobSpec, SpecFieldError, looks_local

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "design_example.yaml"


def _design_example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def test_the_contract_example_is_valid() -> None:
    spec = JobSpec.model_validate(_design_example())
    assert spec.distributed.strategy == "deepspeed"
    assert spec.distributed.deepspeed.zero_stage == 3
    assert spec.resources.world_size == 16
    assert spec.lora is not None and spec.lora.target_modules == [
        "query_key_value",
        "dense",
        "dense_h_to_4h",
        "dense_4h_to_h",
    ]


def _minimal(**over: object) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name_or_path": "meta-llama/Llama-2-7b-hf"},
        "dataset": {"name_or_path": "smangrul/code-chat-assistant-v1"},
        "training": {"max_steps": 10},
    }
    spec.update(over)
    return spec


def test_defaults_and_round_trip() -> None:
    spec = JobSpec.model_validate(_minimal())
    assert spec.resources.launcher == "local" and spec.distributed.strategy == "none"
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec
    assert spec.display_name == "Llama-2-7b-hf"


@pytest.mark.parametrize(
    "name",
    ["owner/name/extra", "a b", "$(id)", "`id`", "x;rm", "name\nline", "org/..", "", "/etc\n"],
)
def test_hub_ids_are_strict(name: str) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(_minimal(model={"name_or_path": name}))


def test_local_forms() -> None:
    assert (
        looks_local("/data/x") and looks_local("./x") and looks_local("../x") and looks_local("train.jsonl")
    )
    assert not looks_local("owner/name") and not looks_local("gpt2")


def test_time_limit_forms() -> None:
    for ok in ["30", "30:00", "36:00:00", "1-00", "2-12:00", "1-00:00:00"]:
        JobSpec.model_validate(_minimal(resources={"launcher": "slurm", "slurm": {"time_limit": ok}}))
    for bad in ["1h", "36:00:00\n#SBATCH --x", "$(id)", "-1", "1:2:3:4"]:
        with pytest.raises(ValidationError):
            JobSpec.model_validate(_minimal(resources={"launcher": "slurm", "slurm": {"time_limit": bad}}))


@pytest.mark.parametrize("attn", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_needs_a_half_precision(attn: str) -> None:
    # flash-attn has no float32 kernels: refused at POST, naming the field, rather than crashing the job.
    def spec(attn_implementation: str, mixed_precision: str) -> dict[str, Any]:
        return _minimal(
            model={"name_or_path": "meta-llama/Llama-2-7b-hf", "attn_implementation": attn_implementation},
            training={"max_steps": 10, "mixed_precision": mixed_precision},
            resources={"device": "cuda"},
        )

    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(spec(attn, "no"))
    assert "mixed_precision" in str(err.value) and "fp16/bf16" in str(err.value)
    for half in ("bf16", "fp16"):
        JobSpec.model_validate(spec(attn, half))
    # auto is resolved by the trainer (sdpa without a half dtype), so it stays valid.
    JobSpec.model_validate(spec("auto", "no"))


def test_requeue_on_timeout_is_for_slurm_jobs() -> None:
    from service.errors import SpecError
    from service.jobs.service import parse_spec

    slurm = {"launcher": "slurm", "slurm": {"time_limit": "4:00:00", "requeue_on_timeout": True}}
    assert JobSpec.model_validate(_minimal(resources=slurm)).resources.slurm.requeue_on_timeout
    assert not JobSpec.model_validate(_minimal()).resources.slurm.requeue_on_timeout  # off by default
    # A local job's time limit is the operator's cap: a 422 naming the field, not a job that renews it.
    with pytest.raises(SpecError) as err:
        parse_spec(_minimal(resources={**slurm, "launcher": "local"}))
    (only,) = err.value.errors
    assert only["loc"] == ["body", "resources", "slurm", "requeue_on_timeout"]
    assert "needs resources.launcher: slurm" in only["msg"]


def test_sample_prompts_default_to_none_and_take_a_few_prompts() -> None:
    assert JobSpec.model_validate(_minimal()).eval.sample_prompts == []
    spec = JobSpec.model_validate(
        _minimal(eval={"sample_prompts": ["one two", "Hello"], "sample_max_new_tokens": 16})
    )
    assert spec.eval.sample_prompts == ["one two", "Hello"] and spec.eval.sample_max_new_tokens == 16
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize(
    ("eval_", "where"),
    [
        ({"sample_prompts": [f"p{i}" for i in range(9)]}, ("eval", "sample_prompts")),
        ({"sample_prompts": [""]}, ("eval", "sample_prompts", 0)),
        ({"sample_prompts": ["x" * 2001]}, ("eval", "sample_prompts", 0)),
        ({"sample_prompts": ["  "]}, ("eval", "sample_prompts")),
        ({"sample_prompts": "one two"}, ("eval", "sample_prompts")),
        ({"sample_prompts": ["a"], "sample_max_new_tokens": 0}, ("eval", "sample_max_new_tokens")),
        ({"sample_prompts": ["a"], "sample_max_new_tokens": 513}, ("eval", "sample_max_new_tokens")),
        ({"sample_prompt": ["a"]}, ("eval", "sample_prompt")),
    ],
)
def test_sample_prompts_are_bounded(eval_: dict[str, Any], where: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_minimal(eval=eval_))
    assert [tuple(e["loc"]) for e in exc.value.errors()] == [where]


def test_integrations_name_trackers_and_their_report_to() -> None:
    spec = JobSpec.model_validate(
        _minimal(
            integrations={
                "wandb": {"project": "my-proj", "entity": "team", "tags": ["a", "b:c"]},
                "mlflow": {"experiment": "exp one"},
                "tensorboard": True,
            }
        )
    )
    assert spec.integrations.report_to == ["wandb", "mlflow", "tensorboard"]
    assert JobSpec.model_validate(_minimal()).integrations.report_to == []


@pytest.mark.parametrize(
    ("integrations", "where"),
    [
        ({"wandb": {"project": "has space"}}, ("integrations", "wandb", "project")),
        ({"wandb": {"project": "p", "tags": ["a,b"]}}, ("integrations", "wandb", "tags", 0)),
        ({"wandb": {}}, ("integrations", "wandb", "project")),
        ({"mlflow": {"experiment": "x\n"}}, ("integrations", "mlflow", "experiment")),
        (
            {"mlflow": {"experiment": "e", "tracking_uri": "http://x"}},
            ("integrations", "mlflow", "tracking_uri"),
        ),
        ({"comet": {}}, ("integrations", "comet")),
    ],
)
def test_integrations_are_strict(integrations: dict[str, Any], where: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_minimal(integrations=integrations))
    assert [tuple(e["loc"]) for e in exc.value.errors()] == [where]


def test_save_dtype_defaults_to_auto_and_zero3_cannot_save_fp32_from_16_bit_weights() -> None:
    assert JobSpec.model_validate(_minimal()).training.save_dtype == "auto"
    for dtype in ("bf16", "fp16", "fp32", "auto"):
        JobSpec.model_validate(_minimal(training={"max_steps": 10, "save_dtype": dtype}))
    with pytest.raises(ValidationError):
        JobSpec.model_validate(_minimal(training={"max_steps": 10, "save_dtype": "int8"}))
    zero3 = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
    res = {"device": "cuda", "processes_per_node": 2}
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(
            _minimal(training={"max_steps": 10, "save_dtype": "fp32"}, distributed=zero3, resources=res)
        )
    assert "save_dtype" in str(err.value) and "16-bit" in str(err.value)
    # Without mixed precision ZeRO-3's weights are fp32, and so is the gather.
    JobSpec.model_validate(
        _minimal(
            training={"max_steps": 10, "save_dtype": "fp32", "mixed_precision": "no"},
            distributed=zero3,
            resources=res,
        )
    )


def test_qlora_needs_a_strategy_that_can_hold_4_bit_weights_and_cuda_to_shard_them() -> None:
    lora = {
        "r": 16,
        "quantization": {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bf16"},
    }
    cuda = {"device": "cuda", "processes_per_node": 8}
    ok = JobSpec.model_validate(
        _minimal(
            lora=lora, resources=cuda, distributed={"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
        )
    )
    assert ok.lora is not None and ok.lora.quantization is not None and ok.lora.quantization.type == "nf4"
    JobSpec.model_validate(_minimal(lora=lora, resources=cuda, distributed={"strategy": "ddp"}))
    # bitsandbytes' CPU kernels: one process, or DDP.
    JobSpec.model_validate(_minimal(lora=lora, resources={"device": "cpu"}))
    JobSpec.model_validate(
        _minimal(
            lora=lora, resources={"device": "cpu", "processes_per_node": 2}, distributed={"strategy": "ddp"}
        )
    )
    refused = [
        {
            "lora": lora,
            "resources": {"device": "cpu", "processes_per_node": 2},
            "distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
        },
        {"lora": lora, "resources": cuda, "distributed": {"strategy": "fsdp"}},
        {
            "lora": lora,
            "resources": cuda,
            "distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3, "offload_params": "cpu"}},
        },
    ]
    for body in refused:
        with pytest.raises(ValidationError) as err:
            JobSpec.model_validate(_minimal(**body))
        (error,) = err.value.errors()
        cause = (error.get("ctx") or {}).get("error")
        assert isinstance(cause, SpecFieldError) and cause.loc == ("lora", "quantization"), error
    with pytest.raises(ValidationError):  # only 4 bits
        JobSpec.model_validate(_minimal(lora={"quantization": {"bits": 8}}, resources=cuda))


# Issue 48: a suite name used twice is a 422 on the second suite's name (not on the list), and a boolean is
# never a checkpoint (JSON's true would pass for the step 1, false for the step 0).


def _suite(name: str) -> dict[str, Any]:
    return {"name": name, "type": "loss", "dataset": "./held.jsonl"}


@pytest.mark.parametrize("names", [["qa", "held", "qa"], ["select", "select"]])
def test_a_suite_name_used_twice_is_refused_on_the_second_suites_name(names: list[str]) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(_minimal(eval={"suites": [_suite(n) for n in names]}))
    cause = caught.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, SpecFieldError)
    assert cause.loc == ("suites", len(names) - 1, "name")
    assert f"both named {names[0]!r}" in cause.message


@pytest.mark.parametrize("value", [True, False])
def test_resume_from_refuses_a_boolean_checkpoint(value: bool) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(_minimal(resume_from={"job_id": "job_0123456789abcdef", "checkpoint": value}))
    (error,) = caught.value.errors()
    assert error["loc"] == ("resume_from", "checkpoint")
    assert "not a checkpoint" in error["msg"]
    spec = JobSpec.model_validate(_minimal(resume_from={"job_id": "job_0123456789abcdef", "checkpoint": 1}))
    assert spec.resume_from is not None and spec.resume_from.checkpoint == 1


@pytest.mark.parametrize("model", ["EvaluationCreate", "ExportCreate"])
def test_evaluation_and_export_requests_refuse_a_boolean_checkpoint(model: str) -> None:
    from ftq.contract import schemas

    cls = getattr(schemas, model)
    extra = {"kind": "adapter"} if model == "ExportCreate" else {}
    for value in (True, False):
        with pytest.raises(ValidationError) as caught:
            cls.model_validate({**extra, "checkpoint": value})
        (error,) = caught.value.errors()
        assert error["loc"] == ("checkpoint",) and "not a checkpoint" in error["msg"]
    assert cls.model_validate({**extra, "checkpoint": 1}).checkpoint == 1
    assert cls.model_validate({**extra, "checkpoint": "best"}).checkpoint == "best"
