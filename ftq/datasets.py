"""What a row of training data is: which of the data formats (ftq.spec.FORMAT_COLUMNS) it can be read as.

Pure functions on parsed rows (no I/O): the submit-time check of a local .jsonl file and the Files API's
validation both ask `detect_formats` about each row they read, and `methods_for` which training methods a
set of formats suits. Column names are TRL's (`text`, `messages`, `prompt`, `completion`, `chosen`,
`rejected`, `label`); a spec may rename only `text` and `messages` (dataset.text_field, messages_field).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ftq.spec import METHOD_FORMATS

__all__ = ["detect_formats", "is_messages", "methods_for"]


def is_messages(value: Any) -> bool:
    """A conversation: a non-empty list of {role, content} objects."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    )


def _text_or_messages(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or is_messages(value)


def detect_formats(row: dict[str, Any]) -> set[str]:
    """The formats `row` can be read as, by TRL's column names; empty when none.

    `text`: a non-empty string `text`. `messages`: a conversation in `messages`. `prompt_completion`:
    `prompt` and `completion`, each text or a conversation. `preference`: `chosen` and `rejected` (text or
    conversations), with a `prompt` when they are text (conversations may carry their prompt as shared first
    turns). `unpaired_preference`: `prompt`, `completion` and a boolean `label`. A row can be several: an
    unpaired preference row is also a prompt/completion row.
    """
    found: set[str] = set()
    if not isinstance(row, dict):
        return found
    if isinstance(row.get("text"), str) and row["text"] != "":
        found.add("text")
    if is_messages(row.get("messages")):
        found.add("messages")
    prompt = row.get("prompt")
    has_prompt = _text_or_messages(prompt)
    if has_prompt and _text_or_messages(row.get("completion")):
        found.add("prompt_completion")
        if isinstance(row.get("label"), bool):
            found.add("unpaired_preference")
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if _text_or_messages(chosen) and _text_or_messages(rejected):
        both_messages = is_messages(chosen) and is_messages(rejected)
        if has_prompt or both_messages:
            found.add("preference")
    return found


def methods_for(formats: Iterable[str]) -> list[str]:
    """The training methods that train on at least one of `formats`, in ftq.spec.METHOD_FORMATS order."""
    have = set(formats)
    return [method for method, accepted in METHOD_FORMATS.items() if have & set(accepted)]
