"""The run layout's checkpoint rules (ftq.contract.runs): which folders are checkpoints, and which can be
resumed.

The folders are laid out as the trainer writes them for one process with LoRA, DeepSpeed ZeRO (global_step
folders of per-rank partitions) and FSDP sharded state (torch.distributed.checkpoint folders whose
.metadata is written last); real ones are checked in tests/integration/preflight/test_checkpoints.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftq.contract import runs
from tests.harness.assets import checkpoint_dir


def write(path: Path, content: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def test_a_complete_lora_checkpoint_is_resumable(tmp_path: Path) -> None:
    assert runs.is_resumable(checkpoint_dir(tmp_path, 2))


@pytest.mark.parametrize(
    "damage",
    [
        "rm:optimizer.pt",
        "rm:scheduler.pt",
        "rm:rng_state.pth",  # resuming would not reproduce the data order
        "rm:adapter_model.safetensors",
        "rm:trainer_state.json",  # written last: a checkpoint cut short has none
        "truncate:trainer_state.json",  # or half of one
        "empty:optimizer.pt",
        "empty:adapter_model.safetensors",
    ],
)
def test_a_checkpoint_cut_short_is_not_resumable(tmp_path: Path, damage: str) -> None:
    ckpt = checkpoint_dir(tmp_path, 2)
    kind, name = damage.split(":")
    if kind == "rm":
        (ckpt / name).unlink()
    elif kind == "empty":
        (ckpt / name).write_bytes(b"")
    else:
        (ckpt / name).write_text('{"global_st')
    assert not runs.is_resumable(ckpt)


def test_a_full_finetune_checkpoint_has_model_weights_instead_of_an_adapter(tmp_path: Path) -> None:
    ckpt = checkpoint_dir(tmp_path, 2)
    (ckpt / "adapter_model.safetensors").rename(ckpt / "model.safetensors")
    assert runs.is_resumable(ckpt)


def test_deepspeed_global_step_partitions(tmp_path: Path) -> None:
    ckpt = checkpoint_dir(tmp_path, 4, "deepspeed")
    assert runs.is_resumable(ckpt)
    # A rank's optimizer partition written empty (the disk filled up): not every rank's state is there.
    optim = sorted((ckpt / "global_step4").glob("*optim_states.pt"))
    for path in optim:
        path.write_bytes(b"")
    assert not runs.is_resumable(ckpt)


def test_deepspeed_latest_pointing_at_missing_partitions_is_not_resumable(tmp_path: Path) -> None:
    ckpt = checkpoint_dir(tmp_path, 4, "deepspeed")
    for path in (ckpt / "global_step4").iterdir():
        path.unlink()
    (ckpt / "global_step4").rmdir()
    # The rest (scheduler, rng, state, and an optimizer.pt left from elsewhere) cannot stand in for it.
    write(ckpt / "optimizer.pt")
    write(ckpt / "model.safetensors")
    assert not runs.is_resumable(ckpt)


def test_fsdp_sharded_state_needs_its_metadata(tmp_path: Path) -> None:
    ckpt = checkpoint_dir(tmp_path, 2, "fsdp")
    assert runs.is_resumable(ckpt)
    (ckpt / "optimizer_0" / ".metadata").unlink()
    assert not runs.is_resumable(ckpt)
    (ckpt / "optimizer_0" / ".metadata").write_bytes(b"x")
    (ckpt / "pytorch_model_fsdp_0" / ".metadata").unlink()
    assert not runs.is_resumable(ckpt)


def test_list_checkpoints_orders_by_step_and_ignores_other_folders(tmp_path: Path) -> None:
    checkpoint_dir(tmp_path, 10)
    checkpoint_dir(tmp_path, 2)
    cut = checkpoint_dir(tmp_path, 12)
    (cut / "trainer_state.json").unlink()
    root = tmp_path / runs.CHECKPOINTS
    (root / "checkpoint-final").mkdir()  # not a step
    (root / "tmp-checkpoint-14").mkdir()  # the trainer's folder before the rename
    write(root / "checkpoint-16")  # a file, not a folder
    listed = runs.list_checkpoints(tmp_path)
    assert [(c.step, c.resumable) for c in listed] == [(2, True), (10, True), (12, False)]
    assert listed[0].path == root / "checkpoint-2"
    assert runs.has_checkpoint(tmp_path)


def test_a_run_without_checkpoints(tmp_path: Path) -> None:
    assert runs.list_checkpoints(tmp_path) == []
    assert not runs.has_checkpoint(tmp_path)
    (tmp_path / runs.CHECKPOINTS).mkdir()
    assert runs.list_checkpoints(tmp_path) == [] and not runs.has_checkpoint(tmp_path)


def test_checkpoint_step() -> None:
    assert runs.checkpoint_step(Path("checkpoint-40")) == 40
    assert runs.checkpoint_step(Path("checkpoint-x")) is None
    assert runs.checkpoint_step(Path("final")) is None


def test_exit_status_and_attempt_records(tmp_path: Path) -> None:
    assert runs.read_exit_status(tmp_path) is None
    (tmp_path / runs.EXIT_STATUS).write_text("137\n")
    assert runs.read_exit_status(tmp_path) == 137
    (tmp_path / runs.EXIT_STATUS).write_text("")  # being written
    assert runs.read_exit_status(tmp_path) is None
    (tmp_path / runs.EXIT_STATUS).write_text("1\n")
    (tmp_path / runs.LAUNCH_RECORD).write_text("{}")
    runs.set_attempt_aside(tmp_path, 0)
    assert not (tmp_path / runs.EXIT_STATUS).exists() and not (tmp_path / runs.LAUNCH_RECORD).exists()
    assert (tmp_path / f"{runs.EXIT_STATUS}.attempt0").read_text() == "1\n"
    assert (tmp_path / f"{runs.LAUNCH_RECORD}.attempt0").exists()


@pytest.mark.parametrize("kind", ["lora", "deepspeed", "fsdp"])
def test_latest_passes_over_a_newer_checkpoint_cut_short(tmp_path: Path, kind: str) -> None:
    checkpoint_dir(tmp_path, 10, kind)
    newest = checkpoint_dir(tmp_path, 20, kind)
    latest = runs.latest_checkpoint(tmp_path)
    assert latest is not None and latest.path == newest
    # A job killed while saving: the folder is there, its trainer_state.json is not.
    (newest / "trainer_state.json").unlink()
    latest = runs.latest_checkpoint(tmp_path)
    assert latest is not None and (latest.step, latest.path.name) == (10, "checkpoint-10")
    (tmp_path / runs.CHECKPOINTS / "checkpoint-10" / "trainer_state.json").unlink()
    assert runs.latest_checkpoint(tmp_path) is None
