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

# What a format sniff reads from the start of a dataset file.
HEAD_BYTES = 4096


class NotReadable(ValueError):
    """Why a named file is not one preflight reads; the message completes "<path> ..."."""


class Missing(NotReadable):
    pass


def _open_regular(path: Path, *, follow_symlinks: bool) -> tuple[int, int]:
    """(fd, size) of a regular file, opened read-only without blocking."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        # A link inside an allowed folder could name any file the service can read.
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Missing("does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotReadable("is a symbolic link; put the file itself there") from None
        raise NotReadable(f"cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable(f"is not a regular file (it is {kind_of(st.st_mode)})")
        return fd, st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: Path, cap: int, *, follow_symlinks: bool = False) -> bytes:
    """The whole file when it is a regular file of at most `cap` bytes; NotReadable otherwise."""
    fd, size = _open_regular(path, follow_symlinks=follow_symlinks)
    try:
        if size > cap:
            raise NotReadable(f"is {_size(size)}, more than the {_size(cap)} allowed")
        # One byte past the cap: a file that grew since fstat is refused too, not read on.
        data = os.read(fd, cap + 1)
        if len(data) > cap:
            raise NotReadable(f"is more than the {_size(cap)} allowed")
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


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
