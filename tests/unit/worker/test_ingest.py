"""Tailing metrics.jsonl (worker/ingest.py): only whole lines, points parsed leniently."""

from __future__ import annotations

from pathlib import Path

from worker import ingest


def test_only_complete_lines_are_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    lines, offset = ingest.read_new_lines(path, 0)
    assert lines == [b'{"step": 1, "loss": 2.0}'] and offset == 25
    assert ingest.read_new_lines(path, offset) == ([], offset)
    with path.open("ab") as f:
        f.write(b'ss": NaN, "max_steps": 9}\n')
    lines, offset2 = ingest.read_new_lines(path, offset)
    point = ingest.parse_point(lines[0])
    assert point is not None and point["step"] == 2 and point["loss"] is None and point["max_steps"] == 9
    assert offset2 == path.stat().st_size
    assert ingest.parse_point(b"not json") is None and ingest.parse_point(b'{"loss": 1}') is None
