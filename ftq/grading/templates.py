"""`{{sample.output_text}}`, `{{sample.output_json.<key>}}`, `{{item.<field>}}`: each replaced by the value
it names, looked up key by key. No template engine: nothing in a template runs. A rendered template is
at most MAX_RENDERED_CHARS long: a placeholder repeated over a long field is refused, not multiplied."""

from __future__ import annotations

import json
import re
from typing import Any

from ftq.contract.graders import MAX_RENDERED_CHARS
from ftq.grading.errors import GraderError

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_\-]+)*)\s*\}\}")


def lookup(path: str, sample: dict[str, Any], item: dict[str, Any], grader: str) -> Any:
    root, *keys = path.split(".")
    if root not in ("sample", "item"):
        raise GraderError(grader, f"the template names {path!r}: only sample.* and item.* are known")
    value: Any = sample if root == "sample" else item
    for key in keys:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise GraderError(grader, f"the template names {{{{{path}}}}}, which the {root} lacks")
    return value


def render(template: str, sample: dict[str, Any], item: dict[str, Any], grader: str) -> str:
    """The template with each placeholder replaced (a string as is, anything else as JSON); a GraderError
    once the text would pass MAX_RENDERED_CHARS."""
    size = [len(template)]

    def one(match: re.Match[str]) -> str:
        value = lookup(match.group(1), sample, item, grader)
        text = value if isinstance(value, str) else json.dumps(value)
        size[0] += len(text) - len(match.group(0))
        if size[0] > MAX_RENDERED_CHARS:
            raise GraderError(
                grader,
                f"a template renders to more than {MAX_RENDERED_CHARS:,} characters (at {match.group(0)})",
            )
        return text

    return _PLACEHOLDER.sub(one, template)
