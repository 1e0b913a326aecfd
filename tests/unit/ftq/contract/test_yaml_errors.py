"""ftq/contract/yaml_errors.py as `ftq submit` meets it: a spec file whose YAML does not parse is named with
the
line and column of the problem, and a tab is called a tab."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftq.client._core import read_spec_file
from ftq.client.errors import SpecFileError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: x\nmodel:\n\tname_or_path: ./tiny/model\n",
            "not valid YAML at line 3, column 1: a tab character",
        ),
        ("name: x\nmodel:\n  name_or_path: ./m\n   revision: main\n", "at line 4, column 12: mapping values"),
        ("name: x\nmodel: [./m\n", "not valid YAML at line 3, column 1: "),
    ],
    ids=["tab", "indent", "unclosed"],
)
def test_a_spec_file_that_does_not_parse_says_where(tmp_path: Path, text: str, expected: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    with pytest.raises(SpecFileError) as err:
        read_spec_file(spec)
    assert expected in str(err.value), str(err.value)
