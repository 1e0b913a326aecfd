"""The python grader sandbox's overhead per scored sample: the same `grade` function called in this
process, against scoring batches of samples through ftq.grading.sandbox (a child process per batch under
bubblewrap: its own namespaces, rlimits and audit hook), as a ratio. Batches of 1 are what
`POST /graders/run` does; larger batches are what a trainer's reward call does.

    python -m bench.graders_bench [--samples 64] [--batches 1,16,64]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import log, note, result
from ftq.grading.sandbox import Limits, run_python

SOURCE = """
def grade(sample, item):
    text = sample["output_text"]
    return 1.0 if item["answer"] in text else len(set(text.split()) & set(item["answer"].split())) / 10
"""


def batch(n: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [({"output_text": f"the answer is {i} apples"}, {"answer": f"{i % 7} apples"}) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batches", default="1,16,64")
    args = parser.parse_args()
    samples = batch(args.samples)

    scope: dict[str, Any] = {}
    exec(compile(SOURCE, "<grader>", "exec"), scope)  # the baseline: the function in this process
    grade = scope["grade"]
    started = time.perf_counter()
    rounds = 2000
    for _ in range(rounds):
        in_process = [grade(s, i) for s, i in samples]
    per_sample_in_process = (time.perf_counter() - started) / (rounds * len(samples))
    result("grader_in_process_per_sample", per_sample_in_process * 1e6, "us")

    limits = Limits()
    for size in (int(x) for x in args.batches.split(",")):
        started = time.perf_counter()
        scored = 0
        for at in range(0, len(samples), size):
            rewards = run_python("bench", SOURCE, samples[at : at + size], limits)
            assert rewards == in_process[at : at + size]
            scored += len(rewards)
        per_sample = (time.perf_counter() - started) / scored
        log(f"batch {size}: {per_sample * 1e3:.2f} ms per sample")
        result(
            f"grader_sandbox_per_sample_batch_{size}",
            per_sample * 1e6,
            "us",
            baseline="grader_in_process_per_sample",
        )
    note(
        "graders: per scored sample, a python grader in the sandbox (one child process per batch: "
        "bubblewrap's namespaces, python -I -S, rlimits, the audit hook) against the same grade() called "
        "in process; the ratio is almost all process start-up, paid once per batch."
    )


if __name__ == "__main__":
    main()
