"""docs/hooks.py, the MkDocs hook that writes the HTTP reference from openapi/openapi.json and the spec
reference from JobSpec's JSON schema: every route, every model and every spec field reaches the Markdown,
each spec field with its default and allowed values; and the settings page names every setting."""

from __future__ import annotations

import enum
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest

from ftq.contract.spec import JobSpec
from ftq.runtime.settings import Settings
from tests.harness.env import load_script

ROOT = Path(__file__).resolve().parents[3]
METHODS = ("get", "put", "post", "patch", "delete", "head")


def load_hooks() -> types.ModuleType:
    # mkdocs loads the hook by path (docs/ is no package), so the test does too.
    return load_script("docs/hooks.py")


hooks = load_hooks()


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return dict(json.loads((ROOT / "openapi" / "openapi.json").read_text()))


@pytest.fixture(scope="module")
def http_md(openapi: dict[str, Any]) -> str:
    return str(hooks.http_reference(openapi))


@pytest.fixture(scope="module")
def spec_md() -> str:
    return str(hooks.spec_reference(JobSpec.model_json_schema()))


def test_every_route_and_webhook_has_a_section(openapi: dict[str, Any], http_md: str) -> None:
    routes = [(m, p) for key in ("paths", "webhooks") for p, item in openapi[key].items() for m in item]
    assert len(routes) > 30  # the document really was read
    for method, path in routes:
        assert method in METHODS
        heading = f"### `{method.upper()} {path}`"
        assert heading in http_md, f"{method.upper()} {path} is missing from the HTTP reference"


def test_every_parameter_status_and_model_is_listed(openapi: dict[str, Any], http_md: str) -> None:
    sections = http_md.split("\n### ")
    for path, item in openapi["paths"].items():
        for method, op in item.items():
            (section,) = [s for s in sections if s.startswith(f"`{method.upper()} {path}` ")]
            assert op["summary"] in section
            for param in op.get("parameters", []):
                assert f"| `{param['name']}` | {param['in']} |" in section, (path, param["name"])
            for status in op["responses"]:
                assert f"| `{status}` |" in section, (path, status)
            if "requestBody" in op:
                for media in op["requestBody"]["content"]:
                    assert f"`{media}`: " in section, (path, media)
    for name in openapi["components"]["schemas"]:
        assert f"### {name} {{#schema-{name}}}" in http_md


def model_fields(model: type[pydantic.BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every leaf field of a pydantic model by its dotted path, read from the models themselves (not from
    the JSON schema the page is made from), with its annotation."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        nested = [a for a in typing.get_args(field.annotation) or (field.annotation,) if is_model(a)]
        if nested:
            out.update(model_fields(nested[0], f"{prefix}{name}."))
        else:
            out[prefix + name] = field.annotation
    return out


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)


def row_of(markdown: str, path: str) -> str:
    rows = [line for line in markdown.splitlines() if line.startswith(f"| `{path}` |")]
    assert len(rows) == 1, f"{path}: {len(rows)} rows in the spec reference"
    return rows[0]


def enum_values(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation) or (annotation,)
    values: list[Any] = []
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            values += [member.value for member in arg]
        elif typing.get_origin(arg) is typing.Literal:
            values += list(typing.get_args(arg))
        elif typing.get_args(arg):
            values += enum_values(arg)
    return values


def test_every_spec_field_has_a_row_with_its_allowed_values(spec_md: str) -> None:
    fields = model_fields(JobSpec)
    assert {"training.max_steps", "resources.slurm.time_limit", "training.dpo.beta"} <= set(fields)
    assert sorted(fields) == sorted(hooks.leaf_fields(JobSpec.model_json_schema()))
    for path, annotation in fields.items():
        row = row_of(spec_md, path)
        for value in enum_values(annotation):
            assert f"`{json.dumps(value)}`" in row, f"{path}: allowed value {value!r} missing"


def test_spec_rows_carry_defaults_and_descriptions(spec_md: str) -> None:
    row = row_of(spec_md, "training.learning_rate")
    assert "| `5e-05` |" in row and "number (> 0" not in row  # `>` outside code is escaped
    assert "&gt; 0" in row
    assert "| required |" in row_of(spec_md, "model.name_or_path")
    stop = row_of(spec_md, "training.stop_on_nan")
    assert "`true`" in stop and "diverged" in stop


def test_the_settings_page_names_every_setting() -> None:
    page = (ROOT / "docs" / "operating" / "settings.md").read_text()
    missing = [f"FTQ_{name.upper()}" for name in Settings.model_fields if f"`FTQ_{name.upper()}`" not in page]
    assert not missing, f"settings not on docs/operating/settings.md: {missing}"


def test_the_readme_links_resolve() -> None:
    # mkdocs checks the links inside the site; the README is outside it, read on the forge as Markdown.
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert "docs/getting-started.md" in local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
