"""ftq.runtime.files: server-chosen paths, and the line-by-line validation of an uploaded JSON Lines file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftq.contract.datasets import detect_formats
from ftq.runtime import files

OPENAI_PREFERENCE: dict[str, object] = {
    "input": {"messages": [{"role": "user", "content": "count from one."}], "tools": []},
    "preferred_output": [{"role": "assistant", "content": "one two three."}],
    "non_preferred_output": [{"role": "assistant", "content": "three two one."}],
}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "count", "arguments": '{"start": 1}'}}
OPENAI_CHAT: dict[str, object] = {
    "messages": [
        {"role": "system", "content": "you are a tiny helpful model."},
        {"role": "user", "content": "count from one."},
        {"role": "assistant", "content": "one two four.", "weight": 0},
        {"role": "user", "content": "again."},
        {"role": "assistant", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one two three"},
        {"role": "assistant", "content": [{"type": "text", "text": "one two three."}], "weight": 1},
    ],
    "tools": [{"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}],
    "parallel_tool_calls": False,
}


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_paths_are_the_servers_and_refuse_anything_but_an_id(tmp_path: Path) -> None:
    fid = files.new_file_id()
    path = files.file_path(tmp_path, "alice/../../x", fid)
    assert path.parent.parent == tmp_path / "files"
    assert path.name == f"{fid}.jsonl" and "alice" not in str(path)
    assert files.file_path(tmp_path, "bob", fid).parent != path.parent
    for bad in ("../x", "file_../../etc", "file_" + "g" * 24, fid + "/x"):
        with pytest.raises(ValueError):
            files.file_path(tmp_path, "alice", bad)


def test_display_name_keeps_the_last_part_only() -> None:
    assert files.display_name("../../etc/passwd") == "passwd"
    assert files.display_name("C:\\x\\data.jsonl") == "data.jsonl"
    assert files.display_name("a\x00b\nc.jsonl") == "abc.jsonl"
    assert files.display_name("") == "upload.jsonl"
    assert len(files.display_name("x" * 1000)) == 255


@pytest.mark.parametrize(
    ("row", "formats"),
    [
        ({"text": "hi"}, {"text"}),
        # A conversation that does not end with the assistant's turn is also OpenAI's reinforcement row.
        ({"messages": [{"role": "user", "content": "hi"}]}, {"messages", "openai_reinforcement"}),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            {"messages"},
        ),
        (OPENAI_PREFERENCE, {"openai_preference"}),
        ({"prompt": "p", "completion": "c"}, {"prompt_completion"}),
        ({"prompt": "p", "chosen": "a", "rejected": "b"}, {"preference"}),
        ({"prompt": "p", "completion": "c", "label": True}, {"prompt_completion", "unpaired_preference"}),
        ({"body": "x"}, set()),
        ({"text": ""}, set()),
    ],
)
def test_detect_formats(row: dict[str, object], formats: set[str]) -> None:
    assert detect_formats(row) == formats


def test_a_good_file_is_ok_with_rows_columns_formats_and_methods(tmp_path: Path) -> None:
    rows = [json.dumps({"prompt": "p", "chosen": "a", "rejected": "b", "id": i}) for i in range(4)]
    got = files.validate_jsonl(_write(tmp_path, ["\ufeff" + rows[0], *rows[1:], ""]))
    assert got.ok and got.rows == 4
    assert got.columns == ["prompt", "chosen", "rejected", "id"]
    assert got.formats == ["preference"]
    assert got.methods == ["dpo", "reward"]


def test_errors_name_their_lines(tmp_path: Path) -> None:
    lines = [
        '{"text": "a"}',
        "{bad",
        "[1, 2]",
        '{"other": 1}',
        '{"text": " "}',
        "",
        '{"messages": [{"role": "user", "content": "x"}]}',
    ]
    got = files.validate_jsonl(_write(tmp_path, lines))
    assert not got.ok
    assert [e["line"] for e in got.errors] == [2, 3, 4, 5, 7]
    assert "rows before it are text" in got.errors[-1]["message"]
    assert got.rows == 1 and got.formats == ["text"]


def test_errors_are_capped_but_counted(tmp_path: Path) -> None:
    got = files.validate_jsonl(_write(tmp_path, ["nope"] * 50))
    assert len(got.errors) == files.MAX_ERRORS and got.error_count == 50


def test_an_empty_file_is_invalid(tmp_path: Path) -> None:
    got = files.validate_jsonl(_write(tmp_path, [""]))
    assert not got.ok and got.errors[0]["message"] == "the file holds no rows"


def test_a_line_past_the_cap_is_an_error_and_not_kept(tmp_path: Path) -> None:
    path = _write(tmp_path, ['{"text": "a"}', '{"text": "' + "x" * 5000 + '"}', '{"text": "b"}'])
    got = files.validate_jsonl(path, max_line_bytes=1000)
    assert got.rows == 2
    assert got.errors == [{"line": 2, "message": "the line is longer than 1000 bytes"}]


def test_stale_partial_uploads_are_removed_and_fresh_ones_kept(tmp_path: Path) -> None:
    import os
    import time

    folder = files.owner_dir(tmp_path, "alice")
    folder.mkdir(parents=True)
    old, fresh, done = (folder / ".file_a.part", folder / ".file_b.part", folder / "file_c.jsonl")
    for p in (old, fresh, done):
        p.write_text("x")
    long_ago = time.time() - files.STALE_PART_SECONDS - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(done, (long_ago, long_ago))
    assert files.remove_stale_parts(tmp_path) == 1
    assert not old.exists() and fresh.exists() and done.exists()


def test_openai_files_validate_and_list_their_formats_and_methods(tmp_path: Path) -> None:
    chat = files.validate_jsonl(_write(tmp_path, [json.dumps(OPENAI_CHAT)] * 3))
    assert chat.ok and chat.formats == ["messages"] and chat.methods == ["sft"], chat.errors
    pref = files.validate_jsonl(_write(tmp_path, [json.dumps(OPENAI_PREFERENCE)] * 2))
    assert pref.ok and pref.formats == ["openai_preference"] and pref.methods == ["dpo", "reward"]
    assert pref.columns == ["input", "preferred_output", "non_preferred_output"]
    rl = {"messages": [{"role": "user", "content": "what is 2+2?"}], "reference_answer": "4", "id": 1}
    reinforce = files.validate_jsonl(_write(tmp_path, [json.dumps(rl)] * 2))
    assert reinforce.ok and reinforce.formats == ["messages", "openai_reinforcement"], reinforce.errors
    assert reinforce.columns == ["messages", "reference_answer", "id"]


def _with_message(i: int, **changes: object) -> str:
    row = json.loads(json.dumps(OPENAI_CHAT))
    row["messages"][i].update(changes)
    return json.dumps(row)


def test_openai_rows_that_break_the_format_are_errors_naming_line_and_message(tmp_path: Path) -> None:
    bad_pref = {**OPENAI_PREFERENCE, "preferred_output": [{"role": "user", "content": "x"}]}
    lines = [
        json.dumps(OPENAI_CHAT),
        _with_message(1, weight=0),
        _with_message(2, weight=2),
        _with_message(2, weight=True),
        _with_message(1, role="bot"),
        _with_message(5, tool_call_id=None),
        _with_message(4, tool_calls=[{"type": "function", "function": {"arguments": "{}"}}]),
        _with_message(1, content=None),
        _with_message(1, content=[{"type": "image_url", "image_url": {"url": "x"}}]),
        json.dumps(bad_pref),
        json.dumps({**OPENAI_PREFERENCE, "input": {"tools": []}}),
        json.dumps({**OPENAI_CHAT, "parallel_tool_calls": "yes"}),
        json.dumps(OPENAI_CHAT),
    ]
    got = files.validate_jsonl(_write(tmp_path, lines))
    messages = {e["line"]: e["message"] for e in got.errors}
    assert list(messages) == list(range(2, 13)), got.errors
    assert messages[2] == "messages[1].weight is only allowed on assistant messages"
    assert messages[3] == "messages[2].weight must be 0 or 1, not 2"
    assert messages[4] == "messages[2].weight must be 0 or 1, not True"
    assert messages[5].startswith("messages[1].role 'bot' is not one of system, developer, user")
    assert messages[6] == "messages[5] (role tool) needs tool_call_id, the id of the call it answers"
    assert messages[7].startswith("messages[4].tool_calls[0] needs function.name")
    assert messages[8].startswith("messages[1].content is missing")
    assert messages[9].startswith("messages[1].content[0] is not a text part")
    assert messages[10] == "preferred_output[0] must be an assistant message"
    assert messages[11].startswith("input must be an object with messages")
    assert messages[12] == "parallel_tool_calls must be true or false"
    assert got.rows == 2 and got.formats == ["messages"]


def test_a_dead_uploads_part_file_reserves_nothing_and_is_swept(tmp_path: Path) -> None:
    """An upload reserves room as its `.part` file's length while its writer lives (it holds the file's
    lock); the fault campaign found that a SIGKILLed API left reservations that blocked the owner's
    uploads until the body deadline. Without a live writer, a `.part` file counts for nothing and is
    swept a minute later."""
    import os
    import time

    folder = files.owner_dir(tmp_path, "alice")
    folder.mkdir(parents=True)
    live, dead = folder / ".file_live.part", folder / ".file_dead.part"
    fd = os.open(live, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        files.lock_part(fd)
        os.ftruncate(fd, 3000)
        dead.write_bytes(b"\0" * 5000)
        assert files.bytes_in_flight(tmp_path, "alice", younger_than=3600) == 3000
        assert files.bytes_in_flight(tmp_path, "alice", younger_than=3600, besides=live) == 0
        a_while_ago = time.time() - files.DEAD_PART_SECONDS - 10
        for p in (live, dead):
            os.utime(p, (a_while_ago, a_while_ago))
        assert files.remove_stale_parts(tmp_path) == 1
        assert live.exists() and not dead.exists()
    finally:
        os.close(fd)
