"""MkDocs hook: the HTTP reference and the spec reference, written at build time from the OpenAPI document
(openapi/openapi.json, which `make openapi` writes and `make openapi-check` keeps fresh) and from
`JobSpec.model_json_schema()`. Nothing generated is checked in, so neither page can drift from the code.

`mkdocs build` loads this file by path (mkdocs.yml `hooks:`); the unit test in tests/unit/docs loads it
the same way and checks that every route and every spec field reaches the Markdown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPENAPI = ROOT / "openapi" / "openapi.json"
HTTP_PAGE = "reference/http.md"
SPEC_PAGE = "reference/spec.md"
METHODS = ("get", "put", "post", "patch", "delete", "head", "options")

Schema = dict[str, Any]


def on_files(files: Any, config: Any) -> Any:
    """Add the two generated pages to the build (mkdocs 1.6 event)."""
    from mkdocs.structure.files import File

    from ftq.contract.spec import JobSpec

    openapi = json.loads(OPENAPI.read_text())
    files.append(File.generated(config, HTTP_PAGE, content=http_reference(openapi)))
    files.append(File.generated(config, SPEC_PAGE, content=spec_reference(JobSpec.model_json_schema())))
    return files


# -- Markdown helpers ------------------------------------------------------------------------------


def cell(text: str) -> str:
    """One table cell: one line, pipes escaped, `<...>` outside code shown rather than read as HTML."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def code(value: Any) -> str:
    return "`" + json.dumps(value) + "`"


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)


# -- JSON schema reading, shared by both pages -----------------------------------------------------


def ref_name(schema: Schema) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def resolve(schema: Schema, defs: dict[str, Schema]) -> Schema:
    name = ref_name(schema)
    return defs[name] if name is not None else schema


def alternatives(schema: Schema) -> list[Schema]:
    """The non-null branches of an anyOf/oneOf (or the schema itself)."""
    branches = schema.get("anyOf") or schema.get("oneOf") or [schema]
    return [b for b in branches if b.get("type") != "null"]


def nullable(schema: Schema) -> bool:
    return any(b.get("type") == "null" for b in schema.get("anyOf") or schema.get("oneOf") or [])


def object_of(schema: Schema, defs: dict[str, Schema]) -> Schema | None:
    """The object with properties this field holds (a nested section), if it is one."""
    branches = alternatives(schema)
    if len(branches) != 1:
        return None
    target = resolve(branches[0], defs)
    return target if "properties" in target else None


def bounds(schema: Schema) -> list[str]:
    out = []
    signs = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))
    for key, sign in signs:
        if key in schema:
            out.append(f"{sign} {schema[key]}")
    for key, words in (("minLength", "min length"), ("maxLength", "max length")):
        if key in schema:
            out.append(f"{words} {schema[key]}")
    for key, words in (("minItems", "min items"), ("maxItems", "max items")):
        if key in schema:
            out.append(f"{words} {schema[key]}")
    if "pattern" in schema:
        out.append(f"pattern `{schema['pattern']}`")
    return out


def type_of(schema: Schema, defs: dict[str, Schema], link: bool = False) -> str:
    """A short type: `integer (≥ 1)`, `list of string`, `Strategy`, `string or null`."""
    branches = alternatives(schema)
    if len(branches) > 1 or (branches and branches[0] is not schema):
        text = " or ".join(type_of(b, defs, link) for b in branches) or "null"
        return text + (" or null" if nullable(schema) else "")
    name = ref_name(schema)
    if name is not None:
        return f"[{name}](#{anchor(name)})" if link else name
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        kind = "list of " + type_of(schema.get("items", {}), defs, link)
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        kind = "map of string to " + type_of(schema["additionalProperties"], defs, link)
    if "const" in schema:
        kind += " " + code(schema["const"])
    limits = bounds(schema)
    return str(kind) + (f" ({', '.join(limits)})" if limits else "")


def allowed(schema: Schema, defs: dict[str, Schema]) -> list[Any]:
    """Every enum or const value the field takes, through refs, unions and list items."""
    values: list[Any] = []
    for branch in alternatives(schema):
        target = resolve(branch, defs)
        values += target.get("enum", [])
        if "const" in target:
            values.append(target["const"])
        if target.get("type") == "array" and isinstance(target.get("items"), dict):
            values += allowed(target["items"], defs)
    return [v for i, v in enumerate(values) if v not in values[:i]]


def description(schema: Schema, defs: dict[str, Schema]) -> str:
    """The field's own description, else the one of the type it names."""
    if schema.get("description"):
        return str(schema["description"])
    for branch in alternatives(schema):
        target = resolve(branch, defs)
        if target.get("description") and "properties" not in target:
            return str(target["description"])
    return ""


def default_of(schema: Schema, name: str, required: list[str]) -> str:
    if "default" in schema:
        return code(schema["default"])
    return "required" if name in required else ""


def field_row(path: str, schema: Schema, parent: Schema, defs: dict[str, Schema]) -> tuple[str, ...]:
    name = path.rsplit(".", 1)[-1]
    values = ", ".join(code(v) for v in allowed(schema, defs))
    return (
        f"`{path}`",
        type_of(schema, defs),
        default_of(schema, name, parent.get("required", [])),
        values,
        description(schema, defs),
    )


# -- the spec reference ----------------------------------------------------------------------------


def sections(
    schema: Schema, defs: dict[str, Schema], prefix: str = "", holder: Schema | None = None
) -> Iterator[tuple[str, Schema, Schema]]:
    """(object path, the object's schema, the field that holds it) for the spec and every object nested in
    it, depth first: each becomes one table."""
    yield prefix, schema, schema if holder is None else holder
    for name, field in schema.get("properties", {}).items():
        nested = object_of(field, defs)
        if nested is not None:
            yield from sections(nested, defs, f"{prefix}{name}.", field)


def leaf_fields(schema: Schema, defs: dict[str, Schema] | None = None, prefix: str = "") -> list[str]:
    """Every field path that holds a value rather than a nested section (`training.max_steps`)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    out: list[str] = []
    for name, field in schema.get("properties", {}).items():
        nested = object_of(field, defs)
        if nested is None:
            out.append(prefix + name)
        else:
            out += leaf_fields(nested, defs, f"{prefix}{name}.")
    return out


def spec_reference(schema: Schema) -> str:
    defs: dict[str, Schema] = schema.get("$defs", {})
    lines = [
        "# Spec reference",
        "",
        "Every field of a job spec (`POST /jobs`, as JSON or YAML), generated from the JSON schema of",
        "`ftq.contract.spec.JobSpec` when the site is built. A section that may be left out (`lora`,",
        "`resume_from`) says so under its heading; [Writing a job spec](../spec/index.md) explains how the",
        "fields work together. Unknown fields are refused (a 422 naming the nearest valid one).",
        "",
    ]
    header = ("field", "type", "default", "allowed values", "description")
    for path, obj, holder in sections(schema, defs):
        section = path.rstrip(".")
        lines += [f"## `{section}`" if section else "## Top level", ""]
        if section:
            note = description(holder, defs) or str(obj.get("description", ""))
            optional = " May be left out (`null`)." if nullable(holder) else ""
            if note or optional:
                lines += [cell(note + optional).strip(), ""]
        rows = [
            field_row(path + name, field, obj, defs)
            for name, field in obj.get("properties", {}).items()
            if object_of(field, defs) is None
        ]
        nested = [f"`{path}{name}`" for name, f in obj.get("properties", {}).items() if object_of(f, defs)]
        lines += table(header, rows) if rows else []
        if nested:
            lines += ["Sections: " + ", ".join(nested) + " (below).", ""]
    return "\n".join(lines)


# -- the HTTP reference ----------------------------------------------------------------------------


def operations(openapi: Schema, key: str = "paths") -> Iterator[tuple[str, str, Schema]]:
    for path, item in openapi.get(key, {}).items():
        for method in METHODS:
            if method in item:
                yield method.upper(), path, item[method]


def body_schemas(content: Schema, defs: dict[str, Schema]) -> str:
    """`application/json`: JobSpec; one line per media type."""
    parts = [f"`{media}`: {type_of(s.get('schema', {}), defs, link=True)}" for media, s in content.items()]
    return "; ".join(parts)


def op_anchor(method: str, path: str) -> str:
    return "op-" + method.lower() + re.sub(r"[^A-Za-z0-9_]+", "-", path).rstrip("-")


def operation(method: str, path: str, op: Schema, defs: dict[str, Schema], level: str) -> list[str]:
    title = f"{level} `{method} {path}` {{#{op_anchor(method, path)}}}"
    lines = [title, "", f"**{cell(op.get('summary', ''))}**", ""]
    if op.get("description"):
        lines += [cell(op["description"]), ""]
    params = [
        (
            f"`{p['name']}`",
            p["in"],
            type_of(p.get("schema", {}), defs, link=True),
            "yes" if p.get("required") else "no",
            code(p["schema"]["default"]) if "default" in p.get("schema", {}) else "",
            p.get("description", ""),
        )
        for p in op.get("parameters", [])
    ]
    if params:
        header = ("name", "in", "type", "required", "default", "description")
        lines += ["Parameters:", "", *table(header, params)]
    if "requestBody" in op:
        body = op["requestBody"]
        need = "required" if body.get("required") else "optional"
        lines += [f"Request body ({need}): " + body_schemas(body.get("content", {}), defs), ""]
        if body.get("description"):
            lines += [cell(body["description"]), ""]
    responses = [
        (f"`{status}`", answer.get("description", ""), body_schemas(answer.get("content", {}), defs))
        for status, answer in op.get("responses", {}).items()
    ]
    lines += ["Responses:", "", *table(("status", "meaning", "body"), responses)]
    return lines


def model(name: str, schema: Schema, defs: dict[str, Schema]) -> list[str]:
    lines = [f"### {name} {{#{anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    if "enum" in schema:
        return [*lines, "One of " + ", ".join(code(v) for v in schema["enum"]) + ".", ""]
    rows = [
        (
            f"`{field}`",
            type_of(prop, defs, link=True),
            "yes" if field in schema.get("required", []) else "no",
            description(prop, defs),
        )
        for field, prop in schema.get("properties", {}).items()
    ]
    if not rows:
        return [*lines, f"Type: {type_of(schema, defs, link=True)}.", ""]
    return lines + table(("field", "type", "required", "description"), rows)


def http_reference(openapi: Schema) -> str:
    defs: dict[str, Schema] = openapi.get("components", {}).get("schemas", {})
    info = openapi.get("info", {})
    lines = [
        "# HTTP reference",
        "",
        f"{info.get('title', '')} {info.get('version', '')}: {info.get('description', '')}",
        "",
        "Generated from the OpenAPI document (`openapi/openapi.json`, served live at `/openapi.json`) when",
        "the site is built. With `FTQ_API_TOKENS` set, every route but `/healthz` and `/readyz` takes",
        "`Authorization: Bearer <token>`; errors are an `ErrorBody` with a machine-readable code. The",
        "fields of `JobSpec` one by one: [Spec reference](spec.md).",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, Schema]]] = {}
    for method, path, op in operations(openapi):
        by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    lines += ["## Endpoints", ""]
    for method, path, op in operations(openapi):
        lines.append(f"- [`{method} {path}`](#{op_anchor(method, path)}): {cell(op.get('summary', ''))}")
    lines.append("")
    for tag, ops in by_tag.items():
        lines += [f"## {tag.capitalize()}", ""]
        for method, path, op in ops:
            lines += operation(method, path, op, defs, "###")
    hooks = list(operations(openapi, "webhooks"))
    if hooks:
        lines += ["## Webhook deliveries", "", "What ftq sends to a registered webhook URL.", ""]
        for method, name, op in hooks:
            lines += operation(method, name, op, defs, "###")
    lines += ["## Models", "", "The request and response bodies named above.", ""]
    for name, schema in sorted(defs.items()):
        lines += model(name, schema, defs)
    return "\n".join(lines)
