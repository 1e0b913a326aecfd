"""What a row of training data is: which of the data formats (ftq.contract.spec.FORMAT_COLUMNS) it can be
read as.

Pure functions on parsed rows (no I/O): the submit-time check of a local .jsonl file and the Files API's
validation both ask `detect_formats` about each row they read, `methods_for` which training methods a
set of formats suits, and `format_problem` whether what they found fits a job's method, format and
loss_on. Column names are TRL's (`text`, `messages`, `prompt`, `completion`, `chosen`, `rejected`,
`label`); a spec may rename only `text` and `messages` (dataset.text_field, messages_field).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ftq.contract.spec import (
    FORMAT_COLUMNS,
    LOSS_ON_FORMATS,
    METHOD_FORMATS,
    DatasetSpec,
    TrainingSpec,
    auto_format,
    format_columns,
)

__all__ = ["FORMATS", "detect_formats", "format_problem", "is_messages", "methods_for"]

# Every data format, in the order listings show them.
FORMATS: tuple[str, ...] = tuple(FORMAT_COLUMNS)


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
    """The training methods that train on at least one of `formats`, in ftq.contract.spec.METHOD_FORMATS
    order."""
    have = set(formats)
    return [method for method, accepted in METHOD_FORMATS.items() if have & set(accepted)]


def format_problem(
    dataset: DatasetSpec, training: TrainingSpec, columns: list[str], formats: set[str], where: str
) -> tuple[tuple[str, ...], str] | None:
    """(spec field, why) when data with these columns (and, in every row seen, these formats) cannot be
    what the job's method and format need, or cannot be masked as training.loss_on asks; None when it
    can. `where` names the data for the message ("the first 12 row(s) of ./x.jsonl", "file file_..").
    The field is the dataset field to rename (text_field, messages_field), dataset.format when it was
    given, else training.method; or training.loss_on."""
    method, fmt = str(training.method), str(dataset.format)
    text_field, messages_field = dataset.text_field, dataset.messages_field
    if fmt == "auto":
        fmt = auto_format(method, columns, text_field, messages_field)
    needed = format_columns(fmt, text_field, messages_field)
    missing = [c for c in needed if c not in columns]
    found = ", ".join(columns) or "none"
    if missing:
        if fmt in ("text", "messages") and str(dataset.format) in ("auto", fmt) and method == "sft":
            setting = "messages_field" if fmt == "messages" else "text_field"
            return ("dataset", setting), (
                f"{where} have no field {missing[0]!r} (fields found: {found}); set dataset.{setting} to "
                "one of them"
            )
        field = ("dataset", "format") if str(dataset.format) != "auto" else ("training", "method")
        what = f"dataset.format {fmt}" if field[0] == "dataset" else f"training.method {method} ({fmt} data)"
        suits = methods_for(formats)
        hint = (
            f"; these rows suit training.method {' or '.join(suits)}"
            if suits and method not in suits
            else f"; give rows with {', '.join(needed)}"
        )
        return field, (
            f"{what} needs the column(s) {', '.join(missing)}, which {where} lack "
            f"(fields found: {found}){hint}"
        )
    loss_on = str(training.loss_on)
    if loss_on != "all" and fmt not in LOSS_ON_FORMATS[loss_on]:
        return ("training", "loss_on"), (
            f"loss_on {loss_on} needs {' or '.join(LOSS_ON_FORMATS[loss_on])} data, and {where} are {fmt} "
            f"(fields found: {found})"
        )
    return None
