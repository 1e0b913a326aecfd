"""The run layout's artifact rules (ftq.contract.runs): which paths a user may download, their kinds, and that
every walk and open refuses symlinks, wherever in the path they are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ftq.contract import runs


def write(path: Path, content: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for name in (
        "spec.json",
        "launch.sh",
        "exit_status",
        "launch.json",
        ".launch.lock",
        "accelerate_config.yaml",
    ):
        write(run / name)
    write(run / "train.log", b"log")
    write(run / "metrics.jsonl", b"{}\n")
    write(run / "final" / "adapter_model.safetensors", b"w" * 10)
    write(run / "final" / "adapter_config.json")
    write(run / "final" / "tokenizer.json")
    write(run / "final" / "special_tokens_map.json")
    write(run / "final" / "README.md")
    write(run / "final" / "training_args.bin")
    write(run / "checkpoints" / "checkpoint-20" / "optimizer.pt")
    write(run / "checkpoints" / "checkpoint-20" / "pytorch_model_fsdp_0" / ".metadata")
    write(run / "checkpoints" / "tmp-checkpoint-40" / "optimizer.pt")  # a save in progress
    write(run / "exports" / "exp_1" / "model-00001-of-00002.safetensors")
    write(run / "exports" / "exp_1" / "README.md")
    return run


def test_the_list_is_the_model_checkpoints_exports_and_logs(run: Path) -> None:
    listed = {a.path: a.kind for a in runs.list_artifacts(run)}
    assert listed == {
        "checkpoints/checkpoint-20/optimizer.pt": "checkpoint",
        "checkpoints/checkpoint-20/pytorch_model_fsdp_0/.metadata": "checkpoint",
        "exports/exp_1/README.md": "card",
        "exports/exp_1/model-00001-of-00002.safetensors": "export",
        "final/README.md": "card",
        "final/adapter_config.json": "adapter",
        "final/adapter_model.safetensors": "adapter",
        "final/special_tokens_map.json": "tokenizer",
        "final/tokenizer.json": "tokenizer",
        "final/training_args.bin": "other",
        "metrics.jsonl": "log",
        "train.log": "log",
    }
    sizes = {a.path: a.size for a in runs.list_artifacts(run)}
    assert sizes["final/adapter_model.safetensors"] == 10
    assert [a.path for a in runs.list_artifacts(run, under="final")][:2] == [
        "final/README.md",
        "final/adapter_config.json",
    ]
    assert {a.path for a in runs.list_artifacts(run, under="checkpoints/checkpoint-20")} == {
        "checkpoints/checkpoint-20/optimizer.pt",
        "checkpoints/checkpoint-20/pytorch_model_fsdp_0/.metadata",
    }
    assert runs.list_artifacts(run / "missing") == []


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("final/model.safetensors", "model"),
        ("final/model-00001-of-00004.safetensors", "model"),
        ("final/model.safetensors.index.json", "model"),
        ("final/config.json", "model"),
        ("final/generation_config.json", "model"),
        ("final/pytorch_model.bin", "model"),
        ("final/merges.txt", "tokenizer"),
        ("final/tokenizer_config.json", "tokenizer"),
        ("final/chat_template.jinja", "tokenizer"),
        ("samples.jsonl", "log"),
    ],
)
def test_kinds(path: str, kind: str) -> None:
    assert runs.artifact_kind(path) == kind


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../ftq.db",
        "final/../spec.json",
        "final/./x",
        "final//x",
        "final/",
        "spec.json",
        "launch.sh",
        "exit_status",
        ".launch.lock",
        "checkpoints/tmp-checkpoint-40/optimizer.pt",
        "checkpoints/../final",
        "final\x00",
        "final\\x",
        "runs",
    ],
)
def test_paths_that_are_no_artifact(run: Path, path: str) -> None:
    assert runs.artifact_parts(path) is None
    with pytest.raises(OSError):
        runs.open_artifact(run, path)
    assert not runs.is_artifact_folder(run, path)


def test_open_artifact_opens_files_only(run: Path) -> None:
    fd, info = runs.open_artifact(run, "final/adapter_model.safetensors")
    try:
        assert os.read(fd, 100) == b"w" * 10 and info.st_size == 10
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        runs.open_artifact(run, "final")
    with pytest.raises(OSError):
        runs.open_artifact(run, "checkpoints/checkpoint-20/pytorch_model_fsdp_0")
    assert runs.is_artifact_folder(run, "final")
    assert runs.is_artifact_folder(run, "checkpoints/checkpoint-20/pytorch_model_fsdp_0")
    assert not runs.is_artifact_folder(run, "final/adapter_config.json")


def test_symlinks_are_never_followed(run: Path, tmp_path: Path) -> None:
    secret = write(tmp_path / "outside" / "secret.txt", b"secret")
    (run / "final" / "link.txt").symlink_to(secret)
    (run / "final" / "linked-dir").symlink_to(secret.parent)
    (run / "checkpoints" / "checkpoint-30").symlink_to(secret.parent)
    (run / "exports" / "exp_2").symlink_to(run / "final")
    (run / "samples.jsonl").symlink_to(run / "spec.json")
    os.mkfifo(run / "final" / "fifo")
    listed = {a.path for a in runs.list_artifacts(run)}
    assert not any(("link" in p or "fifo" in p or "checkpoint-30" in p or "exp_2" in p) for p in listed)
    assert "samples.jsonl" not in listed
    for path in (
        "final/link.txt",
        "final/linked-dir/secret.txt",
        "checkpoints/checkpoint-30/secret.txt",
        "exports/exp_2/adapter_config.json",
        "samples.jsonl",
        "final/fifo",
    ):
        with pytest.raises(OSError):
            runs.open_artifact(run, path)
    for folder in ("final/linked-dir", "checkpoints/checkpoint-30", "exports/exp_2"):
        assert not runs.is_artifact_folder(run, folder)
        assert runs.list_artifacts(run, under=folder) == []
    # A whole artifact folder swapped for a link is refused too.
    (run / "final").rename(run / "final-real")
    (run / "final").symlink_to(run / "final-real")
    assert not any(a.path.startswith("final/") for a in runs.list_artifacts(run))
    with pytest.raises(OSError):
        runs.open_artifact(run, "final/adapter_config.json")


def test_the_walk_is_bounded(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "MAX_ARTIFACTS", 3)
    assert len(runs.list_artifacts(run, under="final")) == 3
    deep = run / "final"
    for i in range(runs.MAX_ARTIFACT_DEPTH + 2):
        deep = deep / f"d{i}"
    write(deep / "x")
    monkeypatch.setattr(runs, "MAX_ARTIFACTS", 1000)
    assert not any(a.path.endswith("/x") for a in runs.list_artifacts(run))


def test_an_exports_launch_records_are_not_artifacts(run: Path) -> None:
    folder = run / "exports" / "exp_9"
    made = ["model.safetensors", "config.json", "README.md", "train.log"]
    records = ["export.json", "launch.sh", "job.sbatch", "launch.json", "cancel.json", "exit_status"]
    for name in [*made, *records, ".launch.lock", ".exit_status.tmp", "launches.log"]:
        write(folder / name)
    listed = {a.path for a in runs.list_artifacts(run, "exports/exp_9")}
    assert listed == {f"exports/exp_9/{n}" for n in made}
    for name in records:
        with pytest.raises(FileNotFoundError):
            runs.open_artifact(run, f"exports/exp_9/{name}")
