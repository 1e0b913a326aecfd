"""ftq.contract.modelcard: the README.md of final/ and of exports, pinned by golden files a reviewer can read
(tests/unit/ftq/golden/modelcard-*.md; FTQ_UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftq.contract.modelcard import ExportFacts, RunFacts, render_model_card
from ftq.contract.spec import JobSpec
from tests.harness import EXAMPLES

GOLDEN = Path(__file__).parents[1] / "golden"

LORA_FACTS = RunFacts(
    job_id="job_0123456789abcdef",
    train_rows=1900,
    eval_rows=100,
    steps=40,
    train_loss=2.12345,
    eval_loss=2.5,
    tokens=20480,
    wall_seconds=3725.0,
    device="cuda",
    devices=8,
)
CPU_FACTS = RunFacts(
    job_id="job_fedcba9876543210",
    train_rows=190,
    eval_rows=None,
    steps=40,
    train_loss=1.0,
    eval_loss=None,
    tokens=None,
    wall_seconds=61.4,
    device="cpu",
    devices=2,
)


def spec(name: str, **over: Any) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    body.update(over)
    return JobSpec.model_validate(body).model_dump(mode="json")


def full_spec() -> dict[str, Any]:
    return spec("llama2-70b-fsdp", lora=None)


CASES = {
    "lora-final": (lambda: spec("falcon-180b-lora-zero3"), LORA_FACTS, None),
    "lora-merged": (
        lambda: spec("falcon-180b-lora-zero3"),
        LORA_FACTS,
        ExportFacts("exp_00112233aabbccdd", "merged", "bf16"),
    ),
    "lora-adapter": (
        lambda: spec("falcon-180b-lora-zero3"),
        LORA_FACTS,
        ExportFacts("exp_00112233aabbccdd", "adapter", "fp16"),
    ),
    "full-merged-cpu": (full_spec, CPU_FACTS, ExportFacts("exp_99887766aabbccdd", "merged", "fp32")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_cards(name: str) -> None:
    make_spec, facts, export = CASES[name]
    text = render_model_card(make_spec(), facts, export)
    path = GOLDEN / f"modelcard-{name}.md"
    if os.environ.get("FTQ_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with FTQ_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{path.name} differs (FTQ_UPDATE_GOLDEN=1 rewrites)"


def _front_matter(text: str) -> dict[str, Any]:
    assert text.startswith("---\n")
    head, _, _ = text[4:].partition("\n---\n")
    meta = yaml.safe_load(head)
    assert isinstance(meta, dict)
    return meta


def test_front_matter_names_base_model_library_and_tags() -> None:
    lora = _front_matter(render_model_card(spec("falcon-180b-lora-zero3"), LORA_FACTS))
    assert lora["base_model"] == "tiiuae/falcon-180B"
    assert lora["library_name"] == "peft"
    assert {"ftq", "sft", "lora"} <= set(lora["tags"])
    merged = _front_matter(
        render_model_card(spec("falcon-180b-lora-zero3"), LORA_FACTS, ExportFacts("exp_1", "merged", "bf16"))
    )
    assert merged["library_name"] == "transformers" and "merged" in merged["tags"]


def test_a_local_base_model_is_named_in_the_text_not_as_hub_metadata() -> None:
    body = spec("falcon-180b-lora-zero3")
    body["model"]["name_or_path"] = "/srv/models/tiny"
    text = render_model_card(body, CPU_FACTS)
    assert "base_model" not in _front_matter(text)
    assert "- Base model: `/srv/models/tiny`" in text


def test_gpu_hours_are_devices_times_wall_time_and_cpu_jobs_say_so() -> None:
    text = render_model_card(spec("falcon-180b-lora-zero3"), LORA_FACTS)
    assert f"{8 * 3725 / 3600:.2f} GPU hours" in text
    cpu = render_model_card(full_spec(), CPU_FACTS)
    assert "none: a CPU job (2 processes)" in cpu and "GPU hours" not in cpu


def test_facts_round_trip_through_json() -> None:
    assert RunFacts.from_json(LORA_FACTS.to_json()) == LORA_FACTS
    # A newer trainer's field this reader does not know is ignored, not an error.
    assert RunFacts.from_json('{"steps": 3, "later_field": 1}').steps == 3
