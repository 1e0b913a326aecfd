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

On lm-eval's vLLM backend (trainer.evaluate.lm_eval_backend) every suite runs in a child, since vLLM is
importable only from its own venv: `run_lm_eval_vllm` starts trainer.evaluate.lm_eval_vllm_child on that
venv's interpreter, in the same sandbox (the venv added to its read-only binds) for a task folder, and
as a plain child for built-in tasks.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import subprocess
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
_CHILD = "import sys; sys.path[:0] = [{repo!r}]; from trainer.evaluate import {child}; {child}()"
# The vLLM child: its engine core in the child's own process (no engine process to spawn and reach over
# sockets, inside the sandbox or out), no usage reports, and vLLM's progress lines left out of the log.
_VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}


_CPU_TOPOLOGY = ("/sys/devices/system/cpu", "/sys/devices/system/node")


class BackendUnavailable(Exception):
    """vLLM could not load the checkpoint (the message says why): the suite runs on HF instead."""


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


def box(
    suite: LmEvalSuite,
    spec: JobSpec,
    folder: Path,
    scratch: Path,
    *,
    python: str | None = None,
    child: str = "lm_eval_child",
    extra_env: dict[str, str] | None = None,
) -> Box:
    """What the suite's child sees: every path is the server's or the spec's (validated at submit).
    `python`: the interpreter it runs on (this one by default; the vLLM venv's, read-only like this one)."""
    assert suite.task_dir is not None
    python, prefixes = interpreter_paths(python or sys.executable)
    read_only = [*prefixes, *(str(REPO / p) for p in _PACKAGES), str(folder.resolve())]
    read_only += _local_dir(spec.model.name_or_path) + _local_dir(spec.model.adapter) + _hub_cache()
    read_only.append(str(Path(suite.task_dir).resolve()))
    vllm = child == "lm_eval_vllm_child"
    if vllm:
        # vLLM on the CPU places its threads by the CPU topology `lscpu` reads from these.
        read_only += [p for p in _CPU_TOPOLOGY if Path(p).is_dir()]
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
    env.update(extra_env or {})
    if vllm:  # torch's inductor builds vLLM's CPU kernels with g++, which finds its linker on PATH
        env["PATH"] = "/usr/bin:/bin"
    devices = tuple(sorted(glob.glob("/dev/nvidia*"))) if spec.resources.device == "cuda" else ()
    return Box(
        argv=(python, "-I", "-c", _CHILD.format(repo=str(REPO), child=child)),
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
    return _boxed(suite, spec, folder, out_dir, "lm_eval_child", None, None, None)


def run_lm_eval_vllm(
    suite: LmEvalSuite,
    spec: JobSpec,
    folder: Path,
    out_dir: Path,
    python: str,
    lm: dict[str, Any],
    env: dict[str, str] | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The suite's metrics and details from lm-eval's VLLM model (arguments `lm`) in a child on `python`,
    the vLLM venv's interpreter, with `env` added to its environment: in the sandbox for a task folder, a
    plain child for built-in tasks. BackendUnavailable when vLLM cannot load the model."""
    settings = {**_VLLM_ENV, **(env or {})}
    if suite.task_dir:
        return _boxed(suite, spec, folder, out_dir, "lm_eval_vllm_child", python, lm, settings)
    scratch = _scratch(suite, out_dir)
    child_env = {**os.environ, **settings, "HF_DATASETS_OFFLINE": "1", "TMPDIR": str(scratch)}
    try:
        proc = subprocess.run(
            [python, "-I", "-c", _CHILD.format(repo=str(REPO), child="lm_eval_vllm_child")],
            input=json.dumps(_request(suite, spec, folder, lm)).encode(),
            capture_output=True,
            env=child_env,
            cwd=str(scratch),
            timeout=TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as err:
        _echo(err.stderr or b"")
        raise DatasetError(
            f"suite {suite.name}: lm-eval ran past {TIMEOUT_SECONDS:g} s and was stopped"
        ) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _answer(suite, proc.returncode, proc.stdout, _echo(proc.stderr), "its child")


def _scratch(suite: LmEvalSuite, out_dir: Path) -> Path:
    scratch = out_dir / f".sandbox-{suite.name}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    return scratch


def _request(suite: LmEvalSuite, spec: JobSpec, folder: Path, lm: dict[str, Any] | None) -> dict[str, Any]:
    request = {
        "spec": spec.model_dump(mode="json"),
        "folder": str(folder.resolve()),
        "suite": suite.model_dump(),
    }
    if lm is not None:
        request["lm"] = lm
    return request


def _echo(stderr: bytes) -> str:
    """The child's stderr, into this process's log (the evaluation's), and as text."""
    tail = stderr.decode(errors="replace")
    if tail:
        sys.stderr.write(tail if tail.endswith("\n") else tail + "\n")
    return tail


def _boxed(
    suite: LmEvalSuite,
    spec: JobSpec,
    folder: Path,
    out_dir: Path,
    child: str,
    python: str | None,
    lm: dict[str, Any] | None,
    env: dict[str, str] | None,
) -> tuple[dict[str, float], dict[str, Any]]:
    scratch = _scratch(suite, out_dir)
    try:
        outcome = run_boxed(
            box(suite, spec, folder, scratch, python=python, child=child, extra_env=env),
            json.dumps(_request(suite, spec, folder, lm)).encode(),
            timeout=TIMEOUT_SECONDS,
            max_output=_MAX_OUTPUT,
        )
    except SandboxUnavailable as err:
        raise ModelError(f"suite {suite.name}: task_dir runs only in the sandbox, and {err}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tail = _echo(outcome.stderr)
    if outcome.timed_out:
        raise DatasetError(f"suite {suite.name}: lm-eval ran past {TIMEOUT_SECONDS:g} s and was stopped")
    if outcome.output_exceeded:
        raise DatasetError(
            f"suite {suite.name}: lm-eval printed more than {_MAX_OUTPUT} bytes and was stopped"
        )
    return _answer(suite, outcome.returncode, outcome.stdout, tail, "the sandbox")


def _answer(
    suite: LmEvalSuite, returncode: int, stdout: bytes, tail: str, where: str
) -> tuple[dict[str, float], dict[str, Any]]:
    """What a child answered: its metrics and details, or the error it reported, raised here (`where`:
    where it ran, for an error that it did not report)."""
    try:
        answer = json.loads(stdout.decode(errors="replace") or "null")
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
    if isinstance(answer, dict) and isinstance(answer.get("unservable"), str):
        raise BackendUnavailable(answer["unservable"][:500])
    last = [line for line in tail.splitlines() if line.strip()][-1:] or [f"exit status {returncode}"]
    raise DatasetError(f"suite {suite.name}: lm-eval in {where} failed: {last[0][:500]}")
