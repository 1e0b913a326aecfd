"""sha256 of artifacts, computed once per version of a file and cached, never on the event loop.

The cache is one JSON file per job under `<FTQ_DATA_DIR>/artifact-hashes/` (outside the run directory:
the run cannot write it), mapping each path to the size, mtime and inode it was hashed at. A listing
hashes small files on its thread (up to INLINE_BUDGET bytes a request) and hands the rest to one
background thread per API process; until that is done the file's sha256 is listed as null.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from ftq.contract import runs
from ftq.runtime.redact import Reader

log = logging.getLogger(__name__)

# Bytes one listing may hash on its own thread (the tiny job's whole run; a 7B adapter's config files).
INLINE_BUDGET = 32 * 1024**2
CHUNK = 1024**2


def _key(f: runs.ArtifactFile) -> list[int]:
    return [f.size, f.mtime_ns, f.inode]


def _pending_key(job_id: str, f: runs.ArtifactFile) -> tuple[str, str, int, int, int]:
    return (job_id, f.path, f.size, f.mtime_ns, f.inode)


class HashCache:
    def __init__(self, root: Path, reader_for: Callable[[str], Reader]):
        self.root = root
        self._reader_for = reader_for  # how a path is read for a download (masked for logs)
        self._lock = threading.Lock()
        self._pending: set[tuple[str, str, int, int, int]] = set()
        self._queue: queue.Queue[tuple[str, Path, runs.ArtifactFile]] = queue.Queue()
        self._thread: threading.Thread | None = None

    # The cache file -----------------------------------------------------------------------------------

    def _file(self, job_id: str) -> Path:
        return self.root / f"{job_id}.json"

    def _load(self, job_id: str) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self._file(job_id).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _store(self, job_id: str, updates: dict[str, dict[str, object]], keep: Iterable[str] | None) -> None:
        """Merge `updates` into the job's cache file (atomically replaced); `keep`: the paths still there."""
        with self._lock:
            data = self._load(job_id)
            data.update(updates)
            if keep is not None:
                wanted = set(keep)
                data = {k: v for k, v in data.items() if k in wanted}
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self._file(job_id).with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, sort_keys=True))
            tmp.replace(self._file(job_id))

    # Lookups ------------------------------------------------------------------------------------------

    def lookup(self, job_id: str, run_dir: Path, files: list[runs.ArtifactFile]) -> dict[str, str | None]:
        """path -> sha256 (None while it is hashed in the background). Blocking: call it off the loop."""
        cached = self._load(job_id)
        out: dict[str, str | None] = {}
        updates: dict[str, dict[str, object]] = {}
        budget = INLINE_BUDGET
        for f in files:
            entry = cached.get(f.path)
            if (
                isinstance(entry, dict)
                and entry.get("key") == _key(f)
                and isinstance(entry.get("sha256"), str)
            ):
                out[f.path] = str(entry["sha256"])
                continue
            if f.size <= budget:
                budget -= f.size
                digest = self.hash_file(run_dir, f)
                out[f.path] = digest
                if digest is not None:
                    updates[f.path] = {"key": _key(f), "sha256": digest}
                continue
            out[f.path] = None
            self._schedule(job_id, run_dir, f)
        stale = any(p not in out for p in cached)
        if updates or stale:
            self._store(job_id, updates, keep=out.keys())
        return out

    def hash_file(self, run_dir: Path, f: runs.ArtifactFile) -> str | None:
        """The sha256 of the bytes a download of `f` returns; None when the file is not that version
        any more (changed or gone while it was read)."""
        try:
            fd, info = runs.open_artifact(run_dir, f.path)
        except OSError:
            return None
        try:
            if [info.st_size, info.st_mtime_ns, info.st_ino] != _key(f):
                return None
            read = self._reader_for(f.path)
            digest = hashlib.sha256()
            offset = 0
            while offset < f.size:
                chunk = read(fd, offset, min(CHUNK, f.size - offset))
                if not chunk:
                    return None
                digest.update(chunk)
                offset += len(chunk)
            after = os.fstat(fd)
            if [after.st_size, after.st_mtime_ns, after.st_ino] != _key(f):
                return None
            return digest.hexdigest()
        finally:
            os.close(fd)

    # Background ---------------------------------------------------------------------------------------

    def _schedule(self, job_id: str, run_dir: Path, f: runs.ArtifactFile) -> None:
        pending = _pending_key(job_id, f)
        with self._lock:
            if pending in self._pending:
                return
            self._pending.add(pending)
            if self._thread is None or not self._thread.is_alive():
                # A daemon thread: a shutdown does not wait for a multi-GB hash to finish.
                self._thread = threading.Thread(target=self._run, name="artifact-hasher", daemon=True)
                self._thread.start()
        self._queue.put((job_id, run_dir, f))

    def _run(self) -> None:
        while True:
            job_id, run_dir, f = self._queue.get()
            try:
                digest = self.hash_file(run_dir, f)
                if digest is not None:
                    self._store(job_id, {f.path: {"key": _key(f), "sha256": digest}}, keep=None)
            except Exception:
                log.exception("hashing %s of %s failed", f.path, job_id)
            finally:
                with self._lock:
                    self._pending.discard(_pending_key(job_id, f))

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)
