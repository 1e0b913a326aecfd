"""Local paths in specs: resolved (symlinks included), confined to FTQ_LOCAL_ROOTS, and kept out of ftq's
own state. The one rule of what a spec may name; every path a user gives goes through `resolve_local`.

The data dir is a default root (the operator may place models and datasets in it), and it holds every
owner's runs and uploads, the store, the broker, the artifact hash cache, the locks. Inside the data dir
a spec may name only:
- its own run directories (`runs/<one of your job ids>/...`: build on a final model or a checkpoint),
- the operator's files: a top-level entry that is not one of ftq's names (DATA_DIR_STATE, which is the
  only way ftq makes anything there) and is not hidden.
Everything else is refused from the name alone, before anything is looked up, so the answer says nothing
about what exists there (another owner's uploads or jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftq.contract.spec import looks_local
from ftq.runtime.settings import DATA_DIR_STATE


class PathRefused(ValueError):
    pass


@dataclass
class StateRule:
    """What a spec may name inside the data dir, judged on a resolved path alone (no store, no disk: it
    runs on the preflight's thread). A path inside a run directory is allowed here and its job id kept in
    `run_ids`, for the caller to check ownership on its own thread (`check_owners`)."""

    data_dir: Path
    runs_dir: Path
    run_ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data_dir, self.runs_dir = self.data_dir.resolve(), self.runs_dir.resolve()

    def __call__(self, resolved: Path, shown: str) -> None:
        for state in (self.runs_dir, self.data_dir):
            if state == resolved or state.is_relative_to(resolved):
                raise PathRefused(f"{shown} holds ftq's run directories; name a model or dataset inside it")
        if resolved.is_relative_to(self.runs_dir):
            self.run_ids.append(resolved.relative_to(self.runs_dir).parts[0])
            return
        if resolved.is_relative_to(self.data_dir):
            top = resolved.relative_to(self.data_dir).parts[0]
            internal = any(top == n or top.startswith((n + "-", n + ".")) for n in DATA_DIR_STATE)
            if internal or top.startswith("."):
                raise PathRefused(
                    f"{shown} is inside ftq's own state in the data dir; name your own run's files "
                    "(./runs/<job id>/...), an uploaded dataset by dataset.file_id, or the operator's files"
                )

    def run_of(self, path: str) -> str | None:
        """The job id of the run directory `path` (resolved) lies in, if any."""
        resolved = Path(path)
        return (
            resolved.relative_to(self.runs_dir).parts[0] if resolved.is_relative_to(self.runs_dir) else None
        )

    def check_owners(self, shown: str, own_run: Callable[[str], bool], resolved: str | None = None) -> None:
        """Refuse when the run directory of `resolved` (or, when nothing was found, any run directory
        tried) is not one of the caller's jobs; whether that job exists, or the path in it, is not said."""
        tried = self.run_ids if resolved is None else [r for r in [self.run_of(resolved)] if r]
        for job_id in tried:
            if not own_run(job_id):
                raise PathRefused(f"{shown} is inside a run directory that is not one of your jobs")


def resolve_local(
    name_or_path: str, roots: list[Path], rule: Callable[[Path, str], None] | None = None
) -> str:
    """Return the absolute, symlink-free path of a local name, or the hub id unchanged.

    Absolute paths must resolve inside a root. Relative ones (`./x`, `../x`, `data.jsonl`) are looked
    up under each root in order; the first that exists wins. `..` cannot climb out of a root because
    the check is made on the fully resolved path. `rule` (a StateRule) is asked before existence, and
    its refusal ends the search, so a refusal never tells whether the path exists.
    """
    if not looks_local(name_or_path):
        return name_or_path
    raw = Path(name_or_path)
    candidates = [raw] if raw.is_absolute() else [root / raw for root in roots]
    for candidate in candidates:
        resolved = candidate.resolve()
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            continue
        if rule is not None:
            rule(resolved, name_or_path)
        if resolved.exists():
            return str(resolved)
    allowed = ", ".join(str(r) for r in roots)
    if raw.is_absolute():
        resolved = raw.resolve()
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            raise PathRefused(f"{name_or_path} is outside the allowed local roots ({allowed})")
        raise PathRefused(f"{name_or_path} does not exist")
    raise PathRefused(f"{name_or_path} was not found under the allowed local roots ({allowed})")
