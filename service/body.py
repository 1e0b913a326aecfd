"""Request bodies: JSON or YAML, parsed with bounds on nesting and size, off the event loop.

A 1 MB YAML body parsed inside an `async def` froze every request for 36 s, and a body nested a few
thousand levels deep ended in a RecursionError (a 500). Here a body is parsed in a worker thread (a few
at a time, so hostile bodies cannot take the whole thread pool), with libyaml's C loader where PyYAML
has it, and refused with a 422 when it nests deeper than `MAX_DEPTH` or holds more than `MAX_NODES`
values. YAML is scanned as a stream of events first, so a deep or huge document (or an alias bomb,
whose aliases count as the nodes they expand to) is refused before a single object is built.

A body that does not parse says what to change: YAML's line and column (naming a tab, YAML's most
common surprise), application/yaml for YAML sent as JSON, and `--data-binary` for a file whose
newlines `curl -d` stripped.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import yaml

from ftq.contract.specyaml import DuplicateKeyError, SpecLoader
from ftq.contract.yaml_errors import describe
from service.errors import BadRequest, SpecError, UnsupportedMediaType

# A job spec nests about five levels and holds a few hundred values; these leave room for growth.
MAX_DEPTH = 64
MAX_NODES = 10_000

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")

_Loader: type[Any] = SpecLoader  # YAML 1.2 booleans: `on:` is a key, not True
# Bodies parsed at once; the rest of the thread pool stays free for everything else.
_PARSE_SLOTS = anyio.CapacityLimiter(4)


class BodyTooComplex(SpecError):
    def __init__(self, message: str):
        super().__init__([{"loc": ["body"], "msg": message, "type": "too_complex"}])


def _too_deep() -> BodyTooComplex:
    return BodyTooComplex(f"the body nests deeper than {MAX_DEPTH} levels")


def _too_many() -> BodyTooComplex:
    return BodyTooComplex(f"the body holds more than {MAX_NODES} values")


def media_type(content_type: str | None) -> str:
    """`json` or `yaml` for a spec body's Content-Type; anything else (or none) is a 415."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype in JSON_TYPES or (ctype.startswith("application/") and ctype.endswith("+json")):
        return "json"
    if ctype in YAML_TYPES:
        return "yaml"
    shown = ctype or "none"
    fix = "send the spec as application/json or application/yaml"
    if ctype == "application/x-www-form-urlencoded":
        # What `curl -d` sends unless told otherwise.
        fix = (
            "send the spec as application/json or application/yaml, e.g. "
            "`curl -H 'Content-Type: application/yaml' --data-binary @spec.yaml` (curl -d sends a form, "
            "and strips the file's newlines)"
        )
    raise UnsupportedMediaType(f"content type {shown} is not supported; {fix}")


def check_shape(value: Any) -> None:
    """Refuse a parsed value nested deeper than MAX_DEPTH or holding more than MAX_NODES values."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise _too_many()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise _too_deep()
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def scan_yaml(raw: bytes) -> None:
    """Walk the YAML's events (no objects built) and refuse it when too deep or too large.

    An alias counts as the values its anchor holds, so `&a [..]` repeated through aliases is counted
    expanded; an alias to a collection still open (a document that contains itself) is refused."""
    loader = _Loader(raw)
    try:
        total = 0
        open_anchors: set[str] = set()
        sizes: dict[str, int] = {}
        stack: list[tuple[str | None, int]] = []  # (anchor, total before the collection)
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.ScalarEvent):
                total += 1
                if event.anchor:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor is None:  # the parser always names an alias's anchor
                    continue
                if event.anchor in open_anchors:
                    raise BodyTooComplex(f"the YAML alias *{event.anchor} refers to a value that contains it")
                total += sizes.get(event.anchor, 1)
            elif isinstance(event, yaml.CollectionStartEvent):
                stack.append((event.anchor, total))
                total += 1
                if len(stack) > MAX_DEPTH:
                    raise _too_deep()
                if event.anchor:
                    open_anchors.add(event.anchor)
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, before = stack.pop()
                if anchor:
                    open_anchors.discard(anchor)
                    sizes[anchor] = total - before
            if total > MAX_NODES:
                raise _too_many()
    finally:
        loader.dispose()


def parse_body(raw: bytes, kind: str) -> Any:
    """Parse a spec body (blocking: call it in a worker thread). 400 when it is not JSON/YAML at all,
    422 when it is too deep or too large."""
    if not raw.strip():
        raise BadRequest("the request body is empty; send a job spec as JSON or YAML")
    if kind == "yaml":
        try:
            scan_yaml(raw)
            value = yaml.load(raw, Loader=_Loader)  # noqa: S506 (a safe loader: CSafeLoader or SafeLoader)
        except DuplicateKeyError as exc:
            # Well-formed text whose meaning is ambiguous (PyYAML would keep the last value): a 422 on
            # the key, as a spec's other mistakes are.
            raise SpecError(
                [{"loc": ["body", *exc.path], "msg": exc.message, "type": "duplicate_key"}]
            ) from None
        except yaml.YAMLError as exc:
            if "nesting depth" in str(getattr(exc, "problem", "")):
                # libyaml's own cap (1000 levels) can stop its scanner before our event walk does.
                raise _too_deep() from None
            raise BadRequest(_yaml_problem(raw, exc)) from None
        except (ValueError, TypeError, OverflowError) as exc:
            # Values the safe constructor cannot build: a 5000-digit int, a 13th month.
            raise BadRequest(f"the body is not valid YAML: {exc}") from None
        except RecursionError:
            raise _too_deep() from None
    else:
        try:
            value = json.loads(raw)
        except RecursionError:
            raise _too_deep() from None
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            hint = ""
            if _one_line_yaml(raw):
                hint = f"; it reads as YAML: send it with Content-Type: application/yaml. {_ONE_LINE_FIX}"
            elif _is_yaml(raw):
                hint = "; it reads as YAML: send it with Content-Type: application/yaml"
            raise BadRequest(f"the body is not valid JSON: {exc}{hint}") from None
    if kind == "yaml" and not isinstance(value, dict) and _one_line_yaml(raw):
        raise BadRequest(_ONE_LINE)
    check_shape(value)
    return value


# `curl -d @spec.yaml` strips the file's newlines, which leaves YAML that cannot mean a spec.
_ONE_LINE_FIX = (
    "It is one line with several `key: value` pairs, as `curl -d @spec.yaml` sends a file (-d strips "
    "newlines); send the file as it is with `curl --data-binary @spec.yaml`"
)
_ONE_LINE = f"the body is not a YAML job spec. {_ONE_LINE_FIX}"


def _one_line_yaml(raw: bytes) -> bool:
    text = raw.strip()
    return b"\n" not in text and not text.startswith((b"{", b"[")) and text.count(b": ") >= 2


def _yaml_problem(raw: bytes, exc: yaml.YAMLError) -> str:
    """The parser's problem with its line and column (1-based), naming a tab where it found one, or
    the curl fix where the body is one line."""
    if _one_line_yaml(raw):
        return _ONE_LINE
    return "the body is " + describe(raw.decode("utf-8", "replace"), exc)


def _is_yaml(raw: bytes) -> bool:
    """Whether a body that is not JSON is a YAML mapping (so a spec sent with the wrong content type);
    a body that looks like JSON (YAML would forgive its trailing comma) keeps the JSON error alone."""
    if raw.lstrip().startswith((b"{", b"[")):
        return False
    try:
        scan_yaml(raw)
        return isinstance(yaml.load(raw, Loader=_Loader), dict)  # noqa: S506 (a safe loader)
    except Exception:  # any failure means "not YAML either": the JSON error stands
        return False


async def read_spec_body(body: bytes, content_type: str | None) -> Any:
    """The spec body parsed in a worker thread, so the event loop keeps answering meanwhile."""
    kind = media_type(content_type)
    return await anyio.to_thread.run_sync(parse_body, body, kind, limiter=_PARSE_SLOTS)
