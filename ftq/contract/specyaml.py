"""How every ftq process reads a YAML spec: PyYAML's safe loader with YAML 1.2's booleans. PyYAML
follows YAML 1.1, where `on`, `off`, `yes`, `no`, `y` and `n` are booleans, so `eval: {on: checkpoint}`
would arrive as `{True: "checkpoint"}` and `lang: no` as `False`. Here only true/false (any case) are;
everything else a 1.1 parser took for a boolean stays a string. The CLI, the SDK and the service's body
parser share it, so a file means the same wherever it is read."""

from __future__ import annotations

import re
from typing import Any

import yaml

_Base: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BOOL = "tag:yaml.org,2002:bool"


class SpecLoader(_Base):
    """The safe loader (the C one where PyYAML has it) with YAML 1.2's booleans."""


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load(text: str) -> Any:
    """One YAML document, as `yaml.safe_load` reads it but for the booleans (see the module)."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 (a safe loader: SpecLoader derives from SafeLoader)
