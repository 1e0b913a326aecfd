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

__all__ = [
    "FORMATS",
    "SuitePrompt",
    "detect_formats",
    "format_problem",
    "is_messages",
    "methods_for",
    "openai_problem",
    "suite_prompt",
]

# Every data format, in the order listings show them.
FORMATS: tuple[str, ...] = tuple(FORMAT_COLUMNS)


def _is_message(m: Any) -> bool:
    # An assistant turn of OpenAI's chat format may carry tool_calls instead of content.
    return isinstance(m, dict) and isinstance(m.get("role"), str) and ("content" in m or "tool_calls" in m)


def is_messages(value: Any) -> bool:
    """A conversation: a non-empty list of {role, content} objects (or assistant {role, tool_calls})."""
    return isinstance(value, list) and bool(value) and all(_is_message(m) for m in value)


def _is_openai_preference(row: dict[str, Any]) -> bool:
    inp = row.get("input")
    return (
        isinstance(inp, dict)
        and is_messages(inp.get("messages"))
        and is_messages(row.get("preferred_output"))
        and is_messages(row.get("non_preferred_output"))
    )


def _text_or_messages(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or is_messages(value)


# A graders suite's prompt: text, or a conversation ({role, content} dicts) for the chat template.
SuitePrompt = str | list[dict[str, Any]]


def suite_prompt(row: Any, prompt_field: str = "prompt") -> tuple[SuitePrompt | None, str]:
    """(the prompt, "") that a graders suite's row gives the model, or (None, why not).

    The row formats GRPO trains on (detect_formats): `prompt_field` holding text or a conversation
    (prompt_only), or, when the row has no such field, OpenAI's reinforcement rows, whose `messages`
    conversation is the prompt. A conversation must end before the assistant's turn: the
    model's completion is the answer graded. The submit-time check (service/jobs/preflight.py) and the
    evaluation (trainer/evaluate.py) ask this alike, so a suite the evaluation cannot read is a 422."""
    if not isinstance(row, dict):
        return None, "is not a JSON object"
    source = prompt_field if prompt_field in row else "messages" if "messages" in row else None
    if source is None:
        return None, (
            f"has no prompt: a text or conversation field {prompt_field!r} (the suite's prompt_field), or "
            "OpenAI's reinforcement rows' 'messages' conversation"
        )
    value = row[source]
    if isinstance(value, str) and value.strip():
        return value, ""
    if is_messages(value):
        if value[-1].get("role") == "assistant":
            return None, (
                f"has a conversation in {source!r} that ends with the assistant's turn: it must end "
                "before it (the model's completion is what the grader scores)"
            )
        return list(value), ""
    return (
        None,
        f"has no prompt in {source!r}: it must be non-empty text or a conversation of {{role, content}}",
    )


def detect_formats(row: dict[str, Any]) -> set[str]:
    """The formats `row` can be read as, by TRL's column names; empty when none.

    `text`: a non-empty string `text`. `messages`: a conversation in `messages`. `prompt_completion`:
    `prompt` and `completion`, each text or a conversation. `preference`: `chosen` and `rejected` (text or
    conversations), with a `prompt` when they are text (conversations may carry their prompt as shared first
    turns). `unpaired_preference`: `prompt`, `completion` and a boolean `label`. `openai_preference`:
    OpenAI's `input.messages`, `preferred_output` and `non_preferred_output`. `openai_reinforcement`: a
    conversation that does not end with an assistant turn (OpenAI's reinforcement rows, whose other fields
    are the graders' references). `prompt_only`: a `prompt` (text or a conversation), whatever else the row
    holds, when the row is not prompt/completion or preference data. A row can be several: an unpaired
    preference row is also a prompt/completion row, a reinforcement row is also a messages row.
    """
    found: set[str] = set()
    if not isinstance(row, dict):
        return found
    if isinstance(row.get("text"), str) and row["text"] != "":
        found.add("text")
    if is_messages(row.get("messages")):
        found.add("messages")
        if row["messages"][-1].get("role") != "assistant":
            # OpenAI's reinforcement rows: the conversation up to the turn the model is to answer.
            found.add("openai_reinforcement")
    if _is_openai_preference(row):
        found.add("openai_preference")
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
    if has_prompt and not found & {"prompt_completion", "preference"}:
        # A prompt alone, for GRPO to complete; the row's other fields are its graders' `item`. (GRPO
        # also takes the prompts of prompt/completion rows: `format: auto` reads the columns.)
        found.add("prompt_only")
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


# OpenAI's chat format, message by message ---------------------------------------------------------------

ROLES = ("system", "developer", "user", "assistant", "tool")


def _content_problem(where: str, m: dict[str, Any]) -> str | None:
    content = m.get("content")
    if content is None:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            return None
        return f"{where}.content is missing (only an assistant turn with tool_calls may leave it out)"
    if isinstance(content, str):
        return None
    if isinstance(content, list) and content:
        for j, part in enumerate(content):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                return (
                    f"{where}.content[{j}] is not a text part ({{type: text, text}}); only text is trained on"
                )
        return None
    return f"{where}.content must be a string or a list of text parts, not {type(content).__name__}"


def _tool_calls_problem(where: str, calls: Any) -> str | None:
    if not isinstance(calls, list) or not calls:
        return f"{where}.tool_calls must be a non-empty list"
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            return (
                f"{at} needs function.name (OpenAI's {{id, type: function, function: {{name, arguments}}}})"
            )
        if call.get("type", "function") != "function":
            return f"{at}.type must be function, not {call.get('type')!r}"
        args = fn.get("arguments")
        if args is not None and not isinstance(args, str | dict):
            return f"{at}.function.arguments must be a JSON string"
    return None


def _message_problem(where: str, m: Any) -> str | None:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return f"{where} is not an object with `role` and `content`"
    role = m["role"]
    if role not in ROLES:
        return f"{where}.role {role!r} is not one of {', '.join(ROLES)}"
    problem = _content_problem(where, m)
    if problem:
        return problem
    if "weight" in m:
        if role != "assistant":
            return f"{where}.weight is only allowed on assistant messages"
        weight = m["weight"]
        if isinstance(weight, bool) or weight not in (0, 1):
            return f"{where}.weight must be 0 or 1, not {weight!r}"
    if "tool_calls" in m:
        if role != "assistant":
            return f"{where}.tool_calls is only allowed on assistant messages"
        problem = _tool_calls_problem(where, m["tool_calls"])
        if problem:
            return problem
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        return f"{where} (role tool) needs tool_call_id, the id of the call it answers"
    return None


def messages_problem(messages: Any, where: str = "messages") -> str | None:
    """The first way `messages` breaks OpenAI's chat format (a known role; string or text-part content,
    or tool_calls on an assistant turn; `weight` 0 or 1 on assistant turns only; tool turns naming their
    call), naming the message by its index; None when it holds."""
    if not isinstance(messages, list) or not messages:
        return f"{where} must be a non-empty list of messages"
    for i, m in enumerate(messages):
        problem = _message_problem(f"{where}[{i}]", m)
        if problem:
            return problem
    return None


def _output_problem(row: dict[str, Any], name: str) -> str | None:
    value = row.get(name)
    if not isinstance(value, list) or not value:
        return f"{name} must be a non-empty list of assistant messages"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") != "assistant":
            return f"{name}[{i}] must be an assistant message"
    return messages_problem(value, name)


def openai_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a row in one of OpenAI's formats (chat, preference, reinforcement), for the
    per-line errors of a file's validation; None when nothing is, or the row is in none of them."""
    if "messages" in row:
        problem = messages_problem(row["messages"])
        if problem:
            return problem
    elif "input" in row or "preferred_output" in row or "non_preferred_output" in row:
        inp = row.get("input")
        if not isinstance(inp, dict) or "messages" not in inp:
            return "input must be an object with messages (OpenAI's preference format)"
        problem = messages_problem(inp["messages"], "input.messages")
        if problem:
            return problem
        for name in ("preferred_output", "non_preferred_output"):
            problem = _output_problem(row, name)
            if problem:
                return problem
        tools = inp.get("tools")
        if tools is not None and not isinstance(tools, list):
            return "input.tools must be a list of tools"
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "tools must be a list of tool objects ({type: function, function: {name, parameters}})"
    if "parallel_tool_calls" in row and not isinstance(row["parallel_tool_calls"], bool):
        return "parallel_tool_calls must be true or false"
    return None
