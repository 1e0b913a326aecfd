"""worker.files on a real SQLite store: an owner's ready upload becomes the path the trainer reads (with an
eval file, a folder whose files the trainer's own loader reads as train and eval splits); a file that is
gone, not ready or another owner's fails the launch with the field named; the validation task records
what it found, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftq.runtime import files
from ftq.runtime.settings import Settings
from ftq.store.db import session_scope
from ftq.store.files_repository import FileRepository, get_file, utcnow
from ftq.store.models import UploadedFile
from tests.harness.inprocess import migrate, use_settings
from worker.files import FileUnavailable, spec_for_run, validate


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    (tmp_path / "data").mkdir()
    s = use_settings(monkeypatch, env="test", data_dir=tmp_path / "data")
    migrate()
    return s


def _upload(settings: Settings, owner: str, lines: list[str], status: str = "validating") -> str:
    file_id = files.new_file_id()
    path = files.file_path(settings.data_path, owner, file_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    with session_scope() as session:
        FileRepository(session, owner).add(
            UploadedFile(
                id=file_id,
                owner=owner,
                filename="x.jsonl",
                bytes=path.stat().st_size,
                sha256="0" * 64,
                status=status,
                error_count=0,
                created_at=utcnow(),
            )
        )
    return file_id


def _spec(file_id: str, eval_file_id: str | None = None) -> dict[str, object]:
    return {"dataset": {"file_id": file_id, "eval_file_id": eval_file_id, "text_field": "text"}}


def test_validation_records_once_and_the_paths_reach_the_trainer(settings: Settings, tmp_path: Path) -> None:
    train = _upload(settings, "alice", [json.dumps({"text": f"t{i}"}) for i in range(6)])
    evaluation = _upload(settings, "alice", [json.dumps({"text": "e"})])
    validate(train)
    validate(evaluation)
    with session_scope() as session:
        row = get_file(session, train)
        assert row is not None and row.status == "ready" and row.rows == 6 and row.formats == ["text"]
        row.rows = 99  # a second delivery of the task must not validate again
    validate(train)
    with session_scope() as session:
        assert get_file(session, train).rows == 99  # type: ignore[union-attr]

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    alone = spec_for_run(_spec(train), "alice", run_dir)
    copied = run_dir / "dataset" / "train.jsonl"
    assert alone["dataset"] == {"name_or_path": str(copied), "text_field": "text"}
    # The run's own copy (a hard link here): a run user reads its run dir, never the uploads folder.
    upload = files.file_path(settings.data_path, "alice", train)
    assert copied.read_bytes() == upload.read_bytes() and copied.stat().st_ino == upload.stat().st_ino

    both = spec_for_run(_spec(train, evaluation), "alice", run_dir)
    ds = both["dataset"]
    assert ds["eval_split"] == "eval" and "file_id" not in ds and "eval_file_id" not in ds
    from trainer.data import load_raw

    splits = load_raw(ds["name_or_path"])
    assert len(splits["train"]) == 6 and len(splits["eval"]) == 1


def test_a_file_that_is_gone_foreign_or_not_ready_fails_the_launch(
    settings: Settings, tmp_path: Path
) -> None:
    pending = _upload(settings, "alice", ['{"text": "a"}'])
    with pytest.raises(FileUnavailable, match="validating"):
        spec_for_run(_spec(pending), "alice", tmp_path)
    validate(pending)
    with pytest.raises(FileUnavailable, match="deleted"):
        spec_for_run(_spec(pending), "bob", tmp_path)  # not bob's: as if it did not exist
    bad = _upload(settings, "alice", ["nope"])
    validate(bad)
    with pytest.raises(FileUnavailable, match=r"dataset\.eval_file_id: .* invalid"):
        spec_for_run(_spec(pending, bad), "alice", tmp_path)
    files.file_path(settings.data_path, "alice", pending).unlink()
    with pytest.raises(FileUnavailable, match="missing"):
        spec_for_run(_spec(pending), "alice", tmp_path)


def test_an_evaluation_suites_upload_becomes_the_runs_copy(settings: Settings, tmp_path: Path) -> None:
    """eval.suites[i].file_id: the run's own copy, named by the suite's `dataset`; another owner's is
    refused."""
    qa = _upload(settings, "alice", [json.dumps({"prompt": "a b", "completion": " c", "answer": "c"})])
    validate(qa)
    spec = {
        "dataset": {"name_or_path": "/x.jsonl"},
        "eval": {"suites": [{"name": "qa", "type": "graders", "file_id": qa}]},
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = spec_for_run(spec, "alice", run_dir)
    suite = out["eval"]["suites"][0]
    assert "file_id" not in suite and suite["dataset"] == str(run_dir / "dataset" / "suite-qa.jsonl")
    assert (
        Path(suite["dataset"]).read_bytes() == files.file_path(settings.data_path, "alice", qa).read_bytes()
    )
    with pytest.raises(FileUnavailable, match=r"eval\.suites\.0\.file_id: .* deleted"):
        spec_for_run(spec, "bob", run_dir)
