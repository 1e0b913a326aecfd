"""ftq.runtime.userfiles on the files a hostile spec names: a FIFO, a device, a 1 GiB sparse file, a symlink.
Each
is answered at once (a plain open() of the FIFO would block forever) without reading the file whole."""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import pytest

from ftq.runtime import userfiles
from ftq.runtime.userfiles import Missing, NotReadable, read_capped, read_ends

GiB = 1024**3


def _answers_at_once(fn: object, *args: object, **kwargs: object) -> BaseException | object:
    """fn's result or exception, from a thread that must end within 5 s (a blocking open would not)."""
    out: list[BaseException | object] = []

    def run() -> None:
        try:
            out.append(fn(*args, **kwargs))  # type: ignore[operator]
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), f"{fn} blocked"
    return out[0]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for fn in (read_capped, read_ends):
        args = (fifo, 1024) if fn is read_capped else (fifo,)
        got = _answers_at_once(fn, *args)
        assert isinstance(got, NotReadable) and "FIFO" in str(got), got


def test_a_device_and_a_folder_are_not_regular_files(tmp_path: Path) -> None:
    with pytest.raises(NotReadable, match="device"):
        read_capped(Path("/dev/zero"), 1024, follow_symlinks=True)
    with pytest.raises(NotReadable, match="folder"):
        read_ends(tmp_path)


def test_a_sparse_gigabyte_is_refused_by_its_size_and_sniffed_by_its_ends(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(GiB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(NotReadable, match=r"1\.0 GiB, more than the 1\.0 MiB"):
        read_capped(big, 1024**2)
    head, tail, size = read_ends(big)
    assert (size, len(head), len(tail)) == (GiB, userfiles.HEAD_BYTES, userfiles.HEAD_BYTES)
    assert head == tail == bytes(userfiles.HEAD_BYTES)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024, f"peak RSS grew {grown_kib} KiB: the file was read"


def test_within_the_cap_the_whole_file_and_one_byte_over_refused(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_bytes(b"x" * 1024)
    assert read_capped(f, 1024) == b"x" * 1024
    with pytest.raises(NotReadable, match="more than"):
        read_capped(f, 1023)


def test_symlinks_are_refused_unless_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    link = tmp_path / "config.json"
    link.symlink_to(target)
    with pytest.raises(NotReadable, match="symbolic link"):
        read_capped(link, 1024)
    assert read_capped(link, 1024, follow_symlinks=True) == b"{}"
    with pytest.raises(Missing):
        read_capped(tmp_path / "missing.json", 1024)
