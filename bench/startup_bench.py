"""A run's start-up cost: CPU seconds of a whole one-process run of examples/tiny (4 steps, LoRA; on the
tiny model a run is almost all start-up), as ftq's trainer runs it (trainer/lean.py: the optional
packages the spec does not use left out, the two start-up scans served from their cache, the imports
made with the garbage collector off) against the same run started as transformers, PEFT and TRL start
when nothing is done for them (those packages imported, the scans made, the collector on).

    python -m bench.startup_bench [--rounds 3]

Each round runs both, in alternating order; the figure is the median of the rounds' user+system CPU
seconds of the process (its children included), which on a shared machine varies far less than its
wall time. The first lean run fills the scans' cache (~/.cache/ftq/start-up), as a machine's first run
does; the median is of the runs after it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench import alternated, cpu_seconds, log, note, offline_run_env, result, rounds_argument
from trainer.lean import OPTIONAL

# The baseline: the trainer without trainer/lean.py's start-up work (the optional packages imported
# first, no scan cache, the collector on throughout).
EAGER = (
    "import contextlib, importlib, runpy, sys\n"
    "import trainer.train as t\n"
    "t.start_up = lambda spec, **_: contextlib.nullcontext([])\n"
    f"for m in {list(OPTIONAL)!r}: importlib.import_module(m)\n"
    "sys.argv = ['trainer', *sys.argv[1:]]\n"
    "runpy.run_module('trainer', run_name='__main__', alter_sys=True)\n"
)


def main() -> None:
    rounds = rounds_argument(__doc__ or "")

    from tests.harness import tiny_assets, tiny_spec

    tiny = tiny_assets()
    work = Path(tempfile.mkdtemp(prefix="ftq-startup-"))
    spec = work / "spec.json"
    spec.write_text(json.dumps(tiny_spec(tiny, max_steps=4, processes=1)))
    env = offline_run_env()
    runs = {"lean": [sys.executable, "-m", "trainer"], "eager": [sys.executable, "-c", EAGER]}
    first = cpu_seconds([*runs["lean"], "--spec", str(spec), "--output_dir", str(work / "run-first")], env)
    log(f"first lean run (fills the scans' cache if empty): {first:.2f} CPU-s")

    def measure(name: str, round_: int) -> float:
        out = work / f"run-{name}-{round_}"
        return cpu_seconds([*runs[name], "--spec", str(spec), "--output_dir", str(out)], env)

    cpu = alternated(rounds, list(runs), measure)
    shutil.rmtree(work, ignore_errors=True)
    eager, lean = cpu["eager"], cpu["lean"]
    result("eager_cpu", eager, "s")
    result("lean_cpu", lean, "s", baseline="eager_cpu", target="<0.9")
    note(
        f"A one-process run of examples/tiny (4 steps, LoRA) in CPU seconds, median of {rounds} rounds:"
        f" {lean:.2f} s as the trainer starts (trainer/lean.py: {', '.join(OPTIONAL)} left out, the scans"
        f" cached, the imports without the collector) against {eager:.2f} s without that."
    )


if __name__ == "__main__":
    main()
