"""An evaluation's cost, two comparisons of whole `python -m trainer.evaluate` runs of one lm_eval suite on
the local task of examples/evaluation (as the worker runs them):

- CPU seconds, on the tiny job's final/: lm-eval indexing the suite's folder alone, against indexing every
  task it ships as well (what ftq did before it indexed the folder alone for a suite of its own tasks);
- wall seconds, on a LoRA job of the serve-able tiny model (examples/tiny/model-serve, which vLLM's CPU
  attention takes): the suite on lm-eval's vLLM backend (a child on .venv-vllm, in the sandbox), against
  the same evaluation on its HF backend (today's path for what vLLM cannot serve).

    python -m bench.evaluate_bench [--rounds 3] [--smoke]

The jobs train first (one process, 2 steps each). Each round runs each pair in alternating order; a figure
is the median of the rounds': CPU seconds (user+system of the process and the children it waited for),
which on a shared machine vary far less than wall time, for the first pair; wall time for the second.
--smoke: one round, one training step a job, the same RESULT lines (needs .venv-vllm: `make vllm`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import REPO, alternated, cpu_seconds, note, offline_run_env, result

# The baseline: the evaluation with no index of the folder alone (lm-eval's full index, and the folder).
FULL_INDEX = (
    "import sys\n"
    "import trainer.evaluate as e\n"
    "e._local_task_manager = lambda *_: None\n"
    "e.main(sys.argv[1:])\n"
)
# The vLLM pair's baseline: the evaluation with lm_eval suites on lm-eval's HF backend, as where vLLM is not.
HF_BACKEND = (
    "import sys\n"
    "import trainer.evaluate as e\n"
    "e.lm_eval_backend = lambda *_: e.LmEvalBackend('hf', 'the bench baseline')\n"
    "e.main(sys.argv[1:])\n"
)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one round, one training step a job")
    return parser.parse_args()


def _train(spec: dict[str, Any], work: Path, env: dict[str, str]) -> Path:
    """A run directory of `spec` trained by the trainer, with spec.json where the worker puts it."""
    work.mkdir(parents=True)
    run_dir = work / "run"
    (work / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-m", "trainer", "--spec", str(work / "spec.json"), "--output_dir", str(run_dir)],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    shutil.copy(work / "spec.json", run_dir / "spec.json")
    return run_dir


def _request(run_dir: Path, name: str) -> Path:
    out = run_dir / "evaluations" / name
    out.mkdir(parents=True)
    fields = {"evaluation_id": name, "job_id": "job_bench", "run_dir": str(run_dir), "out_dir": str(out)}
    (out / "evaluation.json").write_text(json.dumps({**fields, "step": None, "suites": ["bench"]}))
    return out / "evaluation.json"


def _results(request: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((request.parent / "results.json").read_text())
    assert "bench/tiny_mc/acc" in results["metrics"], results
    return results


def main() -> None:
    args = _arguments()
    rounds = 1 if args.smoke else args.rounds
    steps = 1 if args.smoke else 2

    from tests.harness import tiny_assets, tiny_spec

    tiny = tiny_assets()
    work = Path(tempfile.mkdtemp(prefix="ftq-evaluate-"))
    tasks = REPO / "examples" / "evaluation" / "tasks"
    suites = {"suites": [{"name": "bench", "type": "lm_eval", "tasks": ["tiny_mc"], "task_dir": str(tasks)}]}
    env = offline_run_env()
    spec = {**tiny_spec(tiny, max_steps=steps, processes=1), "eval": suites}
    served = tiny_spec(tiny, max_steps=steps, processes=1)
    served["model"]["name_or_path"] = str(tiny / "model-serve")
    served["eval"] = suites

    runs = {
        "folder": [sys.executable, "-m", "trainer.evaluate", "--request"],
        "full": [sys.executable, "-c", FULL_INDEX, "--request"],
        "vllm": [sys.executable, "-m", "trainer.evaluate", "--request"],
        "hf": [sys.executable, "-c", HF_BACKEND, "--request"],
    }
    scores: dict[str, dict[str, float]] = {}

    try:
        run_dir = _train(spec, work / "tiny", env)
        served_dir = _train(served, work / "serve", env)

        def evaluation_cpu(name: str, round_: int) -> float:
            req = _request(run_dir, f"{name}-{round_}")
            cpu = cpu_seconds([*runs[name], str(req)], env)
            _results(req)
            return cpu

        def evaluation_wall(name: str, round_: int) -> float:
            req = _request(served_dir, f"{name}-{round_}")
            start = time.monotonic()
            subprocess.run([*runs[name], str(req)], cwd=REPO, env=env, check=True, capture_output=True)
            wall = time.monotonic() - start
            results = _results(req)
            backend = results["suites"]["bench"]["backend"]
            assert backend == name, (
                f"{name}: ran on {backend}: {results['suites']['bench']['backend_reason']}"
            )
            scores[name] = results["metrics"]
            return wall

        cpu = alternated(rounds, ["folder", "full"], evaluation_cpu)
        wall = alternated(rounds, ["vllm", "hf"], evaluation_wall)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result("full_index_cpu", cpu["full"], "s")
    result("folder_index_cpu", cpu["folder"], "s", baseline="full_index_cpu", target="<0.7")
    result("hf_backend_wall", wall["hf"], "s")
    result("vllm_backend_wall", wall["vllm"], "s", baseline="hf_backend_wall")
    note(
        f"A whole evaluation of the tiny job's final/ with one lm_eval suite on examples/evaluation's local"
        f" task, in CPU seconds, median of {rounds} rounds: {cpu['folder']:.2f} s with lm-eval indexing"
        f" the suite's folder alone against {cpu['full']:.2f} s with its ~14,700 built-in tasks indexed too."
    )
    same = (
        "the same metrics"
        if scores["vllm"] == scores["hf"]
        else f"metrics {scores['vllm']} vs {scores['hf']}"
    )
    ratio = wall["vllm"] / wall["hf"]
    note(
        f"A whole evaluation of a {steps}-step LoRA job on examples/tiny/model-serve with the same suite"
        f" (in the sandbox either way), in wall seconds, median of {rounds} rounds: {wall['vllm']:.1f} s on"
        f" lm-eval's vLLM backend (a child on .venv-vllm's interpreter, vLLM's engine in it) against"
        f" {wall['hf']:.1f} s on its HF backend ({ratio:.2f}x), {same}. Four documents: the figure is the"
        " backends' start (vLLM's import and engine against transformers' load), not their throughput; the"
        " sandboxed children's CPU is not counted in this process's, so wall time is the figure here."
    )


if __name__ == "__main__":
    main()
