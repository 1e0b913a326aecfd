"""Reading files a job spec names, before the job is accepted: regular files only, opened without
blocking, and never read whole.

The paths are the user's choice. A FIFO blocks a plain `open()` until someone writes to it (forever, and
a thread of the API with it); a device never ends; a 1 GiB file read whole costs the API a second and
its size in memory. So a file is opened with O_NONBLOCK (a FIFO then opens at once), checked with
fstat on the descriptor (what is read is what was checked), and read only up to a cap.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ftq.contract import runs

# What a format sniff reads from the start of a dataset file.
HEAD_BYTES = 4096


class NotReadable(ValueError):
    """Why a named file is not one preflight reads; the message completes "<path> ..."."""


class Missing(NotReadable):
    pass


def _open_regular(path: Path, *, follow_symlinks: bool) -> tuple[int, int]:
    """(fd, size) of a regular file (runs.open_regular), its failures said for a user."""
    try:
        return runs.open_regular(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise Missing("does not exist") from None
    except runs.NotRegularFile as exc:
        raise NotReadable(f"is not a regular file (it is {kind_of(exc.mode)})") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotReadable("is a symbolic link; put the file itself there") from None
        raise NotReadable(f"cannot be opened ({exc.strerror})") from None


def read_capped(path: Path, cap: int, *, follow_symlinks: bool = False) -> bytes:
    """The whole file when it is a regular file of at most `cap` bytes; NotReadable otherwise."""
    fd, size = _open_regular(path, follow_symlinks=follow_symlinks)
    try:
        if size > cap:
            raise NotReadable(f"is {human_size(size)}, more than the {human_size(cap)} allowed")
        # One byte past the cap: a file that grew since fstat is refused too, not read on.
        data = os.read(fd, cap + 1)
        if len(data) > cap:
            raise NotReadable(f"is more than the {human_size(cap)} allowed")
        return data
    finally:
        os.close(fd)


def read_ends(path: Path, n: int = HEAD_BYTES, *, follow_symlinks: bool = False) -> tuple[bytes, bytes, int]:
    """(first n bytes, last n bytes, size) of a regular file; NotReadable otherwise."""
    fd, size = _open_regular(path, follow_symlinks=follow_symlinks)
    try:
        head = os.pread(fd, n, 0)
        tail = os.pread(fd, n, max(0, size - n)) if size > n else head
        return head, tail, size
    finally:
        os.close(fd)


def kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def human_size(n: int) -> str:
    """n bytes in the largest unit it fills at least once: 1.5 GiB, 12.0 MiB, 3.0 KiB, 12 bytes."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
