"""Local paths in specs: resolved (symlinks included) and confined to FTQ_LOCAL_ROOTS."""

from __future__ import annotations

from pathlib import Path

from ftq.spec import looks_local


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
