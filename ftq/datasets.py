"""What a dataset row is: which of the formats a method trains on it holds.

A minimal version for the Files API's validation; the methods work owns the fuller one (same name, same
signature), which the merge keeps.
"""

from __future__ import annotations

from typing import Any

FORMATS = ("text", "messages", "prompt_completion", "preference", "unpaired_preference")


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    )


def _is_turns(value: Any) -> bool:
    """A prompt, completion, chosen or rejected value: text, or a list of messages."""
    return _is_text(value) or _is_messages(value)


def detect_formats(row: dict[str, Any]) -> set[str]:
    """The formats (names in FORMATS) a row holds, by its fields: `text`; `messages`;
    `prompt`+`completion`; `prompt`+`chosen`+`rejected` (or `chosen`+`rejected` with the prompt inside
    them); `prompt`+`completion`+`label` (a bool)."""
    found: set[str] = set()
    if _is_text(row.get("text")):
        found.add("text")
    if _is_messages(row.get("messages")):
        found.add("messages")
    has_prompt = _is_turns(row.get("prompt"))
    if has_prompt and _is_turns(row.get("completion")):
        found.add("prompt_completion")
        if isinstance(row.get("label"), bool):
            found.add("unpaired_preference")
    if _is_turns(row.get("chosen")) and _is_turns(row.get("rejected")):
        found.add("preference")
    return found
