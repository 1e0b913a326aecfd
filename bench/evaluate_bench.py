"""An evaluation's cost: CPU seconds of a whole `python -m trainer.evaluate` of the tiny job's final/ with
one lm_eval suite on the local task of examples/evaluation (as the worker runs it), against the same
evaluation when lm-eval indexes every task it ships as well as the suite's folder (what ftq did before
it indexed the folder alone for a suite of the folder's own tasks).

    python -m bench.evaluate_bench [--rounds 3]

The tiny job trains first (one process, 2 steps). Each round runs both evaluations in alternating order;
the figure is the median of the rounds' user+system CPU seconds of the process, which on a shared
machine varies far less than its wall time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import REPO, alternated, cpu_seconds, note, offline_run_env, result, rounds_argument

# The baseline: the evaluation with no index of the folder alone (lm-eval's full index, and the folder).
FULL_INDEX = (
    "import sys\n"
    "import trainer.evaluate as e\n"
    "e._local_task_manager = lambda *_: None\n"
    "e.main(sys.argv[1:])\n"
)


def main() -> None:
    rounds = rounds_argument(__doc__ or "")

    from tests.harness import tiny_assets, tiny_spec

    tiny = tiny_assets()
    work = Path(tempfile.mkdtemp(prefix="ftq-evaluate-"))
    run_dir = work / "run"
    spec = tiny_spec(tiny, max_steps=2, processes=1)
    tasks = REPO / "examples" / "evaluation" / "tasks"
    spec["eval"] = {
        "suites": [{"name": "bench", "type": "lm_eval", "tasks": ["tiny_mc"], "task_dir": str(tasks)}]
    }
    env = offline_run_env()
    (work / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-m", "trainer", "--spec", str(work / "spec.json"), "--output_dir", str(run_dir)],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    shutil.copy(work / "spec.json", run_dir / "spec.json")  # where the worker puts it

    def request(name: str) -> Path:
        out = run_dir / "evaluations" / name
        out.mkdir(parents=True)
        fields = {"evaluation_id": name, "job_id": "job_bench", "run_dir": str(run_dir), "out_dir": str(out)}
        (out / "evaluation.json").write_text(json.dumps({**fields, "step": None, "suites": ["bench"]}))
        return out / "evaluation.json"

    runs = {
        "folder": [sys.executable, "-m", "trainer.evaluate", "--request"],
        "full": [sys.executable, "-c", FULL_INDEX, "--request"],
    }

    def evaluation_cpu(name: str, round_: int) -> float:
        req = request(f"{name}-{round_}")
        cpu = cpu_seconds([*runs[name], str(req)], env)
        metrics = json.loads((req.parent / "results.json").read_text())["metrics"]
        assert "bench/tiny_mc/acc" in metrics, metrics
        return cpu

    try:
        cpu = alternated(rounds, list(runs), evaluation_cpu)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result("full_index_cpu", cpu["full"], "s")
    result("folder_index_cpu", cpu["folder"], "s", baseline="full_index_cpu", target="<0.7")
    note(
        f"A whole evaluation of the tiny job's final/ with one lm_eval suite on examples/evaluation's local"
        f" task, in CPU seconds, median of {rounds} rounds: {cpu['folder']:.2f} s with lm-eval indexing"
        f" the suite's folder alone against {cpu['full']:.2f} s with its ~14,700 built-in tasks indexed too."
    )


if __name__ == "__main__":
    main()
