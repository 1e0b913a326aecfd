"""The run directory `<FTQ_DATA_DIR>/runs/<job id>/`: the names every process agrees on, and the rules
for reading what a run left there (its exit status, its checkpoints and whether each can be resumed).

The trainer writes this layout, the launchers and the controller read the launch records, the API
lists the checkpoints; none of them spells a name or a rule of its own.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

SPEC = "spec.json"
ACCELERATE_CONFIG = "accelerate_config.yaml"
LAUNCH_SCRIPT = "launch.sh"
SBATCH_SCRIPT = "job.sbatch"
TRAIN_LOG = "train.log"
METRICS = "metrics.jsonl"
# What the run is doing before its first step and after its last (fetching, loading, saving): one
# ftq.contract.progress.ProgressRecord per line, written by the fetch step and the trainer's rank 0; the
# service shows the newest as the job's progress.phase and progress.message. train.log is for people.
PROGRESS = "progress.jsonl"
# One JSON object per line: {step, index, prompt, completion, time}, one line per sample prompt each time
# the trainer samples (spec `eval.sample_prompts`); main process only, flushed as written.
SAMPLES = "samples.jsonl"
# What the experiment trackers (spec `integrations`) made of the run: their run names, ids and URLs.
TRACKERS = "trackers.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint-"  # checkpoints/checkpoint-<step>/, as transformers' Trainer names them
FINAL = "final"
# The model card every final/ and export holds, and the facts the trainer measured for it (beside final/,
# so an export renders its own card from them; see ftq.contract.modelcard).
MODEL_CARD = "README.md"
CARD_FACTS = "card_facts.json"
# exports/<export id>/: one export's launch (launch.sh or job.sbatch, export.json, its log and records)
# and what it wrote (safetensors shards, tokenizer, generation config, README.md).
EXPORTS = "exports"
EXPORT_REQUEST = "export.json"
# The eval-time generations (samples during training), one JSON object a line.
SAMPLES = "samples.jsonl"
# Written by launch.sh / job.sbatch when the launch ends: the exit status as text, e.g. "0" or "137".
# How the service learns the end of a run it did not start itself (a restarted worker, or SLURM
# without accounting, where finished jobs leave squeue).
EXIT_STATUS = "exit_status"
# The launcher's record of the run it started (pid and start time, or the SLURM job id), written
# atomically right after the start, and of the cancel it sent (when, to escalate later).
LAUNCH_RECORD = "launch.json"
CANCEL_RECORD = "cancel.json"
# An uploaded dataset's copy for the run (dataset.file_id): train.jsonl, and eval.jsonl with an eval file.
DATASET_DIR = "dataset"
# Held (flock) by the worker for a whole launch of this run.
RUN_LOCK = ".launch.lock"
# What the trainer noticed about its own run (trainer/watch.py): one JSON object per line, `{"kind":
# "nan_loss" | "loss_exploding" | "loss_spike" | "straggler", "step", "message", "time"}`; ingest turns
# each line into a job.warning event. The same lines go to train.log as warnings, for people.
WARNINGS = "warnings.jsonl"
# Sample completions at eval steps, `{"step", "prompt", "completion"}` per line: each is a job.sample event.
SAMPLES = "samples.jsonl"
# The step of the checkpoint a time-limit requeue resumed from: the next one must get further.
REQUEUE_RECORD = "requeue.json"
# How many of the job's attempts a pause ended (`{"count": N}`): those are no retries.
PAUSE_RECORD = "pauses.json"
# What the worker and the launcher keep in exports/<export id>/ beside what the export wrote: not artifacts
# (`launches.log` is worker.launchers.local's audit of starts).
EXPORT_RECORDS = frozenset(
    {
        EXPORT_REQUEST,
        LAUNCH_SCRIPT,
        SBATCH_SCRIPT,
        LAUNCH_RECORD,
        CANCEL_RECORD,
        EXIT_STATUS,
        RUN_LOCK,
        "launches.log",
    }
)
# What one attempt's launch leaves that the next attempt must not read as its own.
ATTEMPT_RECORDS = (EXIT_STATUS, LAUNCH_RECORD, CANCEL_RECORD)

# The files `from_pretrained` loads weights from: what a model folder must hold.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# trainer_state.json carries the whole log history: tens of MB for a long run, never this much.
TRAINER_STATE_LIMIT = 256 * 1024**2


def run_dir(runs_root: Path, job_id: str) -> Path:
    return runs_root / job_id


def export_dir(run_dir: Path, export_id: str) -> Path:
    return run_dir / EXPORTS / export_id


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES) or any(folder.glob("*.safetensors"))


class NotRegularFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a folder...); `mode` says what it is."""

    def __init__(self, path: Path | str, mode: int):
        super().__init__(f"{path} is not a regular file")
        self.mode = mode


def open_regular(
    path: Path | str, *, follow_symlinks: bool = False, dir_fd: int | None = None
) -> tuple[int, int]:
    """(fd, size) of a regular file, opened read-only without blocking; the caller closes fd.

    How ftq opens a file someone else chose (a run's output, a spec's path): a FIFO opens at once and is
    refused instead of blocking forever, and unless `follow_symlinks` a symlink (to a file only the
    service may read) fails with ELOOP. What is read is what fstat checked. OSError otherwise.
    With `dir_fd`, `path` is a name inside that open folder (openat).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(path, info.st_mode)
        return fd, info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_run_file(path: Path, limit: int) -> bytes:
    """A file the run wrote, as the service reads it: the run chose what is there, so anything but a
    regular file is an OSError (open_regular), and more than `limit` bytes a ValueError."""
    fd, size = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        if size > limit:
            raise ValueError(f"{path} is larger than {limit} bytes")
        return f.read(limit)


def read_exit_status(run_dir: Path) -> int | None:
    """The launch's exit status, or None while it runs (or when the file is unreadable)."""
    try:
        return int(read_run_file(run_dir / EXIT_STATUS, 64).strip())
    except (OSError, ValueError):
        return None


def set_attempt_aside(run_dir: Path, attempt: int) -> None:
    """Keep an ended attempt's launch records as `<name>.attempt<N>`, so the next launch starts anew
    instead of adopting them."""
    for name in (LAUNCH_RECORD, EXIT_STATUS):
        path = run_dir / name
        if path.exists():
            path.replace(run_dir / f"{name}.attempt{attempt}")


# Checkpoints ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointDir:
    step: int
    path: Path
    resumable: bool


def checkpoint_step(folder: Path) -> int | None:
    """The step of `checkpoints/checkpoint-<step>`, or None for anything else."""
    name = folder.name
    if not name.startswith(CHECKPOINT_PREFIX):
        return None
    try:
        return int(name[len(CHECKPOINT_PREFIX) :])
    except ValueError:
        return None


def list_checkpoints(run_dir: Path) -> list[CheckpointDir]:
    """The run's checkpoints, oldest first, each with whether the trainer can resume from it."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        step = checkpoint_step(child)
        if step is not None and child.is_dir():
            out.append(CheckpointDir(step=step, path=child, resumable=is_resumable(child)))
    return sorted(out, key=lambda c: c.step)


def has_checkpoint(run_dir: Path) -> bool:
    root = run_dir / CHECKPOINTS
    return root.is_dir() and any(checkpoint_step(c) is not None for c in root.iterdir())


def latest_checkpoint(run_dir: Path) -> CheckpointDir | None:
    """The newest checkpoint the trainer can resume from: what `--resume_from_checkpoint latest` means.

    A newer folder that is not resumable (a job killed while saving leaves one without
    trainer_state.json) is passed over for the complete one before it.
    """
    for ckpt in reversed(list_checkpoints(run_dir)):
        if ckpt.resumable:
            return ckpt
    return None


def is_resumable(path: Path) -> bool:
    """Whether the trainer can continue from this checkpoint: model, optimizer, scheduler, RNG and
    trainer state are all there, and each was written to the end (checked against what the trainer
    writes for one process, LoRA, FSDP2 sharded and DeepSpeed ZeRO-3)."""
    try:
        entries = {p.name: p for p in path.iterdir()}
        # Written last by the trainer; a checkpoint cut short (a full disk, a kill) has none or half of one.
        json.loads(read_run_file(path / "trainer_state.json", TRAINER_STATE_LIMIT))
    except (OSError, ValueError):
        return False

    def whole(name: str) -> bool:
        p = entries.get(name)
        if p is None:
            return False
        if p.is_dir():
            if name.startswith("global_step"):
                # DeepSpeed: every rank's model and optimizer partitions.
                files = [f.name for f in p.iterdir() if f.stat().st_size > 0]
                return any(f.endswith("model_states.pt") for f in files) and any(
                    f.endswith("optim_states.pt") for f in files
                )
            # torch.distributed.checkpoint (FSDP sharded) writes .metadata after every rank's shards.
            return (p / ".metadata").is_file()
        return p.stat().st_size > 0

    names = [n for n in entries if whole(n)]
    has_scheduler = "scheduler.pt" in names
    has_rng = any(n.startswith("rng_state") for n in names)
    # The optimizer is a file (one process, DDP, FSDP full), a folder (FSDP sharded) or ZeRO's global_stepN.
    has_optimizer = any(n.startswith(("optimizer", "global_step")) for n in names)
    has_model = any(
        n.startswith(("adapter_model", "model", "pytorch_model", "pytorch_model_fsdp", "global_step"))
        for n in names
    )
    if "latest" in entries and not any(n.startswith("global_step") for n in names):
        return False  # DeepSpeed's pointer to partitions that are missing or incomplete
    return has_scheduler and has_rng and has_optimizer and has_model


# Artifacts: what a user may take out of a run -------------------------------------------------------------
#
# The folders and files of a run a user downloads: final/, each checkpoint, each export, and the run's
# logs. Everything else in the run directory (spec.json, launch.sh, job.sbatch, launch.json, exit_status,
# locks, the accelerate config) is the service's own and is never served. Every path is walked and opened
# one component at a time with O_NOFOLLOW (openat on the folder above): a symlink anywhere, planted by the
# run or swapped in between a check and an open, is never followed, so nothing outside the run is reached.

ARTIFACT_FOLDERS = (FINAL, CHECKPOINTS, EXPORTS)
ARTIFACT_FILES = (TRAIN_LOG, METRICS, SAMPLES)
# What a listing walks at most: a run writing millions of files must not stall the API.
MAX_ARTIFACTS = 20_000
MAX_ARTIFACT_DEPTH = 16

_TOKENIZER_FILES = frozenset(
    {
        "special_tokens_map.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        "spiece.model",
        "sentencepiece.bpe.model",
    }
)
_MODEL_FILES = frozenset({"config.json", "generation_config.json", *WEIGHT_FILES})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class ArtifactFile:
    path: str  # relative to the run directory, `/`-separated
    size: int
    mtime_ns: int
    inode: int
    kind: str


def artifact_parts(path: str) -> list[str] | None:
    """The components of a user-given artifact path when it names something under an artifact folder
    (or one of the artifact files); None for anything else: absolute, `..`, `.`, empty parts, a NUL,
    a backslash, a checkpoint folder that is not `checkpoint-<step>`, the run's own files."""
    if not path or path.startswith("/") or "\x00" in path or "\\" in path or len(path) > 4096:
        return None
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    if len(parts) == 1:
        return parts if parts[0] in ARTIFACT_FILES or parts[0] in ARTIFACT_FOLDERS else None
    if parts[0] not in ARTIFACT_FOLDERS:
        return None
    if parts[0] == CHECKPOINTS and checkpoint_step(Path(parts[1])) is None:
        return None
    if parts[0] == EXPORTS and len(parts) == 3 and (parts[2] in EXPORT_RECORDS or parts[2].startswith(".")):
        return None  # the export's launch, not what it made (its train.log stays: what it said)
    return parts


def artifact_kind(path: str) -> str:
    """adapter, model, tokenizer, checkpoint, export, log, card or other, for a path artifact_parts
    accepts (relative to the run directory)."""
    parts = path.split("/")
    name = parts[-1]
    top = parts[0]
    if len(parts) == 1:
        return "log"
    if top == CHECKPOINTS:
        return "checkpoint"
    if top == EXPORTS:
        return "card" if len(parts) == 3 and name == MODEL_CARD else "export"
    if len(parts) == 2 and name == MODEL_CARD:
        return "card"
    if name.startswith("adapter_"):
        return "adapter"
    if name.startswith("tokenizer") or name in _TOKENIZER_FILES:
        return "tokenizer"
    if name in _MODEL_FILES or (name.startswith("model") and name.endswith(".safetensors")):
        return "model"
    if name.startswith("pytorch_model") or name.endswith(".safetensors"):
        return "model"
    return "other"


def open_artifact_dir(run_dir: Path, parts: list[str]) -> int:
    """An fd of the folder run_dir/parts..., each component opened with O_NOFOLLOW under the one
    before: OSError (ELOOP, ENOTDIR, ENOENT) when any of them is a symlink, not a folder, or missing."""
    fd = os.open(run_dir, _DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_artifact(run_dir: Path, path: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the artifact file at `path` (relative to run_dir), opened as open_regular does
    and through open_artifact_dir; FileNotFoundError for a path that is no artifact."""
    parts = artifact_parts(path)
    if parts is None or (len(parts) == 1 and parts[0] in ARTIFACT_FOLDERS):
        raise FileNotFoundError(path)
    dir_fd = open_artifact_dir(run_dir, parts[:-1])
    try:
        fd, _ = open_regular(parts[-1], dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return fd, os.fstat(fd)


def is_artifact_folder(run_dir: Path, path: str) -> bool:
    """Whether `path` names a folder under the artifacts (final, checkpoints/checkpoint-20, exports/<id>,
    or one inside them), reached without a symlink."""
    parts = artifact_parts(path)
    if parts is None or (len(parts) == 1 and parts[0] not in ARTIFACT_FOLDERS):
        return False
    try:
        os.close(open_artifact_dir(run_dir, parts))
    except OSError:
        return False
    return True


def list_artifacts(run_dir: Path, under: str | None = None) -> list[ArtifactFile]:
    """The regular files a user may download, sorted by path: under `under` (a folder artifact_parts
    accepts) or everywhere (final/, checkpoints/checkpoint-<step>/, exports/, the logs). Symlinks and
    anything but regular files and folders are left out; so is what lies past MAX_ARTIFACT_DEPTH or
    MAX_ARTIFACTS."""
    out: list[ArtifactFile] = []
    if under is not None:
        parts = artifact_parts(under)
        if parts is None:
            return []
        roots = [parts]
    else:
        roots = [[name] for name in (*ARTIFACT_FOLDERS, *ARTIFACT_FILES)]
    for root in roots:
        if len(root) == 1 and root[0] in ARTIFACT_FILES:
            _add_file(run_dir, root[0], out)
            continue
        try:
            fd = open_artifact_dir(run_dir, root)
        except OSError:
            continue
        try:
            _walk(fd, root, out)
        finally:
            os.close(fd)
    return sorted(out, key=lambda a: a.path)


def _add_file(run_dir: Path, name: str, out: list[ArtifactFile]) -> None:
    try:
        info = os.stat(run_dir / name, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode):
        out.append(ArtifactFile(name, info.st_size, info.st_mtime_ns, info.st_ino, "log"))


def _walk(fd: int, parts: list[str], out: list[ArtifactFile]) -> None:
    if len(parts) > MAX_ARTIFACT_DEPTH:
        return
    try:
        names = sorted(os.listdir(fd))
    except OSError:
        return
    for name in names:
        if len(out) >= MAX_ARTIFACTS:
            return
        child = [*parts, name]
        # A checkpoints/ entry that is not checkpoint-<step> (a temp folder mid-save) is not an artifact.
        if artifact_parts("/".join(child)) is None:
            continue
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            path = "/".join(child)
            out.append(ArtifactFile(path, info.st_size, info.st_mtime_ns, info.st_ino, artifact_kind(path)))
        elif stat.S_ISDIR(info.st_mode):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                _walk(sub, child, out)
            finally:
                os.close(sub)


@dataclass(frozen=True)
class CheckpointLayout:
    """What a checkpoint folder says about the run that wrote it: `deepspeed` (ZeRO's per-rank
    partitions under global_step<N>/), `fsdp` (torch.distributed.checkpoint folders, or FSDP's full
    state dict files), or `plain` (one process or DDP: whole files); the world size its per-rank files
    show (None where they do not say); and whether it holds a DeepSpeed universal checkpoint."""

    kind: str
    world_size: int | None
    universal: bool = False


_ZERO_RANK = re.compile(r"zero_pp_rank_(\d+)_")
_DCP_RANK = re.compile(r"^__(\d+)_\d+\.distcp$")


def checkpoint_layout(folder: Path) -> CheckpointLayout:
    """The layout of checkpoints/checkpoint-<step>/ from its file names alone (nothing is read)."""
    step_dirs = [p for p in folder.glob("global_step*") if p.is_dir()]
    if step_dirs:
        ranks = {int(m[1]) for d in step_dirs for p in d.iterdir() if (m := _ZERO_RANK.search(p.name))}
        universal = any("universal" in d.name for d in step_dirs) or (folder / "latest_universal").is_file()
        return CheckpointLayout("deepspeed", max(ranks) + 1 if ranks else None, universal)
    shard_dirs = [p for p in folder.glob("pytorch_model_fsdp*") if p.is_dir()]
    if shard_dirs:
        ranks = {int(m[1]) for d in shard_dirs for p in d.iterdir() if (m := _DCP_RANK.match(p.name))}
        return CheckpointLayout("fsdp", max(ranks) + 1 if ranks else None)
    if any(folder.glob("pytorch_model_fsdp*.bin")) or any(folder.glob("optimizer_*.bin")):
        return CheckpointLayout("fsdp", None)
    return CheckpointLayout("plain", None)


# A resident server's address (a serving engine's, a Tinker training client's), written by the server into
# its folder once it has its port, read by the API.
ENDPOINT = "endpoint.json"


def write_endpoint(folder: Path, url: str) -> None:
    tmp = folder / f".{ENDPOINT}.tmp"
    tmp.write_text(json.dumps({"url": url}))
    tmp.replace(folder / ENDPOINT)


def read_endpoint(folder: Path) -> str | None:
    """The URL a server wrote into its folder; None while there is none (or it is half-written)."""
    try:
        url = json.loads((folder / ENDPOINT).read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if isinstance(url, str) else None
