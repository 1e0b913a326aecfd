"""The fetch step (trainer/fetch.py) through the rendered launch.sh, against a fake Hub on loopback
(tests/harness/fakehub.py, as HF_ENDPOINT): a hub model and a hub dataset are downloaded once with the
operator's token into the shared cache before any rank starts, the ranks then train from that cache
offline, and the token is in no file of the run directory; a gated repo fails at the fetch with
model_error, no rank started; a missing dataset repo fails at the fetch with dataset_error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ftq.contract import progress, runs
from ftq.contract.spec import JobSpec
from ftq.planning.render import render_plan
from ftq.runtime.settings import Settings
from tests.harness import REPO, free_port, tiny_spec
from tests.harness.fakehub import SHA, FakeHub, fake_hub
from worker.launchers.base import LaunchRequest, add_run_environment, launch_environment

TOKEN = "hf_operator_token_fetch_test"


def _launch(
    hub: FakeHub, tiny_dir: Path, tmp_path: Path, repo: str, dataset: str | None = None
) -> tuple[Path, int]:
    """Render the job for `repo` (and the hub `dataset`) as the worker does, write its files, run
    launch.sh; (run dir, status)."""
    body = tiny_spec(tiny_dir, max_steps=1)
    body["model"]["name_or_path"] = repo
    if dataset is not None:
        body["dataset"]["name_or_path"] = dataset
    spec = JobSpec.model_validate(body)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    settings = Settings(
        python=sys.executable,
        hub_token=TOKEN,
        hub_cache=tmp_path / "shared-cache",
        data_dir=tmp_path / "data",
    )
    plan = render_plan(
        spec, job_id="fetch", run_dir=run_dir, settings=settings, main_process_port=free_port()
    )
    (run_dir / runs.SPEC).write_text(spec.model_dump_json())
    (run_dir / runs.ACCELERATE_CONFIG).write_text(plan.accelerate_config_yaml)
    (run_dir / runs.LAUNCH_SCRIPT).write_text(plan.launch_script)
    (run_dir / "plan.json").write_text(plan.model_dump_json())
    req = LaunchRequest(job_id="fetch", run_dir=run_dir, spec=spec, plan=plan, env={"HF_ENDPOINT": hub.url})
    env = launch_environment(settings)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME"):
        env.pop(name, None)
    env["HF_HOME"] = str(tmp_path / "hf-home")  # no other cache to fall back on
    add_run_environment(env, settings, req)
    assert env["HF_TOKEN"] == TOKEN and env["HF_HUB_CACHE"] == str(tmp_path / "shared-cache")
    proc = subprocess.run(["bash", runs.LAUNCH_SCRIPT], cwd=run_dir, env=env, timeout=600, check=False)
    return run_dir, proc.returncode


def _files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def _hub_dataset_repo(tiny_dir: Path, folder: Path) -> Path:
    """The tiny text rows laid out as a Hub dataset repo: a card and data/<split>-NNNNN-of-NNNNN.jsonl,
    whose splits datasets infers from the file names."""
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text("# Tiny text rows\n")
    shutil.copy(tiny_dir / "data" / "train.jsonl", folder / "data" / "train-00000-of-00001.jsonl")
    return folder


@pytest.mark.slow
def test_a_hub_model_is_fetched_once_then_trained_offline(tiny_dir: Path, tmp_path: Path) -> None:
    rows = _hub_dataset_repo(tiny_dir, tmp_path / "rows-repo")
    with fake_hub({"owner/tiny": tiny_dir / "model"}, datasets={"owner/rows": rows}) as hub:
        run_dir, status = _launch(hub, tiny_dir, tmp_path, "owner/tiny", dataset="owner/rows")
    log = (run_dir / runs.TRAIN_LOG).read_text()
    assert status == 0, log[-3000:]
    total = sum(p.stat().st_size for p in (tiny_dir / "model").iterdir() if p.is_file())
    assert f"fetching owner/tiny: {total} of {total} bytes" in log
    snapshot = tmp_path / "shared-cache" / "models--owner--tiny" / "snapshots" / SHA
    assert (snapshot / "config.json").is_file() and (snapshot / "model.safetensors").is_file()
    data_total = sum(p.stat().st_size for p in rows.rglob("*") if p.is_file())
    assert f"fetching owner/rows: {data_total} of {data_total} bytes" in log
    # The service reads the fetch's progress from its records (progress.jsonl), not from those lines.
    fetched = [progress.parse(line) for line in (run_dir / runs.PROGRESS).read_text().splitlines()]
    ends = {r.repo: (r.done_bytes, r.total_bytes) for r in fetched if r is not None and r.phase == "fetching"}
    assert ends == {"owner/tiny": (total, total), "owner/rows": (data_total, data_total)}, fetched
    data_snapshot = tmp_path / "shared-cache" / "datasets--owner--rows" / "snapshots" / SHA
    assert (data_snapshot / "data" / "train-00000-of-00001.jsonl").is_file()
    # The fetch asked with the operator's token; the ranks asked nothing (HF_HUB_OFFLINE=1): each file
    # was asked for once (by the fetch), and the only metadata requests are the fetch's two per repo.
    assert f"Bearer {TOKEN}" in hub.authorizations
    files = [p for p in hub.paths if "/resolve/" in p]
    n = len([p for p in (tiny_dir / "model").iterdir() if p.is_file()])
    n_data = len([p for p in rows.rglob("*") if p.is_file()])
    assert len(set(files)) == len(files) == 2 * (n + n_data), hub.paths  # one HEAD and one GET each
    assert len([p for p in files if " /datasets/owner/rows/resolve/" in p]) == 2 * n_data, hub.paths
    assert len([p for p in hub.paths if "/api/models/" in p]) == 2, hub.paths
    assert len([p for p in hub.paths if "/api/datasets/owner/rows" in p]) == 2, hub.paths
    assert (run_dir / runs.FINAL).is_dir()
    # Nowhere in the run directory: train.log, launch.sh, spec.json, the plan, final/ ...
    assert _files_holding(run_dir, TOKEN) == []
    assert json.loads((run_dir / runs.SPEC).read_text())["model"]["name_or_path"] == "owner/tiny"


def test_a_gated_repo_fails_at_the_fetch_with_model_error(tiny_dir: Path, tmp_path: Path) -> None:
    with fake_hub({}, gated={"owner/gated"}) as hub:
        run_dir, status = _launch(hub, tiny_dir, tmp_path, "owner/gated")
    log = (run_dir / runs.TRAIN_LOG).read_text()
    assert status == 2, log[-3000:]
    assert (run_dir / runs.EXIT_STATUS).read_text().strip() == "2"
    (line,) = [x for x in log.splitlines() if x.startswith("ftq-error: ")]
    assert line.startswith("ftq-error: model_error: model owner/gated is gated")
    assert "FTQ_HF_TOKEN" in line and "https://huggingface.co/owner/gated" in line
    assert "accelerate" not in log and "strategy" not in log  # no rank started
    assert _files_holding(run_dir, TOKEN) == []


def test_a_missing_hub_dataset_fails_at_the_fetch_with_dataset_error(tiny_dir: Path, tmp_path: Path) -> None:
    """The fetch step alone (no launch): a dataset repo the Hub does not have ends it with dataset_error
    naming the repo and the field to fix; the local model is not fetched."""
    body = tiny_spec(tiny_dir, max_steps=1)
    body["dataset"]["name_or_path"] = "owner/missing-rows"
    (tmp_path / runs.SPEC).write_text(JobSpec.model_validate(body).model_dump_json())
    env = {n: v for n, v in os.environ.items() if not n.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf-home"))
    with fake_hub({}) as hub:
        env["HF_ENDPOINT"] = hub.url
        proc = subprocess.run(
            [sys.executable, "-m", "trainer.fetch", "--spec", runs.SPEC],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("ftq-error: ")]
    assert line.startswith("ftq-error: dataset_error: dataset owner/missing-rows was not found"), line
    assert "dataset.name_or_path" in line
    assert [p for p in hub.paths if "/api/models/" in p] == []  # the model is a local path
