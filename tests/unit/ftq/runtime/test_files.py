"""ftq.runtime.files: server-chosen paths, and the line-by-line validation of an uploaded JSON Lines file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftq.contract.datasets import detect_formats
from ftq.runtime import files


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
        ({"messages": [{"role": "user", "content": "hi"}]}, {"messages"}),
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
