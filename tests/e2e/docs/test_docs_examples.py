"""The docs' examples run as printed (issue 50): every Python and YAML block of README.md and docs/ is
accounted for here, and run against the session's `ftq up` (the quick start's CPU setup) with the
server's address the only change, or is a part of a shipped example that runs, or is marked on its page
as a GPU example whose CPU twin in examples/ runs here.

A new block fails `test_every_block_is_accounted_for` until it is given a way to run in HOW. The runs
(the README's and the SDK page's tiny job, the OpenAI example, the GRPO and evaluation twins, the
graders calls) start together and share the session's server: about 60 CPU-seconds in all, most of it
the trainers' start-up."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ftq.contract.events import sign
from ftq.contract.spec import IntegrationsSpec, JobSpec
from tests.harness import REPO, Deployment, clean_env
from tests.harness.env import FTQ

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$')
QUICK_START_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Block:
    page: str  # relative to the checkout
    n: int  # its place among the page's Python and YAML blocks
    lang: str
    text: str  # as the site shows it (a snippet include resolved to the file)
    before: str  # the page's text before the block (where a GPU example is marked)
    snippet: str | None  # the file a `--8<--` include names


def blocks() -> list[Block]:
    out: list[Block] = []
    for page in PAGES:
        content = page.read_text()
        n = 0
        for m in FENCE.finditer(content):
            lang = m.group(1)
            if lang not in ("python", "yaml"):
                continue
            text, snippet = m.group(2), None
            if include := SNIPPET.match(text.strip()):
                snippet = include.group(1)
                text = (REPO / snippet).read_text()
            rel = str(page.relative_to(REPO))
            out.append(Block(rel, n, lang, text, content[: m.start()], snippet))
            n += 1
    return out


# How each block runs. run: executed as printed (python; FTQ_URL and the quick start's URL point at the
# session's server); file:X: the block is the shipped file X, which runs here; part:X: the block's mapping
# is a part of the shipped example X, which runs here; gpu:X: marked "A GPU example" on its page, with X
# its CPU twin, which runs here; catalog: an operator's catalog, read by the server's own loader;
# schema: a spec section the server's schema takes (trackers need the operator's tracker settings);
# webhook: a receiver's function, called on a delivery ftq signed; golden / serving: pinned by another
# test (the renderer's golden files; tests/e2e/serving, which owns the serving examples).
HOW: dict[tuple[str, int], str] = {
    ("README.md", 0): "run",
    ("docs/evaluation.md", 0): "part:examples/eval/tiny-eval-cpu.yaml",
    ("docs/events.md", 0): "webhook",
    ("docs/graders.md", 0): "run",
    ("docs/grpo.md", 0): "file:examples/grpo/tiny-grpo-cpu.yaml",
    ("docs/grpo.md", 1): "gpu:examples/grpo/tiny-grpo-cpu.yaml",
    ("docs/openai.md", 0): "run",
    ("docs/openai.md", 1): "catalog",
    ("docs/openai.md", 2): "serving",
    ("docs/sdk.md", 0): "file:examples/sdk_tool.py",
    ("docs/slurm.md", 0): "golden",
    ("docs/spec/training.md", 0): "part:examples/eval/tiny-eval-cpu.yaml",
    ("docs/trackers.md", 0): "schema",
}
# The CPU twins and shipped examples the blocks above lean on, each run by `ran`.
EXAMPLES_RUN = {
    "examples/eval/tiny-eval-cpu.yaml",
    "examples/grpo/tiny-grpo-cpu.yaml",
    "examples/sdk_tool.py",
}


def marked_gpu(b: Block, twin: str) -> bool:
    """The page says, just before the block, that it is a GPU example, and names its CPU twin."""
    mark = " ".join(b.before[-600:].split())
    return "A GPU example" in mark and twin in mark


def block(page: str, n: int) -> Block:
    return next(b for b in blocks() if (b.page, b.n) == (page, n))


def test_every_block_is_accounted_for() -> None:
    found = {(b.page, b.n) for b in blocks()}
    assert found == set(HOW), (
        f"blocks without a way to run: {sorted(found - set(HOW))}; gone: {sorted(set(HOW) - found)}"
    )
    for key, how in HOW.items():
        path = how.partition(":")[2]
        if path:
            assert (REPO / path).is_file() and path in EXAMPLES_RUN, (key, how)


def is_part(part: Any, whole: Any) -> bool:
    """`part` is `whole`, or (mappings) each of its keys is in `whole` with a value that is a part."""
    if isinstance(part, dict) and isinstance(whole, dict):
        return all(k in whole and is_part(v, whole[k]) for k, v in part.items())
    return bool(part == whole)


def test_shipped_examples_hold_the_blocks_shown() -> None:
    for (page, n), how in HOW.items():
        kind, _, path = how.partition(":")
        b = block(page, n)
        if kind == "file":
            # The page includes the file (a snippet), or shows its code after its docstring.
            assert b.snippet == path or b.text.strip() in (REPO / path).read_text(), (page, n)
        elif kind == "part":
            assert is_part(yaml.safe_load(b.text), yaml.safe_load((REPO / path).read_text())), (page, n)
        elif kind == "gpu":
            # Marked where a reader sees it, just before the block, naming its CPU twin.
            assert marked_gpu(b, path), (page, n, b.before[-600:])
            spec = JobSpec.model_validate(yaml.safe_load(b.text))
            assert spec.resources.device == "cuda"
            twin = JobSpec.model_validate(yaml.safe_load((REPO / path).read_text()))
            assert twin.resources.device == "cpu" and twin.training.method == spec.training.method


def test_the_catalog_and_the_tracker_sections_are_read_as_the_server_reads_them(tmp_path: Path) -> None:
    from service.openai.models import catalog

    b = block("docs/openai.md", 1)
    assert marked_gpu(b, "examples/openai/catalog-cpu.yaml"), b.before[-600:]
    for name, text in (("gpu", b.text), ("cpu", (REPO / "examples/openai/catalog-cpu.yaml").read_text())):
        (tmp_path / f"{name}.yaml").write_text(text)
        loaded = catalog(str(tmp_path / f"{name}.yaml"))
        for template in loaded.templates.values():
            # A template, a dataset and the epochs (as a /v1 create adds them) make a job spec.
            training = {**template.get("training", {}), "num_train_epochs": 1}
            JobSpec.model_validate(
                {**template, "training": training, "dataset": {"name_or_path": "./d.jsonl"}}
            )
    assert catalog(str(tmp_path / "cpu.yaml")).templates["ftq-tiny"] == catalog("").templates["ftq-tiny"]
    IntegrationsSpec.model_validate(yaml.safe_load(block("docs/trackers.md", 0).text)["integrations"])


def test_the_webhook_check_takes_ftqs_signature_and_refuses_a_changed_body() -> None:
    scope: dict[str, Any] = {}
    exec(block("docs/events.md", 0).text, scope)
    secret, body = "whsec_" + "c2VjcmV0LWtleS1vZi10aGUtZW5kcG9pbnQ=", b'{"type": "job.succeeded"}'
    headers = {"webhook-id": "evt_7", "webhook-timestamp": "1700000000"}
    headers["webhook-signature"] = sign(secret, "evt_7", 1700000000, body)
    assert scope["from_ftq"](secret, headers, body) is True
    assert scope["from_ftq"](secret, headers, body + b" ") is False


# The runs -----------------------------------------------------------------------------------------------


@dataclass
class Ran:
    out: dict[str, subprocess.CompletedProcess[str]]
    seconds: float


def _python(code: str, url: str) -> list[str]:
    return [sys.executable, "-c", code.replace(QUICK_START_URL, url)]


def _job_id(text: str) -> str:
    match = re.search(r"submitted (job_[0-9a-f]+)", text)
    assert match, text
    return match.group(1)


@pytest.fixture(scope="module")
def ran(server: Deployment) -> Iterator[Ran]:
    """Every example that trains, started together against the session's server, to its end."""
    commands: dict[str, list[str]] = {
        "README.md": _python(block("README.md", 0).text, server.url),
        "openai": _python(block("docs/openai.md", 0).text, server.url),
        "graders": _python(block("docs/graders.md", 0).text, server.url),
        "sdk_tool": [sys.executable, str(REPO / "examples" / "sdk_tool.py")],
        "grpo": [FTQ, "submit", "examples/grpo/tiny-grpo-cpu.yaml", "--follow"],
        "eval": [FTQ, "submit", "examples/eval/tiny-eval-cpu.yaml", "--follow"],
    }
    env = clean_env(FTQ_URL=server.url)
    start = time.monotonic()
    procs = {
        name: subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, argv in commands.items()
    }
    out: dict[str, subprocess.CompletedProcess[str]] = {}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        out[name] = subprocess.CompletedProcess(commands[name], proc.returncode, text)
    # The evaluation page's next command: the scores of checkpoint 2 and final/.
    evals = [FTQ, "evals", _job_id(out["eval"].stdout), "--follow"]
    done = subprocess.run(evals, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out["evals"] = subprocess.CompletedProcess(evals, done.returncode, done.stdout + done.stderr)
    yield Ran(out, time.monotonic() - start)


def ok(ran: Ran, name: str) -> str:
    result = ran.out[name]
    assert result.returncode == 0, f"{name} exited {result.returncode}:\n{result.stdout[-4000:]}"
    return str(result.stdout)


def test_the_readme_and_sdk_examples_train_the_tiny_job(ran: Ran) -> None:
    status, losses = ok(ran, "README.md").strip().splitlines()[-1].split(" ", 1)
    assert status == "succeeded" and float(losses) > 0
    assert re.search(r"job_[0-9a-f]+ succeeded: loss [\d.]+ -> [\d.]+ over 40 steps", ok(ran, "sdk_tool"))


def test_the_openai_example_fine_tunes_and_prints_its_result_file(ran: Ran) -> None:
    text = ok(ran, "openai")
    assert re.search(r"^succeeded ft:ftq-tiny:[^:]+:support-bot:[0-9a-f]+$", text, re.M), text
    csv_lines = text[text.index("step,train_loss") :].strip().splitlines()
    assert [int(line.split(",")[0]) for line in csv_lines[1:]] == list(range(1, 9)), text


def test_the_graders_example_scores_paris(ran: Ran) -> None:
    assert ok(ran, "graders").splitlines()[0].startswith("1.0 "), ran.out["graders"].stdout


def test_the_grpo_twin_trains_and_shows_its_last_step(ran: Ran) -> None:
    text = ok(ran, "grpo")
    # 2 steps under the default logging_steps (10): the last step is logged, so the follow ends at 2/2.
    assert re.search(r"succeeded at step 2, final loss", text), text[-3000:]
    assert "step 2/2" in text, text[-3000:]


def test_the_evaluation_twin_scores_its_checkpoint_and_final(ran: Ran) -> None:
    ok(ran, "eval")
    text = ok(ran, "evals")
    assert text.count(": succeeded ") == 2 and "checkpoint 2" in text and "final/" in text, text
    for metric in ("qa/score", "bench/tiny_mc/acc", "held/loss"):
        assert text.count(metric) == 2, text


def test_the_cli_lines_of_the_graders_page_run(server: Deployment) -> None:
    # Cheap, so the page's two shell lines run too (bin/ftq, from the checkout).
    page = (REPO / "docs" / "graders.md").read_text()
    lines = re.search(r"```bash\n(.*?)```", page, re.S)
    assert lines
    for line in lines.group(1).strip().splitlines():
        argv = line.split("#", 1)[0].split()
        argv = [a.strip('"') for a in argv]
        assert argv[0] == "bin/ftq"
        done = subprocess.run(
            [str(REPO / argv[0]), *argv[1:]],
            cwd=REPO,
            env=clean_env(FTQ_URL=server.url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.split()[:2] in (["reward", "1"], ["valid"]), done.stdout


def test_the_suite_dataset_of_the_docs_is_a_graders_row_format() -> None:
    # The graders dataset the evaluation page names gives every row a prompt (checked at submit too).
    from ftq.contract.datasets import suite_prompt

    for line in (REPO / "examples" / "evaluation" / "qa.jsonl").read_text().splitlines():
        prompt, why = suite_prompt(json.loads(line))
        assert prompt is not None, why
