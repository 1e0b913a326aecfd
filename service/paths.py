"""Local paths in specs: resolved (symlinks included) and confined to FTQ_LOCAL_ROOTS."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ftq.contract.spec import looks_local

# ftq's own files at the top of the data dir (besides runs/): the SQLite store, the embedded broker,
# the beat schedule. A spec never reads them, even when the data dir is one of the allowed roots.
INTERNAL_NAMES = ("ftq.db", "broker", "celerybeat-schedule")


class PathRefused(ValueError):
    pass


def resolve_local(name_or_path: str, roots: list[Path]) -> str:
    """Return the absolute, symlink-free path of a local name, or the hub id unchanged.

    Absolute paths must resolve inside a root. Relative ones (`./x`, `../x`, `data.jsonl`) are looked
    up under each root in order; the first that exists wins. `..` cannot climb out of a root because
    the check is made on the fully resolved path.
    """
    if not looks_local(name_or_path):
        return name_or_path
    raw = Path(name_or_path)
    candidates = [raw] if raw.is_absolute() else [root / raw for root in roots]
    for candidate in candidates:
        resolved = candidate.resolve()
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            continue
        if resolved.exists():
            return str(resolved)
    allowed = ", ".join(str(r) for r in roots)
    if raw.is_absolute():
        resolved = raw.resolve()
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            raise PathRefused(f"{name_or_path} is outside the allowed local roots ({allowed})")
        raise PathRefused(f"{name_or_path} does not exist")
    raise PathRefused(f"{name_or_path} was not found under the allowed local roots ({allowed})")


def refuse_ftq_state(path: str, *, data_dir: Path, runs_dir: Path, own_run: Callable[[str], bool]) -> None:
    """Refuse a resolved local path inside ftq's own state: another owner's run directory, the store.

    The data dir is a default root, and it holds every owner's runs (final models, checkpoints, logs).
    A path inside a run directory is allowed only when `own_run(job_id)` says the caller owns it; a
    folder holding run directories (the data dir itself, `runs/`) is refused, as its files would be
    read as a dataset.
    """
    resolved = Path(path)
    data_dir, runs_dir = data_dir.resolve(), runs_dir.resolve()
    for state in (runs_dir, data_dir):
        if state == resolved or state.is_relative_to(resolved):
            raise PathRefused(f"{path} holds ftq's run directories; name a model or dataset inside it")
    if resolved.is_relative_to(runs_dir):
        job_id = resolved.relative_to(runs_dir).parts[0]
        if not own_run(job_id):
            # Say nothing about whether that job exists: it may be another owner's.
            raise PathRefused(f"{path} is inside a run directory that is not one of your jobs")
        return
    if resolved.is_relative_to(data_dir):
        top = resolved.relative_to(data_dir).parts[0]
        if any(top == n or top.startswith(n + "-") for n in INTERNAL_NAMES):
            raise PathRefused(f"{path} is one of ftq's own files")
