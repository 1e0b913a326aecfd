"""YAML specs read with YAML 1.2's booleans everywhere: `eval.on` is a key, not True (PyYAML's 1.1
reading made the documented `on: checkpoint` a 422 that said "Keys should be strings")."""

from __future__ import annotations

import yaml

from ftq.contract import specyaml
from service.body import parse_body

SPEC = """\
eval:
  on: checkpoint
  select: {metric: held/loss, mode: min}
dataset: {name_or_path: ./d.jsonl, text_field: no}
training: {packing: true, gradient_checkpointing: False}
"""


def test_on_off_yes_no_stay_strings_and_true_false_are_booleans() -> None:
    assert yaml.safe_load(SPEC)["eval"] == {
        True: "checkpoint",
        "select": {"metric": "held/loss", "mode": "min"},
    }
    read = specyaml.load(SPEC)
    assert read["eval"]["on"] == "checkpoint"
    assert read["dataset"]["text_field"] == "no"
    assert read["training"] == {"packing": True, "gradient_checkpointing": False}
    assert specyaml.load("a: [yes, off, y, n, TRUE, false]") == {"a": ["yes", "off", "y", "n", True, False]}


def test_the_service_reads_a_yaml_body_the_same_way() -> None:
    assert parse_body(SPEC.encode(), "yaml")["eval"]["on"] == "checkpoint"
