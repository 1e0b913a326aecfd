"""What the end-to-end session shares (its fixtures are in conftest.py): the shipped example its job runs,
the auth server's token, the finished job, the curl walkthrough running in the background, and the DPO
job's spec."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import REPO, TINY_RELATIVE, CliResult, Deployment, clean_env, tiny_spec

# The shipped example the session's job runs (FTQ_TEST_TINY_SPEC: another while developing).
TINY_SPEC = Path(os.environ.get("FTQ_TEST_TINY_SPEC") or REPO / "examples" / "tiny-cpu.yaml")
CURL_SH = REPO / "examples" / "curl.sh"
AUTH_OWNER, AUTH_TOKEN = "erin", "e2e-secret-token"


@dataclass
class FinishedJob:
    """`ftq submit examples/tiny-cpu.yaml --follow`, run once per session."""

    result: CliResult
    job_id: str


class Walkthrough:
    """examples/curl.sh run as written against the session's server, in the background (its own tiny
    run overlaps the session's instead of adding a minute to it)."""

    def __init__(self, server: Deployment):
        self.log = server.root / "curl-walkthrough.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                ["bash", str(CURL_SH)],
                cwd=REPO,
                env=clean_env(FTQ_URL=server.url),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait(self, timeout: float = 600) -> tuple[int, str]:
        """Its exit status and output."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = -9
        return code, self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def dpo_spec(dataset: str, **training: Any) -> dict[str, Any]:
    """A DPO job with LoRA on the tiny model (`dataset` under examples/tiny), 10 steps. One process
    (sharding is not the point here) taking the 8 sequences a step that two took 4 each of."""
    spec = tiny_spec(TINY_RELATIVE, name="dpo", max_steps=10)
    spec["dataset"] = {"name_or_path": f"{TINY_RELATIVE}/{dataset}"}
    spec["training"].update(
        method="dpo", learning_rate=5e-3, per_device_train_batch_size=8, dpo={"beta": 0.1}, **training
    )
    spec["lora"]["r"], spec["lora"]["alpha"] = 8, 16
    return spec


def session_dpo_spec() -> dict[str, Any]:
    """The session's DPO job (`dpo_job`): dpo_spec on the preference folder, whose eval.jsonl is its eval
    split, with an evaluation at steps 5 and 10."""
    spec = dpo_spec("preference", eval_steps=5)
    spec["dataset"]["eval_split"] = "eval"
    return spec
