"""POST /jobs on the same dataset again (a sweep, a retry): the API's CPU per submit when the file was
seen before, against a submit of a file it has not seen (the dataset preflight tokenizes the file's
sample: ftq.planning.dataset_preflight keeps what that gives, per API process, keyed by the file and the
tokenizer).

    python -m bench.submit_bench [--rounds 3]

A real `ftq api` (SQLite, no worker: the jobs stay queued). Each round posts examples/tiny's spec 20
times on one copy of its train.jsonl (seen after the first) and 20 times on 20 new copies (each unseen:
another inode, another path), in alternating order; the figure is the median over the rounds of the
server process's CPU per POST (/proc), which on a shared machine varies far less than its latency.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench import alternated, note, result, rounds_argument, scratch
from tests.harness import Deployment, tiny_assets, tiny_spec

POSTS = 20


def _spec(tiny: Path, name: str, max_steps: int, data: Path) -> dict[str, Any]:
    spec = tiny_spec(tiny, name=name, max_steps=max_steps)
    spec["dataset"]["name_or_path"] = str(data)
    return spec


def main() -> None:
    rounds = rounds_argument(__doc__ or "")
    root = scratch("submit-")
    data = root / "data-files"
    data.mkdir()
    tiny = tiny_assets()
    settings = {
        "local_roots": f"{data}:{tiny}",
        "max_active_jobs_per_owner": 100_000,
        "post_rate_per_minute": 100_000,
    }
    with Deployment(root / "dep", mode="api", settings=settings) as api:
        seen = data / "seen.jsonl"
        shutil.copy(tiny / "data" / "train.jsonl", seen)
        api.post_job(_spec(tiny, "warm", 1, seen))
        counter = iter(range(1_000_000))

        def measure(name: str, round_: int) -> float:
            paths = []
            for _ in range(POSTS):
                if name == "seen":
                    paths.append(seen)
                else:
                    path = data / f"new-{next(counter)}.jsonl"
                    shutil.copy(seen, path)
                    paths.append(path)
            before = api.cpu_seconds()
            for i, path in enumerate(paths):
                api.post_job(_spec(tiny, f"{name}-{round_}-{i}", 1 + i, path))
            return (api.cpu_seconds() - before) * 1000 / POSTS

        cpu = alternated(rounds, ["seen", "unseen"], measure)
    shutil.rmtree(root, ignore_errors=True)
    seen_ms, unseen_ms = cpu["seen"], cpu["unseen"]
    note(
        f"API CPU per POST /jobs of examples/tiny's spec on `ftq api` (SQLite), median of {rounds} rounds of"
        f" {POSTS}: {seen_ms:.1f} ms on a file it has seen against {unseen_ms:.1f} ms on one it has not (the"
        " dataset preflight's token counts kept per file and tokenizer)."
    )
    result("submit_unseen_ms", unseen_ms, "ms")
    result("submit_seen_ms", seen_ms, "ms", baseline="submit_unseen_ms", target="<0.5")


if __name__ == "__main__":
    main()
