"""Uploads stream to disk: the API's memory does not grow with the file.

    python -m bench.upload_memory [--mb 500] [--multipart]

Starts a real `ftq api` (SQLite, no worker: the validation waits in the queue, the upload is what is
measured), writes a JSON Lines file of `--mb` megabytes, uploads it with the SDK (`client.files.upload`,
which streams it) or as a multipart form, and prints the API process's peak RSS growth: its VmHWM after
the upload minus its VmRSS before (the peak is reset first through /proc/<pid>/clear_refs), with the
upload's throughput. Target: growth under 50 MB for 500 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ftq.client import Client
from tests.harness import Deployment

TOKEN = "bench-upload-token-0123456789"


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def make_file(path: Path, size: int) -> str:
    """A JSON Lines file of about `size` bytes of ~1 KB text rows; returns its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        i = 0
        written = 0
        while written < size:
            block = b"".join(
                json.dumps({"text": f"row {i + k} " + "lorem ipsum dolor sit amet " * 36}).encode() + b"\n"
                for k in range(1000)
            )
            i += 1000
            f.write(block)
            digest.update(block)
            written += len(block)
    return digest.hexdigest()


def _multipart(path: Path, boundary: str) -> Iterator[bytes]:
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path.name}"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


def measure(dep: Deployment, path: Path, *, multipart: bool = False) -> dict[str, Any]:
    """Upload `path` to the running deployment; the API's RSS growth (KiB) and the file it made."""
    pid = dep.pid(dep.server_name)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib(pid, "VmRSS")
    start = time.perf_counter()
    if multipart:
        boundary = "ftqbenchboundary0123456789"
        with httpx.Client(base_url=dep.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300) as c:
            r = c.post(
                "/files",
                content=_multipart(path, boundary),
                headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
            )
            r.raise_for_status()
            uploaded: dict[str, Any] = r.json()
    else:
        with Client(dep.url, TOKEN, timeout=300) as client:
            uploaded = client.files.upload(path).model_dump(mode="json")
    seconds = time.perf_counter() - start
    peak = _status_kib(pid, "VmHWM")
    return {
        "bytes": uploaded["bytes"],
        "sha256": uploaded["sha256"],
        "rss_before_kib": before,
        "peak_kib": peak,
        "growth_kib": peak - before,
        "seconds": seconds,
    }


def deployment(root: Path, max_file_bytes: int) -> Deployment:
    return Deployment(
        root,
        mode="api",
        tokens={"bench": TOKEN},
        settings={"max_file_bytes": max_file_bytes, "file_quota_bytes": 4 * max_file_bytes},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--multipart", action="store_true", help="Send a multipart form, not a raw body.")
    args = parser.parse_args()
    size = args.mb * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="ftq-upload-bench-") as tmp:
        root = Path(tmp)
        path = root / "big.jsonl"
        sha = make_file(path, size)
        with deployment(root / "dep", 2 * size) as dep:
            got = measure(dep, path, multipart=args.multipart)
        assert got["sha256"] == sha, "the stored file's hash differs from the file's"
        mb = got["bytes"] / 1024**2
        kind = "multipart" if args.multipart else "raw"
        before, peak = got["rss_before_kib"] / 1024, got["peak_kib"] / 1024
        growth = got["growth_kib"] / 1024
        print(
            f"upload of {mb:.0f} MB ({kind}): API RSS {before:.1f} MB before, peak {peak:.1f} MB; "
            f"growth {growth:.1f} MB ({growth / mb:.3f} MB per MB uploaded); {mb / got['seconds']:.0f} MB/s"
        )


if __name__ == "__main__":
    main()
