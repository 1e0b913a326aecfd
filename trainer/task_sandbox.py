"""An lm_eval suite with a `task_dir` (the owner's own task YAMLs) run inside the tenant-code sandbox.

A task folder is tenant code: a YAML may load Python from the folder (`doc_to_text: !function
pwn.doc_to_text`), and lm-eval renders its Jinja templates without a sandbox of its own. So the
evaluation process, which holds the run's secrets (tracker credentials, the operator's FTQ_PASS_ENV) in
its environment, never imports such a folder. It starts a child under bubblewrap (ftq.sandbox): no
network, an environment of a few offline switches, and read-only binds of the interpreter, ftq's own
code, the checkpoint, the base model and the task folder; a scratch folder under the evaluation's own
output folder is its only writable place. The child loads the checkpoint and runs the tasks with the same
functions the evaluation uses in process (trainer.evaluate.lm_eval_child), and answers its metrics on the
stdout it was started with.

Where the sandbox cannot start, the suite fails with `model_error` naming the fix, never running the
folder's code outside it. Built-in tasks (no `task_dir`) are lm-eval's own code, installed by the
operator, and still run in the evaluation process.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ftq.contract.evaluation import LmEvalSuite
from ftq.contract.spec import JobSpec
from ftq.sandbox import Box, SandboxUnavailable
from ftq.sandbox import run as run_boxed
from ftq.sandbox.boundary import interpreter_paths

from .errors import DatasetError, FtqError, ModelError

log = logging.getLogger("trainer.evaluate")

REPO = Path(__file__).resolve().parents[1]
# The code the child imports from this checkout (never the checkout itself: it may hold the data dir).
_PACKAGES = ("ftq", "trainer")
# How long one sandboxed suite may run, and what it may print, before its tree is killed.
TIMEOUT_SECONDS = float(os.environ.get("FTQ_EVAL_SANDBOX_TIMEOUT_SECONDS", 6 * 3600))
_MAX_OUTPUT = 64 * 1024 * 1024
_ERRORS: dict[str, type[FtqError]] = {"dataset_error": DatasetError, "model_error": ModelError}
_CHILD = "import sys; sys.path[:0] = [{repo!r}]; from trainer.evaluate import lm_eval_child; lm_eval_child()"


def _local_dir(name: str | None) -> list[str]:
    if name and Path(name).is_dir():
        return [str(Path(name).resolve())]
    return []


def _hub_cache() -> list[str]:
    """The hub cache a hub-id base model loads from (read-only: the child is offline)."""
    if os.environ.get("HF_HUB_CACHE"):
        path = Path(os.environ["HF_HUB_CACHE"])
    else:
        path = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    return [str(path.resolve())] if path.is_dir() else []


def box(suite: LmEvalSuite, spec: JobSpec, folder: Path, scratch: Path) -> Box:
    """What the suite's child sees: every path is the server's or the spec's (validated at submit)."""
    assert suite.task_dir is not None
    python, prefixes = interpreter_paths(sys.executable)
    read_only = [*prefixes, *(str(REPO / p) for p in _PACKAGES), str(folder.resolve())]
    read_only += _local_dir(spec.model.name_or_path) + _local_dir(spec.model.adapter) + _hub_cache()
    read_only.append(str(Path(suite.task_dir).resolve()))
    env = {
        "LANG": "C.UTF-8",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "HF_HOME": str(scratch / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if _hub_cache():
        env["HF_HUB_CACHE"] = _hub_cache()[0]
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    devices = tuple(sorted(glob.glob("/dev/nvidia*"))) if spec.resources.device == "cuda" else ()
    return Box(
        argv=(python, "-I", "-c", _CHILD.format(repo=str(REPO))),
        read_only=tuple(dict.fromkeys(read_only)),
        writable=(str(scratch),),
        devices=devices,
        env=env,
        cwd=str(Path(suite.task_dir).resolve()),
        bwrap=os.environ.get("FTQ_SANDBOX_BWRAP") or "bwrap",
    )


def run_lm_eval(
    suite: LmEvalSuite, spec: JobSpec, folder: Path, out_dir: Path
) -> tuple[dict[str, float], dict[str, Any]]:
    """The suite's metrics and details, as trainer.evaluate.run_lm_eval gives them, from a sandboxed child."""
    scratch = out_dir / f".sandbox-{suite.name}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    request = {
        "spec": spec.model_dump(mode="json"),
        "folder": str(folder.resolve()),
        "suite": suite.model_dump(),
    }
    try:
        outcome = run_boxed(
            box(suite, spec, folder, scratch),
            json.dumps(request).encode(),
            timeout=TIMEOUT_SECONDS,
            max_output=_MAX_OUTPUT,
        )
    except SandboxUnavailable as err:
        raise ModelError(f"suite {suite.name}: task_dir runs only in the sandbox, and {err}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tail = outcome.stderr.decode(errors="replace")
    if tail:
        sys.stderr.write(tail if tail.endswith("\n") else tail + "\n")
    if outcome.timed_out:
        raise DatasetError(f"suite {suite.name}: lm-eval ran past {TIMEOUT_SECONDS:g} s and was stopped")
    if outcome.output_exceeded:
        raise DatasetError(
            f"suite {suite.name}: lm-eval printed more than {_MAX_OUTPUT} bytes and was stopped"
        )
    try:
        answer = json.loads(outcome.stdout.decode(errors="replace") or "null")
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("metrics"), dict):
        metrics = {
            str(k): float(v)
            for k, v in answer["metrics"].items()
            if type(v) in (int, float) and v == v and abs(v) != float("inf")
        }
        detail = answer.get("detail")
        return metrics, detail if isinstance(detail, dict) else {}
    if isinstance(answer, dict) and answer.get("code") in _ERRORS:
        raise _ERRORS[str(answer["code"])](str(answer.get("message", ""))[:2000])
    last = [line for line in tail.splitlines() if line.strip()][-1:] or [f"exit status {outcome.returncode}"]
    raise DatasetError(f"suite {suite.name}: lm-eval in the sandbox failed: {last[0][:500]}")
