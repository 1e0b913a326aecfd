"""Uploaded dataset files: their ids, where their bytes live, their statuses, and the validation the
worker runs after an upload.

The server chooses every path: `<FTQ_DATA_DIR>/files/<owner hash>/<file id>.jsonl`. The owner's part
is a hash, so an owner name never becomes a path; the suffix is what the trainer's loader reads the
format from. The user's filename is only ever shown, never used.

Validation reads the file line by line with a cap on the line length, so a file of any size (or one
line of a gigabyte) is checked in bounded memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ftq.contract.datasets import FORMATS, detect_formats, methods_for, openai_problem
from ftq.runtime.settings import DATA_DIR_STATE

FILES_DIR = "files"  # uploads, one folder per owner: one of ftq's data dir names
assert FILES_DIR in DATA_DIR_STATE

FILE_ID_RE = r"^file_[0-9a-f]{24}$"
_FILE_ID = re.compile(FILE_ID_RE)
SUFFIX = ".jsonl"

# Errors a validation keeps (with their line numbers); the count of all of them is kept too.
MAX_ERRORS = 20
# Columns a File lists (a row may hold any number of keys; the listing is for people).
MAX_COLUMNS = 100
# A line longer than this is an error of its own (and is skipped, not read into memory).
MAX_LINE_BYTES = 64 * 1024 * 1024


def new_file_id() -> str:
    return f"file_{secrets.token_hex(12)}"


def is_file_id(value: str) -> bool:
    return bool(_FILE_ID.match(value))


def files_dir(data_dir: Path) -> Path:
    return data_dir / FILES_DIR


def owner_dir(data_dir: Path, owner: str) -> Path:
    return files_dir(data_dir) / hashlib.sha256(owner.encode()).hexdigest()[:32]


def file_path(data_dir: Path, owner: str, file_id: str) -> Path:
    """Where an uploaded file's bytes are. The id is checked, so no value makes a path elsewhere."""
    if not is_file_id(file_id):
        raise ValueError(f"{file_id!r} is not a file id")
    return owner_dir(data_dir, owner) / f"{file_id}{SUFFIX}"


# The parts of an unfinished `/v1` upload (ftq.store.uploads_repository holds its state):
# `<owner folder>/uploads/<upload id>/<part id>`, the folder removed when the upload ends.
UPLOADS_DIR = "uploads"
_UPLOAD_ID = re.compile(r"^upload_[0-9a-f]{24}$")


def is_upload_id(value: str) -> bool:
    return bool(_UPLOAD_ID.match(value))


def upload_dir(data_dir: Path, owner: str, upload_id: str) -> Path:
    """Where an upload's parts are. The id is checked, so no value makes a path elsewhere."""
    if not is_upload_id(upload_id):
        raise ValueError(f"{upload_id!r} is not an upload id")
    return owner_dir(data_dir, owner) / UPLOADS_DIR / upload_id


def upload_dirs(data_dir: Path, owner: str | None = None) -> dict[str, Path]:
    """The upload folders on disk, by upload id: the owner's, or every owner's."""
    owners = [owner_dir(data_dir, owner)] if owner is not None else _subdirs(files_dir(data_dir))
    found: dict[str, Path] = {}
    for folder in owners:
        for sub in _subdirs(folder / UPLOADS_DIR):
            if is_upload_id(sub.name):
                found[sub.name] = sub
    return found


def _subdirs(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def display_name(name: str | None) -> str:
    """The user's filename as shown: its last path part, printable characters only, at most 255."""
    base = re.split(r"[\\/]", name or "")[-1]
    base = "".join(ch for ch in base if ch.isprintable()).strip()
    return base[:255] or "upload.jsonl"


@dataclass
class Validation:
    """What validating a file found; `ok` when it holds rows and no errors."""

    rows: int = 0
    columns: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.rows > 0 and self.error_count == 0

    def add_error(self, line: int, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"line": line, "message": message})


def _read_line(f: BinaryIO, cap: int) -> tuple[bytes, bool]:
    """(line, too_long): one line of at most `cap` bytes; a longer one is read past, not kept."""
    line = f.readline(cap + 1)
    if len(line) <= cap or line.endswith(b"\n"):
        return line, False
    while line and not line.endswith(b"\n"):
        line = f.readline(1024 * 1024)
    return b"", True


_TEXT_FIELDS = ("text", "prompt", "completion", "chosen", "rejected")


def _row_problem(row: dict[str, Any]) -> str | None:
    for name in _TEXT_FIELDS:
        value = row.get(name)
        if isinstance(value, str) and not value.strip():
            return f"field {name!r} is empty"
    # Conversations (ftq's and OpenAI's chat, preference and reinforcement rows): message by message.
    return openai_problem(row)


def validate_jsonl(path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> Validation:
    """Check a JSON Lines dataset file line by line (1-based line numbers; blank lines are skipped).

    Errors: a line that is not JSON, a row that is not an object, a row with an empty text field, a row
    that holds none of the formats (`text`, `messages`, `prompt`+`completion`, `prompt`+`chosen`+
    `rejected`, `prompt`+`completion`+`label`), a row that holds none of the formats the rows before
    it hold. The file's formats are those every row holds.
    """
    out = Validation()
    columns: dict[str, None] = {}
    common: set[str] | None = None
    with open(path, "rb") as f:
        number = 0
        while True:
            raw, too_long = _read_line(f, max_line_bytes)
            if not raw and not too_long:
                break
            number += 1
            if too_long:
                out.add_error(number, f"the line is longer than {max_line_bytes} bytes")
                continue
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except UnicodeDecodeError:
                out.add_error(number, "the line is not UTF-8 text")
                continue
            except ValueError as exc:
                out.add_error(number, f"not valid JSON: {exc}")
                continue
            if not isinstance(row, dict):
                out.add_error(number, f"the row is a JSON {type(row).__name__}, not an object")
                continue
            for key in row:
                if len(columns) >= MAX_COLUMNS:
                    break
                columns.setdefault(str(key), None)
            problem = _row_problem(row)
            if problem:
                out.add_error(number, problem)
                continue
            found = detect_formats(row)
            if not found:
                keys = ", ".join(list(map(str, row))[:10]) or "none"
                out.add_error(
                    number,
                    f"missing fields: the row holds none of the dataset formats (fields found: {keys}); "
                    "a row needs `text`, `messages`, `prompt` and `completion`, `prompt`, `chosen` and "
                    "`rejected`, or OpenAI's `input`, `preferred_output` and `non_preferred_output`",
                )
                continue
            if common is not None and not (common & found):
                out.add_error(
                    number,
                    f"the row is {', '.join(sorted(found))} but the rows before it are "
                    f"{', '.join(sorted(common))}",
                )
                continue
            common = found if common is None else common & found
            out.rows += 1
    if out.rows == 0 and out.error_count == 0:
        out.add_error(1, "the file holds no rows")
    out.columns = list(columns)
    out.formats = [f for f in FORMATS if f in (common or set())]
    out.methods = methods_for(out.formats)
    return out


# An upload's bytes arrive in `.<id>.part` in its owner's folder; an API process killed mid-upload leaves
# one behind. Older than this, no upload is still writing it.
STALE_PART_SECONDS = 24 * 3600
# A `.part` file nobody holds the lock of (`lock_part`) is a dead upload's once older than this (the
# writer takes the lock right after creating it).
DEAD_PART_SECONDS = 60


def lock_part(fd: int) -> None:
    """Mark an upload's `.part` file as being written: its writer holds this lock for as long as it
    lives (the kernel drops it when the process dies, SIGKILL included)."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def part_is_live(part: Path) -> bool:
    """Whether a process is still writing this `.part` file (holds `lock_part`'s lock)."""
    import fcntl

    try:
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def bytes_in_flight(data_dir: Path, owner: str, *, younger_than: float, besides: Path | None = None) -> int:
    """What the owner's uploads in progress hold: the sizes of its `.part` files that a live process is
    writing (each upload's file is as long as the room it has reserved, written or not; a dead upload's
    file, left by a killed API process, reserves nothing), none older than `younger_than` seconds (no
    upload lasts longer: the body-read deadline), and not counting `besides`."""
    import time

    cutoff = time.time() - younger_than
    total = 0
    folder = owner_dir(data_dir, owner)
    if not folder.is_dir():
        return 0
    for part in folder.glob(".file_*.part"):
        if besides is not None and part.name == besides.name:
            continue
        try:
            st = part.lstat()
        except FileNotFoundError:
            continue
        if st.st_mtime >= cutoff and part_is_live(part):
            total += st.st_size
    return total


def remove_stale_parts(
    data_dir: Path, *, older_than: float = STALE_PART_SECONDS, dead_after: float = DEAD_PART_SECONDS
) -> int:
    """Remove partial uploads left by API processes that died while receiving them (no writer holds
    their lock, and they are older than `dead_after`), or older than `older_than` in any case; returns
    how many."""
    import time

    removed = 0
    now = time.time()
    cutoff = now - older_than
    root = files_dir(data_dir)
    if not root.is_dir():
        return 0
    for folder in root.iterdir():
        if not folder.is_dir() or folder.is_symlink():
            continue
        for part in folder.glob(".file_*.part"):
            try:
                mtime = part.lstat().st_mtime
                if mtime < cutoff or (mtime < now - dead_after and not part_is_live(part)):
                    part.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
    return removed
