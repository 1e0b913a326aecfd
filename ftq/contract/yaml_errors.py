"""Where a YAML document stops parsing, said as a person fixes it: 1-based line and column, and a tab
named as a tab (YAML indents with spaces only, and the parser's "found character that cannot start any
token" does not say which character). The service's body parser and the client's spec reader share it.
"""

from __future__ import annotations

import yaml

from ftq.contract.specyaml import DuplicateKeyError


def describe(text: str, exc: yaml.YAMLError) -> str:
    """`not valid YAML at line L, column C: <problem>` for a parse error of `text` (without the place
    when the parser gave none)."""
    if isinstance(exc, DuplicateKeyError):
        return f"not valid YAML: {exc.message}"
    problem = str(getattr(exc, "problem", None) or str(exc).splitlines()[0])
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"not valid YAML: {problem}"
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    if "\t" in line[: mark.column + 1]:
        tab = line.index("\t") + 1
        return (
            f"not valid YAML at line {mark.line + 1}, column {tab}: a tab character; YAML indents "
            "with spaces only, replace the tab with spaces"
        )
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
