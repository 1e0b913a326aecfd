"""`--resume_from_checkpoint latest` (trainer.train.resume_path): the newest checkpoint that can be
resumed, never a newer folder that a job killed while saving left without trainer_state.json."""

from __future__ import annotations

from pathlib import Path

from tests.harness.assets import checkpoint_dir
from trainer.train import resume_path


def test_latest_is_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    assert resume_path(None, tmp_path) is None
    assert resume_path("latest", tmp_path) is None  # nothing saved yet: from step 0
    checkpoint_dir(tmp_path, 4)
    cut = checkpoint_dir(tmp_path, 8)
    assert resume_path("latest", tmp_path) == str(cut)
    (cut / "trainer_state.json").unlink()
    assert resume_path("latest", tmp_path) == str(tmp_path / "checkpoints" / "checkpoint-4")
    assert resume_path(str(cut), tmp_path) == str(cut)  # a folder named by the user is taken as is
