"""Artifacts: a folder streams as a tar in bounded memory, however big the folder.

    python -m bench.artifacts_tar [--gb 2] [--files 8] [--random]

A real `ftq api` (SQLite, no worker) holds one job whose final/ folder is `--gb` GB in `--files` files
(sparse files by default: the kernel hands back zeros without disk reads, so the figure is the API's own
memory, not the disk's speed; `--random` writes random bytes instead). A client fetches
GET /jobs/{id}/artifacts/final.tar and throws the bytes away. The figure is the API process's RSS growth
while it streams: its peak (VmHWM, reset through /proc/<pid>/clear_refs after a warm-up request, and
VmRSS sampled every 20 ms, whichever is higher) minus its RSS before the stream. Target: a few tens of
MB (< 64 MB), independent of the folder's size.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import log, note, result, scratch
from tests.harness import Deployment, config_only_model, text_dataset

MB = 1024**2


def proc_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux 4.0+); False where /proc does not let us."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class Measurement:
    bytes_streamed: int
    seconds: float
    baseline_rss_mb: float
    peak_rss_mb: float

    @property
    def growth_mb(self) -> float:
        return self.peak_rss_mb - self.baseline_rss_mb


def fill_folder(folder: Path, total_bytes: int, files: int, random: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    each = total_bytes // files
    for i in range(files):
        path = folder / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with path.open("wb") as f:
            if random:
                left = each
                while left:
                    n = min(left, 8 * MB)
                    f.write(os.urandom(n))
                    left -= n
            else:
                f.truncate(each)


def job_with_final(dep: Deployment, total_bytes: int, files: int, random: bool) -> str:
    """A job (queued: no worker) whose run directory holds a final/ of total_bytes."""
    job = dep.post_job(
        {
            "name": "artifacts-bench",
            "model": {"name_or_path": "./model"},
            "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
            "training": {"max_steps": 1, "max_seq_len": 32, "mixed_precision": "no"},
            "resources": {"device": "cpu", "processes_per_node": 1},
        }
    )
    fill_folder(dep.run_dir(job["id"]) / "final", total_bytes, files, random)
    return str(job["id"])


def api_deployment(root: Path) -> Deployment:
    """`ftq api` (no worker) with a config-only model and a dataset in its data dir."""
    data = root / "data"
    config_only_model(data / "model")
    text_dataset(data / "data" / "train.jsonl")
    return Deployment(root, mode="api", data_dir=data)


def measure(dep: Deployment, job_id: str) -> Measurement:
    """Stream final.tar once from the API, reading and dropping it; the API's RSS before and at peak."""
    pid = dep.pid()
    url = f"/jobs/{job_id}/artifacts/final.tar"
    with httpx.Client(base_url=dep.url, timeout=120) as client:
        # Warm-up: the route's code, the thread pool and the first buffers exist before the baseline.
        with client.stream("GET", url) as r:
            assert r.status_code == 200, r.read()
            for _ in zip(range(64), r.iter_bytes(), strict=False):
                pass
        time.sleep(0.5)
        baseline = proc_kb(pid, "VmRSS")
        hwm_ok = reset_peak(pid)
        peak = baseline
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                with contextlib.suppress(OSError, KeyError):
                    peak = max(peak, proc_kb(pid, "VmRSS"))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        got = 0
        t0 = time.perf_counter()
        with client.stream("GET", url) as r:
            assert r.status_code == 200
            expected = int(r.headers["content-length"])
            for chunk in r.iter_raw(4 * MB):
                got += len(chunk)
        seconds = time.perf_counter() - t0
        stop.set()
        sampler.join()
        assert got == expected, (got, expected)
        if hwm_ok:
            peak = max(peak, proc_kb(pid, "VmHWM"))
    return Measurement(got, seconds, baseline / 1024, peak / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--random", action="store_true", help="random bytes instead of sparse files")
    args = parser.parse_args()
    root = scratch("artifacts-")
    total = int(args.gb * 1024**3)
    with api_deployment(root) as dep:
        job_id = job_with_final(dep, total, args.files, args.random)
        log(f"streaming {total / MB:.0f} MB as final.tar from {dep.url}")
        m = measure(dep, job_id)
    result(
        "tar_stream_rss_growth",
        m.growth_mb,
        "MB",
        target="<64",
        folder_mb=round(total / MB),
        baseline_rss_mb=round(m.baseline_rss_mb, 1),
        peak_rss_mb=round(m.peak_rss_mb, 1),
    )
    result("tar_stream_throughput", m.bytes_streamed / MB / m.seconds, "MB/s", seconds=round(m.seconds, 2))
    note(
        f"artifacts: GET final.tar of a {total / 1024**3:.1f} GB folder in {args.files} "
        f"{'random' if args.random else 'sparse'} files through a real `ftq api`; RSS growth is the API "
        "process's peak (VmHWM after a clear_refs reset, and VmRSS sampled every 20 ms) minus its RSS "
        "after a warm-up request."
    )


if __name__ == "__main__":
    main()
