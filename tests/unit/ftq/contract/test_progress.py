"""ftq/contract/progress.py: a progress record written by the trainer reads back the same; the reader
takes the newest whole record, and what the run may have put in the file (garbage, a torn line, a long
message, a symlink, a FIFO) never breaks it."""

from __future__ import annotations

import os
from pathlib import Path

from ftq.contract import progress, runs
from ftq.contract.progress import ProgressRecord, RunPhase


def test_a_record_round_trips_and_the_newest_is_read(tmp_path: Path) -> None:
    path = tmp_path / runs.PROGRESS
    assert progress.latest(path) is None  # no file yet
    first = progress.fetching("owner/model", 4976698672, 16060522496)
    assert first.message == "fetching owner/model: 4.6 GiB of 15.0 GiB"
    progress.append(path, first)
    assert progress.latest(path) == first
    saving = progress.record(RunPhase.saving, progress.SAVING_FINAL, step=40, max_steps=40)
    progress.append(path, saving)
    assert progress.latest(path) == saving
    # One JSON object per line, without the fields a record does not have.
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and '"repo"' not in lines[1] and '"phase":"saving"' in lines[1]
    assert progress.parse(lines[0]) == first


def test_sizes_read_as_a_person_reads_them() -> None:
    assert (
        progress.fetching("owner/tiny", 996, 547402).message == "fetching owner/tiny: 996 bytes of 534.6 KiB"
    )
    assert progress.human_size(3 * 1024**2 // 2) == "1.5 MiB"


def test_what_is_not_a_whole_record_is_passed_over(tmp_path: Path) -> None:
    path = tmp_path / runs.PROGRESS
    loading = progress.record(RunPhase.loading, progress.LOADING_INPUTS)
    progress.append(path, loading)
    with path.open("a") as f:
        f.write('not json\n[1, 2]\n{"phase": "flying", "time": 1}\n{"time": 2}\n')
        f.write('{"time": 3, "phase": "saving", "mess')  # torn: the trainer is writing it
    assert progress.latest(path) == loading
    for bad in (b"", b"null", b'"loading"', b'{"phase": "loading"}'):
        assert progress.parse(bad) is None


def test_a_long_message_is_cut_and_only_the_files_end_is_read(tmp_path: Path) -> None:
    path = tmp_path / runs.PROGRESS
    long = ProgressRecord(time=1.0, phase=RunPhase.loading, message="x" * 10_000)
    path.write_text(long.model_dump_json() + "\n")
    # One line longer than the window read: nothing whole in it.
    assert progress.latest(path) is None
    progress.append(path, ProgressRecord(time=2.0, phase=RunPhase.loading, message="y" * 1000))
    rec = progress.latest(path)
    assert rec is not None and rec.message == "y" * progress.MESSAGE_LIMIT


def test_a_symlink_or_a_fifo_reads_as_no_record(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.jsonl"
    progress.append(secret, progress.record(RunPhase.loading, "another owner's"))
    link = tmp_path / "link" / runs.PROGRESS
    link.parent.mkdir()
    link.symlink_to(secret)
    assert progress.latest(link) is None
    fifo = tmp_path / "fifo" / runs.PROGRESS
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    assert progress.latest(fifo) is None  # returns at once, never waits for a writer
