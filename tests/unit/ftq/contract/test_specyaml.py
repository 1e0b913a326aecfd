"""YAML specs read with YAML 1.2's booleans everywhere: `eval.on` is a key, not True (PyYAML's 1.1
reading made the documented `on: checkpoint` a 422 that said "Keys should be strings")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ftq.client import errors
from ftq.client._core import read_spec_file
from ftq.contract import specyaml
from service.body import parse_body
from service.errors import SpecError

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


# A key written twice (issue 48): PyYAML keeps the last one silently; every reader refuses it instead.

DUPLICATED = """\
name: tiny
training:
  learning_rate: 1.0e-3
  max_steps: 4
  learning_rate: 1.0e-5
"""


def test_a_duplicate_key_is_refused_naming_the_key_its_path_and_both_lines() -> None:
    with pytest.raises(specyaml.DuplicateKeyError) as caught:
        specyaml.load(DUPLICATED)
    err = caught.value
    assert err.path == ["training", "learning_rate"]
    assert (err.line, err.first_line) == (5, 3)
    assert "'training.learning_rate' at line 5 (first at line 3)" in str(err)
    # Inside a list, and at the top level.
    with pytest.raises(specyaml.DuplicateKeyError) as caught:
        specyaml.load("eval:\n  suites:\n    - {name: a, type: loss, name: b}\n")
    assert caught.value.path == ["eval", "suites", 0, "name"]
    assert "'eval.suites[0].name'" in str(caught.value)
    with pytest.raises(specyaml.DuplicateKeyError):
        specyaml.load("name: a\nname: b\n")


def test_a_merge_key_is_not_a_duplicate_and_aliases_are_read_once() -> None:
    text = "base: &b {lr: 1, steps: 4}\nrun:\n  <<: *b\n  lr: 2\nagain: *b\n"
    assert specyaml.load(text)["run"] == {"lr": 2, "steps": 4}
    # Keys of different types are different keys (1 and "1").
    assert specyaml.load("a: {1: x, '1': y}") == {"a": {1: "x", "1": "y"}}


def test_the_service_answers_a_duplicate_key_with_a_422_on_the_key() -> None:
    with pytest.raises(SpecError) as caught:
        parse_body(DUPLICATED.encode(), "yaml")
    assert caught.value.status_code == 422
    (error,) = caught.value.errors
    assert error["loc"] == ["body", "training", "learning_rate"]
    assert error["type"] == "duplicate_key" and "line 5 (first at line 3)" in error["msg"]


def test_the_cli_reads_a_duplicate_key_as_an_error_naming_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(DUPLICATED)
    with pytest.raises(errors.SpecFileError) as caught:
        read_spec_file(path)
    assert "duplicate key 'training.learning_rate' at line 5 (first at line 3)" in str(caught.value)
