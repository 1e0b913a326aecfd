"""Secret values never leave the service: the one masking routine for text it stores or serves.

The secrets are the values of the operator's pass-through variables (FTQ_PASS_ENV) and the tracker
credentials (the password of FTQ_MLFLOW_TRACKING_URI, the W&B key): `Settings.secret_values()`. Every
byte of a run directory the API serves goes through here: train.log read in chunks or followed
(`mask`, a `***` in text), and any artifact file that is a log or a line record, whole, in a range or
inside a folder's tar (`reader_for`, each secret byte a `*`, so sizes, ranges and hashes agree).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath

from ftq.runtime.settings import get_settings

MASK = "***"

Reader = Callable[[int, int, int], bytes]  # (fd, offset, length) -> bytes, as a download serves them

# Files of a run that may carry text a process printed (a trainer that prints its environment, a
# traceback holding a URL): served masked wherever they lie (train.log, exports/<id>/train.log, ...).
_MASKED_NAMES = frozenset({"train.log", "metrics.jsonl", "samples.jsonl"})
_MASKED_SUFFIXES = frozenset({".log", ".out", ".err", ".txt", ".jsonl"})


def is_masked(path: str) -> bool:
    """Whether the run file at `path` (relative to the run directory) is served with secrets masked."""
    name = PurePosixPath(path).name
    return name in _MASKED_NAMES or PurePosixPath(name).suffix.lower() in _MASKED_SUFFIXES


def needles(secrets_: Iterable[str]) -> list[bytes]:
    return sorted({v.encode() for v in secrets_ if v}, key=len, reverse=True)


def secret_spans(window: bytes, at: int, length: int, needles_: list[bytes]) -> list[tuple[int, int]]:
    """The runs of bytes of window[at:at+length] that lie inside an occurrence of a secret anywhere in
    `window` (so a chunk holding part of a secret is masked: read the bytes around it into `window`),
    relative to `at`, sorted and merged."""
    spans: list[list[int]] = []
    for needle in needles_:
        i = window.find(needle)
        while i != -1:
            lo, hi = max(i, at) - at, min(i + len(needle), at + length) - at
            if lo < hi:
                spans.append([lo, hi])
            i = window.find(needle, i + 1)
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def mask(window: bytes, at: int, length: int, needles_: list[bytes]) -> bytes:
    """window[at:at+length], each run of bytes inside a secret replaced by `***` (text for people)."""
    chunk = window[at : at + length]
    out, pos = bytearray(), 0
    for lo, hi in secret_spans(window, at, length, needles_):
        out += chunk[pos:lo] + MASK.encode()
        pos = hi
    return bytes(out + chunk[pos:])


def mask_same_size(window: bytes, at: int, length: int, needles_: list[bytes]) -> bytes:
    """window[at:at+length], each byte inside a secret replaced by `*` (bytes served by size)."""
    chunk = bytearray(window[at : at + length])
    for lo, hi in secret_spans(window, at, length, needles_):
        chunk[lo:hi] = b"*" * (hi - lo)
    return bytes(chunk)


def plain_read(fd: int, offset: int, length: int) -> bytes:
    return os.pread(fd, length, offset)


def masked_reader(secrets_: Iterable[str]) -> Reader:
    """A reader that replaces every byte of a secret with `*`: the size is unchanged, so ranges, the
    size listed and the sha256 all describe the same bytes. A range that holds only part of a secret is
    masked too: the bytes around the range are read as well."""
    found = needles(secrets_)
    if not found:
        return plain_read
    pad = max(len(n) for n in found) - 1

    def read(fd: int, offset: int, length: int) -> bytes:
        before = max(0, offset - pad)
        window = os.pread(fd, length + pad + (offset - before), before)
        return mask_same_size(window, offset - before, length, found)

    return read


def reader_for(path: str, secrets_: Iterable[str] | None = None) -> Reader:
    """How the run file at `path` is read for a download: masked when it is a log (`is_masked`)."""
    if is_masked(path):
        return masked_reader(get_settings().secret_values() if secrets_ is None else secrets_)
    return plain_read


def redact(text: str) -> str:
    """text with every value of the operator's secrets replaced by `***`."""
    for value in sorted(get_settings().secret_values(), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
