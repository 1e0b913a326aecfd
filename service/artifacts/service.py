"""The rules of serving a run's artifacts: what is listed, how one file is read (Range, ETag, the
secrets of every log masked), how a folder becomes a tar stream in bounded memory.

Which paths are artifacts and how they are opened (component by component, never through a symlink) is
the run layout's rule (`ftq.contract.runs`); this module only serves what that lets through.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

import anyio

from ftq.contract import runs
from ftq.contract.schemas import Artifact, ArtifactList
from ftq.runtime import redact
from ftq.runtime.redact import Reader
from ftq.runtime.settings import Settings, get_settings
from ftq.store.models import Job
from service.artifacts.hashes import HashCache
from service.errors import NotFound

CHUNK = 1024**2
# File reads of downloads at once (each a thread hop per chunk); apart from the API's read slots, so
# downloads never hold up the polls.
_FILE_READS = anyio.CapacityLimiter(8)
_TAR_BLOCK = tarfile.BLOCKSIZE


def not_found(job_id: str, path: str) -> NotFound:
    return NotFound(f"job {job_id} has no artifact {path}")


# Reading, with the secrets of every log masked (ftq.runtime.redact: the one routine) ---------------------


def reader_for(path: str, settings: Settings | None = None) -> Reader:
    return redact.reader_for(path, (settings or get_settings()).secret_values())


_caches: dict[Path, HashCache] = {}


def hash_cache(settings: Settings) -> HashCache:
    root = settings.state_path("artifact-hashes")
    cache = _caches.get(root)
    if cache is None:
        cache = _caches[root] = HashCache(root, reader_for)
    return cache


# The list ------------------------------------------------------------------------------------------------


def list_artifacts(job: Job, settings: Settings) -> ArtifactList:
    """Blocking (a walk of the run and the cache file, hashes of small files): call it off the loop."""
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    files = runs.list_artifacts(run_dir)
    digests = hash_cache(settings).lookup(job.id, run_dir, files)
    return ArtifactList(
        data=[
            Artifact(path=f.path, size=f.size, kind=f.kind, sha256=digests.get(f.path))  # type: ignore[arg-type]
            for f in files
        ]
    )


# One file ------------------------------------------------------------------------------------------------


@dataclass
class OpenFile:
    fd: int
    size: int
    etag: str
    last_modified: str
    name: str
    read: Reader


def open_file(job: Job, path: str, settings: Settings) -> OpenFile | None:
    """The artifact file at `path`, open (the caller closes fd); None when `path` is no artifact file
    (then it may be a folder's `.tar`)."""
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    try:
        fd, info = runs.open_artifact(run_dir, path)
    except OSError:
        return None
    masked = redact.is_masked(path)
    # Strong: a new version of the file (rewritten, replaced, grown) has another inode, size or mtime.
    etag = f'"{info.st_ino:x}-{info.st_size:x}-{info.st_mtime_ns:x}{"-m" if masked else ""}"'
    return OpenFile(
        fd=fd,
        size=info.st_size,
        etag=etag,
        last_modified=formatdate(info.st_mtime, usegmt=True),
        name=path.rsplit("/", 1)[-1],
        read=reader_for(path, settings),
    )


class Unsatisfiable(Exception):
    pass


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single `bytes=` range; None to serve the whole file (no Range, a
    malformed one, or several ranges: RFC 9110 lets a server ignore those); Unsatisfiable for a range
    past the end (a 416)."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    first, last = first.strip(), last.strip()
    if not (first.isdigit() or first == "") or not (last.isdigit() or last == "") or (not first and not last):
        return None
    if not first.isascii() or not last.isascii():
        return None
    if not first:  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise Unsatisfiable()
        return max(0, size - n), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None
    if start >= size:
        raise Unsatisfiable()
    return start, min(end, size - 1)


def etag_matches(header: str | None, etag: str) -> bool:
    """If-None-Match: weak comparison against any of the listed tags, or `*`."""
    if not header:
        return False
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or any(t.removeprefix("W/") == etag for t in tags)


def if_range_holds(header: str | None, etag: str, last_modified: str) -> bool:
    """If-Range: the Range applies only while the file is the version the client has (strong match of
    the tag, or the exact Last-Modified date)."""
    if header is None:
        return True
    value = header.strip()
    if value.startswith('"'):
        return value == etag
    return value == last_modified


async def file_chunks(opened: OpenFile, start: int, end: int) -> AsyncIterator[bytes]:
    """Bytes [start, end] of an open file, CHUNK at a time, each read off the event loop."""
    pos = start
    while pos <= end:
        n = min(CHUNK, end + 1 - pos)
        data = await anyio.to_thread.run_sync(opened.read, opened.fd, pos, n, limiter=_FILE_READS)
        if not data:
            # The file shrank since it was opened: stop short; the client sees less than Content-Length.
            raise OSError(f"{opened.name} shrank while it was served")
        yield data
        pos += len(data)


def close_file(opened: OpenFile) -> None:
    """Close once: a second close could close another file that got the same number meanwhile."""
    fd, opened.fd = opened.fd, -1
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


# A folder as a tar ---------------------------------------------------------------------------------------


@dataclass
class TarPlan:
    name: str  # the tar's file name, e.g. final.tar
    members: list[tuple[runs.ArtifactFile, bytes]]  # each file with its tar header
    size: int  # the tar's length in bytes: the Content-Length


def plan_tar(job: Job, folder: str, settings: Settings) -> TarPlan | None:
    """The tar of `folder` (final, checkpoints/checkpoint-20, exports/<id>, or a folder inside them):
    each file under the folder's own name (final/adapter_model.safetensors, checkpoint-20/...); None when
    `folder` is no artifact folder. Headers are made up front (some hundred bytes a file), so the length
    is known before the first byte is sent; the files' bytes are read as they are sent."""
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    if not runs.is_artifact_folder(run_dir, folder):
        return None
    base = folder.rsplit("/", 1)[-1]
    members = []
    total = 0
    for f in runs.list_artifacts(run_dir, under=folder):
        info = tarfile.TarInfo(base + f.path[len(folder) :])
        info.size = f.size
        info.mtime = f.mtime_ns // 1_000_000_000
        info.mode = 0o644
        info.type = tarfile.REGTYPE
        header = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
        members.append((f, header))
        total += len(header) + _padded(f.size)
    return TarPlan(name=f"{base}.tar", members=members, size=total + 2 * _TAR_BLOCK)


def _padded(size: int) -> int:
    return -(-size // _TAR_BLOCK) * _TAR_BLOCK


async def tar_chunks(job_id: str, plan: TarPlan, settings: Settings) -> AsyncIterator[bytes]:
    """The tar's bytes: a header, then the file CHUNK at a time, then its padding; one file open at a
    time. A file that is gone or changed size since the plan ends the stream early (the client sees a
    short body, never a tar that silently holds something else)."""
    run_dir = runs.run_dir(settings.runs_dir, job_id)
    for f, header in plan.members:
        read = reader_for(f.path, settings)  # a log inside the folder is masked as it is alone
        yield header
        try:
            fd, info = await anyio.to_thread.run_sync(
                runs.open_artifact, run_dir, f.path, limiter=_FILE_READS
            )
        except OSError as exc:
            raise OSError(f"{f.path} is gone since the tar was planned") from exc
        try:
            if info.st_size < f.size:
                raise OSError(f"{f.path} shrank since the tar was planned")
            pos = 0
            while pos < f.size:
                n = min(CHUNK, f.size - pos)
                data = await anyio.to_thread.run_sync(read, fd, pos, n, limiter=_FILE_READS)
                if not data:
                    raise OSError(f"{f.path} shrank while it was sent")
                yield data
                pos += len(data)
        finally:
            os.close(fd)
        pad = _padded(f.size) - f.size
        if pad:
            yield b"\0" * pad
    yield b"\0" * (2 * _TAR_BLOCK)


def content_disposition(name: str) -> str:
    from urllib.parse import quote

    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


def tar_folder_of(path: str) -> str | None:
    return path[: -len(".tar")] if path.endswith(".tar") and len(path) > len(".tar") else None
