"""Uploaded files on the worker's side: validating one after its upload, and turning the file ids a
job's spec names into the paths its trainer reads."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.status import FileStatus
from ftq.runtime import files
from ftq.runtime.settings import get_settings
from ftq.store import files_repository, uploads_repository
from ftq.store.db import session_scope

log = logging.getLogger(__name__)

# The folder in a run directory that holds a job's uploaded train and eval files (as symlinks) when it
# names both: the trainer reads a folder's `<split>.jsonl` files as its splits.
DATASET_DIR = runs.DATASET_DIR


def validate(file_id: str) -> None:
    """The `ftq.validate_file` task: read the file line by line and record what it holds. A file that is
    no longer `validating` (validated already, or deleted) is left alone."""
    settings = get_settings()
    with session_scope() as session:
        row = files_repository.get_file(session, file_id)
        if row is None or row.status != FileStatus.validating:
            return
        path = files.file_path(settings.data_path, row.owner, row.id)
    try:
        result = files.validate_jsonl(path)
    except FileNotFoundError:
        log.info("file %s was deleted before its validation", file_id)
        return
    except OSError as exc:
        result = files.Validation()
        result.add_error(0, f"the file could not be read: {exc.strerror}")
    with session_scope() as session:
        files_repository.finish_validation(session, file_id, result)
    log.info(
        "file %s validated: %d rows, formats %s, %d error(s)",
        file_id,
        result.rows,
        ",".join(result.formats) or "none",
        result.error_count,
    )


_last_sweep = 0.0
SWEEP_EVERY_SECONDS = 3600.0


def sweep_partials() -> int:
    """Now and then (at most hourly per worker), the partial uploads a killed API process left, and the
    parts of every owner's `/v1` uploads that expired (or were left by one that ended)."""
    global _last_sweep
    now = time.monotonic()
    if _last_sweep and now - _last_sweep < SWEEP_EVERY_SECONDS:
        return 0
    _last_sweep = now
    data_dir = get_settings().data_path
    removed = files.remove_stale_parts(data_dir)
    if removed:
        log.info("removed %d partial upload(s) left by an API process that stopped mid-upload", removed)
    with session_scope() as session:
        ended = uploads_repository.sweep(session, data_dir)
    if ended:
        log.info("removed the parts of %d /v1 upload(s) that expired or ended", ended)
    return removed + ended


class FileUnavailable(Exception):
    """A file a job names is gone or not ready: the job fails with dataset_error, saying which."""


class PathChanged(Exception):
    """A local model or dataset path is no longer what was checked at submit: the job fails with
    model_error or dataset_error (`code`), saying which."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def check_local_paths(spec: dict[str, Any]) -> None:
    """The local paths a spec names are stored resolved at submit, after service/paths.py allowed them
    (a rule of the resolved path alone). At launch each must still resolve to itself: a symbolic link
    planted meanwhile (in a run directory of the owner's, say) would lead the trainer elsewhere, into
    what the rule refuses."""
    for section, key, code in (
        ("model", "name_or_path", "model_error"),
        ("model", "adapter", "model_error"),
        ("dataset", "name_or_path", "dataset_error"),
    ):
        path = (spec.get(section) or {}).get(key)
        if not isinstance(path, str) or not path.startswith("/"):
            continue
        if str(Path(path).resolve()) != path:
            raise PathChanged(
                code,
                f"{section}.{key}: {path} now leads elsewhere (a symbolic link was made since the "
                "job was submitted); submit the job again",
            )


def _ready_path(owner: str, file_id: str, field: str, prefix: str = "dataset.") -> Path:
    field = prefix + field
    settings = get_settings()
    with session_scope() as session:
        row = files_repository.get_owned_file(session, owner, file_id)
        status = None if row is None else row.status
    if status is None:
        raise FileUnavailable(f"{field}: file {file_id} was deleted after the job was submitted")
    if status != FileStatus.ready:
        raise FileUnavailable(f"{field}: file {file_id} is {status}, not ready")
    path = files.file_path(settings.data_path, owner, file_id)
    if not path.is_file():
        raise FileUnavailable(f"{field}: the bytes of file {file_id} are missing")
    return path


def _copy_in(target: Path, link: Path) -> None:
    """`target` at `link` in the run directory: a hard link where it can be, else a copy."""
    tmp = link.parent / f".{link.name}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(target, tmp)
    except OSError:  # another file system (FTQ_RUNS_DIR on shared storage): a real copy
        shutil.copyfile(target, tmp)
    tmp.replace(link)


def _suites_for_run(spec: dict[str, Any], owner: str, run_dir: Path) -> dict[str, Any]:
    """Evaluation suites' uploads (`eval.suites[i].file_id`) as the run's own copies,
    `dataset/suite-<name>.jsonl`, named by the suite's `dataset`."""
    suites = (spec.get("eval") or {}).get("suites") or []
    if not any(s.get("file_id") for s in suites):
        return spec
    out = copy.deepcopy(spec)
    folder = run_dir / DATASET_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for i, suite in enumerate(out["eval"]["suites"]):
        file_id = suite.pop("file_id", None)
        if not file_id:
            continue
        link = folder / f"suite-{suite['name']}{files.SUFFIX}"
        _copy_in(_ready_path(owner, file_id, f"eval.suites.{i}.file_id", prefix=""), link)
        suite["dataset"] = str(link)
    return out


def spec_for_run(spec: dict[str, Any], owner: str, run_dir: Path) -> dict[str, Any]:
    """The spec the trainer reads: `dataset.file_id` (and `eval_file_id`) replaced by the run's own copy
    of the owner's file, `dataset/train.jsonl` in the run directory, or by that folder (with
    `eval.jsonl` beside it and `eval_split: eval`). A spec without file ids comes back as it is.

    A copy in the run directory, not the path of the upload: a run as a run user (FTQ_RUN_AS_USER) may
    read its run directory and nothing else of the data dir, where the owner's uploads are. The copy is
    a hard link where the run directory is on the same file system (no bytes copied)."""
    spec = _suites_for_run(spec, owner, run_dir)
    dataset = spec.get("dataset") or {}
    file_id, eval_id = dataset.get("file_id"), dataset.get("eval_file_id")
    if not file_id:
        return spec
    out = copy.deepcopy(spec)
    ds = out["dataset"]
    sources = {"train": _ready_path(owner, file_id, "file_id")}
    if eval_id:
        sources["eval"] = _ready_path(owner, eval_id, "eval_file_id")
    ds.pop("file_id", None)
    ds.pop("eval_file_id", None)
    folder = run_dir / DATASET_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for name, target in sources.items():
        _copy_in(target, folder / f"{name}{files.SUFFIX}")
    if not eval_id:
        ds["name_or_path"] = str(folder / f"train{files.SUFFIX}")
        return out
    ds["name_or_path"] = str(folder)
    ds["train_split"] = "train"
    ds["eval_split"] = "eval"
    return out
