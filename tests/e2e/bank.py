"""The bank of shared trained runs: one richly configured finished job that every read-only assertion
about such a job reads, instead of a deployment and a training run per module.

The bank is a second `ftq up` of the session (the first, `server`, runs on its embedded defaults without
tokens): with two owners (alice, who owns the rich job, and bob, who must see none of it), the quick
sweeps, a Hub token with a Hub endpoint where nothing listens (exports' push), and the experiment
trackers (W&B offline, a real MLflow tracking server on loopback). Its fixtures (`bank`, `rich_job`) are
in tests/e2e/conftest.py; the first test that asks for one builds it. A second run, a full fine-tune
(`bank_full_job`), is posted with the rich job and trains beside it.

The rich job (RICH_SPEC) is the tiny LoRA job on one process, 4 steps, with an eval split (evals at 2 and
4), checkpoints at 2 and 4, two sample prompts and all three trackers. Who reads it:
- tests/e2e/cli/test_samples.py (the samples through HTTP, the CLI and the SDK; bob's 404),
- tests/e2e/ui/test_samples_page.py (the job page's samples table),
- tests/e2e/client/test_trackers.py (what MLflow, W&B and TensorBoard hold),
- tests/e2e/exports/test_exports.py (its LoRA job: the model card, merged and adapter exports, cancel,
  push, the CLI; exports add folders under the run's exports/ and change nothing the others read),
- tests/e2e/evaluations/test_evaluations.py (its eval.suites: every checkpoint scored, the best one, an
  evaluation on demand, the best checkpoint's export; evaluations add folders under evaluations/).

To assert something more about a finished job, add a test that reads `rich_job` (or the session's
`finished_job`, the shipped two-process example) rather than a training run of its own; if the job needs
one more setting, add it to RICH_SPEC and check that the readers above still hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.harness import QUICK_SETTINGS, REPO, TINY_RELATIVE, Deployment, free_port, tiny_spec

ALICE, BOB = "bank-alice-token-0001", "bank-bob-token-0002"
# Markup in a prompt is shown as text by the job page, never run (tests/e2e/ui/test_samples_page.py).
PROMPTS = ["one two three", "the cat <b>sat</b>"]
SAMPLE_NEW_TOKENS = 8
EXPERIMENT = "ftq-e2e"
EVAL_SUITES: list[dict[str, Any]] = [
    {
        "name": "qa",
        "type": "graders",
        "dataset": "./evaluation/qa.jsonl",
        "max_new_tokens": 4,
        "grader": {
            "type": "text_similarity",
            "name": "close",
            "input": "{{sample.output_text}}",
            "reference": "{{item.answer}}",
            "evaluation_metric": "fuzzy_match",
        },
    },
    {"name": "bench", "type": "lm_eval", "tasks": ["tiny_mc"], "task_dir": "./evaluation/tasks"},
]
SELECT_METRIC = "qa/score"
MLFLOW_PASSWORD = "op-s3cret-pw"
MLFLOW = REPO / ".venv-mlflow" / "bin" / "mlflow"  # `make test` makes it (see the Makefile)


def rich_spec() -> dict[str, Any]:
    """The rich job's spec (a POST /jobs body on the bank's default roots)."""
    spec = tiny_spec(TINY_RELATIVE, name="rich", max_steps=4, eval_steps=2, save_steps=2)
    spec["dataset"]["eval_split"] = "eval"  # one file: a seeded share of its rows held out for eval
    spec["eval"] = {
        "sample_prompts": PROMPTS,
        "sample_max_new_tokens": SAMPLE_NEW_TOKENS,
        # Every checkpoint (2, 4) and final/ scored by a graders suite and a local lm-eval task
        # (examples/evaluation), the best by the graders' score (tests/e2e/evaluations).
        "suites": EVAL_SUITES,
        "on": "checkpoint",
        "select": {"metric": SELECT_METRIC, "mode": "max"},
    }
    spec["integrations"] = {
        "wandb": {"project": "ftq-e2e", "tags": ["tiny", "e2e"]},
        "mlflow": {"experiment": EXPERIMENT},
        "tensorboard": True,
    }
    return spec


@dataclass
class MlflowServer:
    """A real MLflow tracking server on 127.0.0.1, its store a SQLite file of its own."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def up(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and the uvicorn process it starts
            self.proc.wait(timeout=30)


def start_mlflow(root: Path) -> MlflowServer:
    """The server, started (not waited for: the bank's `ftq up` starts meanwhile)."""
    assert MLFLOW.exists(), f"{MLFLOW} is missing: `make .venv-mlflow/bin/mlflow` (or `make test`) builds it"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with (root / "server.log").open("w") as log:
        proc = subprocess.Popen(
            [
                str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                "--default-artifact-root", str(root / "artifacts"),
            ],
            cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # No background job runner (a dozen worker processes the tests do not use).
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )  # fmt: skip
    return MlflowServer(f"http://127.0.0.1:{port}", proc, root / "server.log")


def full_spec() -> dict[str, Any]:
    """The bank's second run: a full fine-tune (no LoRA) of 2 steps, for what only such a job has
    (tests/e2e/exports: an adapter export is a 409, a merged one re-exports the model)."""
    spec = tiny_spec(TINY_RELATIVE, name="full", max_steps=2)
    spec["lora"] = None
    return spec


@dataclass
class Bank:
    """The bank's deployment, the MLflow server its trackers log to, and its runs' ids (posted together
    when the bank opens, so that they train side by side)."""

    dep: Deployment
    mlflow: MlflowServer
    rich_id: str
    full_id: str


def open_bank(root: Path) -> Iterator[Bank]:
    """Start the MLflow server and the bank's `ftq up` side by side; yield once both answer."""
    from tests.harness import tiny_assets, wait_until

    tiny_assets()
    mlflow = start_mlflow(root / "mlflow")
    try:
        settings = {
            **QUICK_SETTINGS,
            "hub_token": "hf_operator_token_for_tests",
            "wandb_mode": "offline",
            # The operator's credentials in the URL (the server has no auth: it ignores them); issue 28,
            # finding 3: no tenant may see them (tests/e2e/client/test_trackers.py).
            "mlflow_tracking_uri": mlflow.url.replace("http://", f"http://ftq-op:{MLFLOW_PASSWORD}@"),
        }
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # a Hub where nothing listens
        with Deployment(root / "ftq", tokens={"alice": ALICE, "bob": BOB}, settings=settings, env=env) as dep:
            wait_until("mlflow server up", mlflow.up, timeout=300)
            rich_id, full_id = (str(dep.post_job(spec)["id"]) for spec in (rich_spec(), full_spec()))
            yield Bank(dep, mlflow, rich_id, full_id)
            dep.close(cancel_active=True)
    finally:
        mlflow.stop()


@dataclass
class BankedRun:
    """One of the bank's runs, finished (succeeded): `job` is its GET /jobs/{id} at the end."""

    bank: Bank
    job: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.job["id"])

    @property
    def dep(self) -> Deployment:
        return self.bank.dep


def finished(bank: Bank, job_id: str) -> BankedRun:
    """One of the bank's runs, waited for to its end; it must have succeeded."""
    done = bank.dep.wait_terminal(job_id, timeout=600)
    assert done["status"] == "succeeded", bank.dep.report(job_id)
    return BankedRun(bank, dict(bank.dep.get(f"/jobs/{job_id}")))
