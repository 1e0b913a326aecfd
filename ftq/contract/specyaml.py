"""How every ftq process reads a YAML spec: PyYAML's safe loader with YAML 1.2's booleans. PyYAML
follows YAML 1.1, where `on`, `off`, `yes`, `no`, `y` and `n` are booleans, so `eval: {on: checkpoint}`
would arrive as `{True: "checkpoint"}` and `lang: no` as `False`. Here only true/false (any case) are;
everything else a 1.1 parser took for a boolean stays a string. The CLI, the SDK and the service's body
parser share it, so a file means the same wherever it is read.

A key written twice in one mapping is refused (`DuplicateKeyError`, naming the key, its path and both
lines): PyYAML would keep the last one silently, so `learning_rate:` written twice trained with whichever
came last. A merge (`<<: *base`) is not a duplicate: its keys are the defaults the mapping's own keys
override."""

from __future__ import annotations

import re
from typing import Any

import yaml

_Base: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BOOL = "tag:yaml.org,2002:bool"


_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping holds the same key twice. `path`: the keys and indexes down to the duplicate key (the
    key last); `line`, `first_line`: 1-based lines of the duplicate and of the first occurrence."""

    def __init__(self, path: list[str | int], node: yaml.Node, first: yaml.Node):
        self.path = path
        self.key = str(path[-1])
        self.line = node.start_mark.line + 1
        self.first_line = first.start_mark.line + 1
        super().__init__(
            None,
            None,
            f"duplicate key {self.key!r} (first at line {self.first_line}); write each key once",
            node.start_mark,
        )

    def __str__(self) -> str:
        return self.message

    @property
    def message(self) -> str:
        where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in self.path).replace(".[", "[")
        return (
            f"duplicate key {where!r} at line {self.line} (first at line {self.first_line}): YAML would keep "
            "only the last value; write each key once"
        )


def check_duplicate_keys(node: yaml.Node) -> None:
    """DuplicateKeyError for the first mapping (in document order) that holds a scalar key twice."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, list[str | int]]] = [(node, [])]
    while stack:
        current, path = stack.pop()
        if id(current) in seen:  # an alias: its node was checked where its anchor is
            continue
        seen.add(id(current))
        children: list[tuple[yaml.Node, list[str | int]]] = []
        if isinstance(current, yaml.MappingNode):
            keys: dict[tuple[str, str], yaml.Node] = {}
            for key, value in current.value:
                if key.tag == _MERGE or not isinstance(key, yaml.ScalarNode):
                    children.append((value, path))
                    continue
                first = keys.setdefault((key.tag, key.value), key)
                if first is not key:
                    raise DuplicateKeyError([*path, key.value], key, first)
                children.append((value, [*path, key.value]))
        elif isinstance(current, yaml.SequenceNode):
            children = [(item, [*path, i]) for i, item in enumerate(current.value)]
        stack.extend(reversed(children))


class SpecLoader(_Base):
    """The safe loader (the C one where PyYAML has it) with YAML 1.2's booleans, refusing duplicate keys."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_duplicate_keys(node)
        return super().construct_document(node)


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load(text: str) -> Any:
    """One YAML document, as `yaml.safe_load` reads it but for the booleans (see the module)."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 (a safe loader: SpecLoader derives from SafeLoader)
