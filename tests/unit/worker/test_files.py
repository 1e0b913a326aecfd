"""At launch, the local paths a job names are still the ones checked at submit (worker/files.py): a
symbolic link planted since, e.g. in the owner's own run directory towards another owner's upload, is
refused (issue 28, finding 1: every place a path from a user is resolved)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.files import PathChanged, check_local_paths


def test_a_path_that_became_a_link_is_refused_at_launch(tmp_path: Path) -> None:
    mine = tmp_path / "runs" / "job_1" / "final" / "data.jsonl"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"text": "mine"}\n')
    theirs = tmp_path / "files" / "alice" / "file_x.jsonl"
    theirs.parent.mkdir(parents=True)
    theirs.write_text('{"text": "alice"}\n')
    spec = {"model": {"name_or_path": "org/hub-model"}, "dataset": {"name_or_path": str(mine.resolve())}}
    check_local_paths(spec)  # as checked at submit: fine
    mine.unlink()
    mine.symlink_to(theirs)
    with pytest.raises(PathChanged) as caught:
        check_local_paths(spec)
    assert caught.value.code == "dataset_error" and "dataset.name_or_path" in str(caught.value)
    assert str(theirs) not in str(caught.value)  # where the link leads is not told
