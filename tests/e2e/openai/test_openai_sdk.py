"""An OpenAI fine-tuning workflow, written for OpenAI and run with the real `openai` SDK against one live
`ftq up` (issue 26), changing only `base_url`, `api_key` and `model`: upload (the job is created right
after, while the files are still being validated), create, wait, events, checkpoints, the result file,
the fine-tuned model in `models.list`, a DPO job, a cancel, and owners apart. Three tiny trainings (SFT
with a validation file, DPO, and a short SFT on chat rows with `weight: 0` turns) run side by side;
every read test shares them."""

from __future__ import annotations

import copy
import csv
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.fine_tuning import FineTuningJob

from service.openai.models import TINY_ALIAS, catalog
from tests.harness import QUICK_SETTINGS, Deployment, tiny_assets

# Two real tiny training runs (SFT and DPO) serve the module.
pytestmark = pytest.mark.slow

TOKENS = {"alice": "tok-alice-e2e", "bob": "tok-bob-e2e"}
TERMINAL = ("succeeded", "failed", "cancelled")
# The SFT job: 96 rows, 2 a step, 2 epochs. Small steps and many of them, so that a pause after step 2
# reaches a run with most of its training still to go.
SFT_ROWS, SFT_BATCH, SFT_EPOCHS = 96, 2, 2
SFT_STEPS_PER_EPOCH = SFT_ROWS // SFT_BATCH
SFT_STEPS = SFT_STEPS_PER_EPOCH * SFT_EPOCHS
BUILT_IN = catalog("").templates


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tiny_assets()
    root = tmp_path_factory.mktemp("openai")
    # The operator's catalog (FTQ_OPENAI_MODELS): the built-in `ftq-tiny` on one process, as sharding is
    # not the point here (a second rank would add its start-up to each of the module's five runs).
    template = copy.deepcopy(BUILT_IN[TINY_ALIAS])
    template["resources"]["processes_per_node"] = 1
    catalog_file = root / "catalog.json"
    catalog_file.write_text(json.dumps({"default": TINY_ALIAS, "models": {TINY_ALIAS: template}}))
    settings = {**QUICK_SETTINGS, "openai_models": str(catalog_file)}
    with Deployment(root, mode="up", tokens=TOKENS, settings=settings) as d:
        yield d


def sdk(dep: Deployment, owner: str = "alice") -> openai.OpenAI:
    # The two lines that change for a pipeline written for OpenAI.
    return openai.OpenAI(base_url=f"{dep.url}/v1", api_key=TOKENS[owner])


def _lines(path: Path, n: int) -> io.BytesIO:
    return io.BytesIO(b"\n".join(path.read_bytes().splitlines()[:n]) + b"\n")


def _wait(client: openai.OpenAI, job_id: str, dep: Deployment, timeout: float = 900) -> FineTuningJob:
    deadline = time.monotonic() + timeout
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in TERMINAL:
            return job
        assert time.monotonic() < deadline, dep.report("job_" + job_id.removeprefix("ftjob-"))
        time.sleep(2)


@dataclass(frozen=True)
class Trained:
    sft: FineTuningJob
    dpo: FineTuningJob
    paused: FineTuningJob  # the SFT job as it was while paused
    weighted: FineTuningJob  # SFT on WEIGHTED_ROWS chat rows with `weight: 0` turns (issue 49)


# The weighted job: 8 chat rows, 2 a step, 1 epoch. Every assistant turn but a row's last has weight 0 (its
# last weight 1); every 4th row's answers all have weight 0 (nothing to learn: the trainer drops it).
WEIGHTED_ROWS, WEIGHTED_BATCH = 8, 2


def _weighted_chat(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()[:WEIGHTED_ROWS]]
    for i, row in enumerate(rows):
        answers = [m for m in row["messages"] if m["role"] == "assistant"]
        for m in answers:
            m["weight"] = 1 if m is answers[-1] and i % 4 != 3 else 0
    return rows


def _openai_preference(path: Path, n: int) -> io.BytesIO:
    """ftq's prompt/chosen/rejected rows in OpenAI's preference format."""
    out = []
    for line in path.read_text().splitlines()[:n]:
        row = json.loads(line)
        out.append(
            {
                "input": {"messages": [{"role": "user", "content": row["prompt"]}]},
                "preferred_output": [{"role": "assistant", "content": row["chosen"]}],
                "non_preferred_output": [{"role": "assistant", "content": row["rejected"]}],
            }
        )
    return io.BytesIO("".join(json.dumps(r) + "\n" for r in out).encode())


def _pause_and_resume(client: openai.OpenAI, job_id: str, dep: Deployment) -> FineTuningJob:
    """Pause the job after its first steps (most of its SFT_STEPS still to go, so that the pause reaches a
    running job), wait until it is paused, resume it."""
    native = "job_" + job_id.removeprefix("ftjob-")
    deadline = time.monotonic() + 600
    while (dep.http.get(f"/jobs/{native}").json()["progress"].get("step") or 0) < 2:
        assert time.monotonic() < deadline, dep.report(native)
        time.sleep(0.5)
    assert str(client.fine_tuning.jobs.pause(job_id).status) in ("running", "queued", "paused")
    # The pause is acknowledged (stored, the run told to stop) before the run has ended.
    progress = dep.http.get(f"/jobs/{native}").json()
    assert progress["status"] == "paused" or progress["progress"].get("phase") == "pausing", progress
    while str((job := client.fine_tuning.jobs.retrieve(job_id)).status) != "paused":
        assert job.status not in TERMINAL and time.monotonic() < deadline, dep.report(native)
        time.sleep(1)
    assert client.fine_tuning.jobs.resume(job_id).status in ("queued", "running")
    return job


@pytest.fixture(scope="module")
def trained(dep: Deployment, tiny_dir: Path) -> Trained:
    client = sdk(dep)
    train = client.files.create(
        file=("train.jsonl", _lines(tiny_dir / "chat" / "train.jsonl", SFT_ROWS)), purpose="fine-tune"
    )
    valid = client.files.create(
        file=("valid.jsonl", _lines(tiny_dir / "chat" / "eval.jsonl", 16)), purpose="fine-tune"
    )
    sft = client.fine_tuning.jobs.create(
        model="ftq-tiny",
        training_file=train.id,
        validation_file=valid.id,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": SFT_EPOCHS, "batch_size": SFT_BATCH}},
        },
        suffix="tiny",
        seed=11,
        metadata={"pipeline": "e2e"},
    )
    # DPO on a file in OpenAI's own preference format (input / preferred_output / non_preferred_output).
    prefs = client.files.create(
        file=("prefs.jsonl", _openai_preference(tiny_dir / "preference" / "train.jsonl", 64)),
        purpose="fine-tune",
    )
    dpo = client.fine_tuning.jobs.create(
        model="ftq-tiny",
        training_file=prefs.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 1, "batch_size": 8, "beta": 0.2}}},
    )
    chat = b"".join(json.dumps(r).encode() + b"\n" for r in _weighted_chat(tiny_dir / "chat" / "train.jsonl"))
    weighted = client.fine_tuning.jobs.create(
        model="ftq-tiny",
        training_file=client.files.create(file=("weighted.jsonl", chat), purpose="fine-tune").id,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": WEIGHTED_BATCH}},
        },
    )
    paused = _pause_and_resume(client, sft.id, dep)
    return Trained(
        sft=_wait(client, sft.id, dep),
        dpo=_wait(client, dpo.id, dep),
        paused=paused,
        weighted=_wait(client, weighted.id, dep),
    )


def test_the_sft_job_succeeds_with_openai_fields(dep: Deployment, trained: Trained) -> None:
    job = trained.sft
    assert job.status == "succeeded", dep.report("job_" + job.id.removeprefix("ftjob-"))
    assert job.fine_tuned_model == f"ft:ftq-tiny:alice:tiny:{job.id.removeprefix('ftjob-')}"
    assert job.finished_at is not None and job.finished_at >= job.created_at
    assert job.trained_tokens and job.trained_tokens > 0
    assert job.hyperparameters.n_epochs == SFT_EPOCHS and job.hyperparameters.batch_size == SFT_BATCH
    assert job.seed == 11 and job.metadata == {"pipeline": "e2e"}
    assert job.result_files and job.training_file.startswith("file-")
    assert job.fine_tuned_model in [m.id for m in sdk(dep).models.list()]
    # An ordinary ftq job underneath.
    native = dep.http.get(f"/jobs/job_{job.id.removeprefix('ftjob-')}").json()
    assert native["status"] == "succeeded" and native["spec"]["training"]["num_train_epochs"] == SFT_EPOCHS
    # Like OpenAI's, the loss of a chat file covers the assistant turns only (less those with weight 0).
    assert native["spec"]["training"]["loss_on"] == "assistant"


def test_a_chat_file_with_weight_0_turns_trains_on_the_other_turns(
    dep: Deployment, trained: Trained, tiny_dir: Path
) -> None:
    """Issue 49: OpenAI's per-message `weight` (0: context, not learned). The job failed with `unknown`
    (TRL refused ftq's tokenized rows under loss_on assistant); it succeeds, the weight-0 turns left out
    of the loss and the rows with nothing to learn dropped, as train.log counts them."""
    job = trained.weighted
    native = "job_" + job.id.removeprefix("ftjob-")
    assert job.status == "succeeded", dep.report(native)
    rows = _weighted_chat(tiny_dir / "chat" / "train.jsonl")
    zero = sum(m.get("weight") == 0 for r in rows for m in r["messages"])
    dropped = sum(
        all(m.get("weight", 1) == 0 for m in r["messages"] if m["role"] == "assistant") for r in rows
    )
    assert (zero, dropped) == (11, 2)
    log = dep.train_log(native)
    assert (
        f"OpenAI chat rows: {zero} assistant turn(s) with weight 0 left out of the loss; "
        f"{dropped} row(s) with nothing to learn dropped" in log
    ), log[-3000:]
    assert dep.http.get(f"/jobs/{native}").json()["spec"]["training"]["loss_on"] == "assistant"
    steps = [
        cast(dict[str, Any], e.data)["step"]
        for e in sdk(dep).fine_tuning.jobs.list_events(job.id)
        if e.type == "metrics"
    ]
    # The 6 rows left, 2 a step.
    assert max(steps) == (WEIGHTED_ROWS - dropped) // WEIGHTED_BATCH and job.trained_tokens


def test_events_walk_every_page_newest_first_with_metrics(dep: Deployment, trained: Trained) -> None:
    events = list(sdk(dep).fine_tuning.jobs.list_events(trained.sft.id, limit=5))
    assert len({e.id for e in events}) == len(events) > 10
    assert [e.created_at for e in events] == sorted((e.created_at for e in events), reverse=True)
    assert events[0].message == "The job has successfully completed"
    assert events[-1].message == "Created fine-tuning job"
    metrics = [cast(dict[str, Any], e.data) for e in events if e.type == "metrics"]
    steps = [data["step"] for data in metrics]
    assert steps == sorted(steps, reverse=True) and max(steps) == SFT_STEPS
    # Every training step's loss and learning rate (the last point may be the final evaluation alone).
    assert all("train_loss" in d and "learning_rate" in d for d in metrics if d["step"] != SFT_STEPS)
    assert any("valid_loss" in d for d in metrics)


def test_checkpoints_carry_openai_metric_names(dep: Deployment, trained: Trained) -> None:
    ckpts = list(sdk(dep).fine_tuning.jobs.checkpoints.list(trained.sft.id, limit=1))
    # One per epoch, newest first, and the one the pause saved (before or after the first epoch's end,
    # as the pause happened to reach the run).
    steps = [c.step_number for c in ckpts]
    epochs = {SFT_STEPS_PER_EPOCH, SFT_STEPS}
    assert steps == sorted(steps, reverse=True) and steps[0] == SFT_STEPS and epochs <= set(steps)
    assert len(steps) <= 3 and len(set(steps)) == len(steps)
    for c in ckpts:
        assert c.fine_tuned_model_checkpoint == f"{trained.sft.fine_tuned_model}:ckpt-step-{c.step_number}"
        assert c.metrics.train_loss is not None
        if c.step_number in epochs:  # the epochs' checkpoints were evaluated
            assert c.metrics.valid_loss is not None and c.metrics.full_valid_loss == c.metrics.valid_loss


def test_a_paused_job_resumes_from_its_checkpoint_and_succeeds(dep: Deployment, trained: Trained) -> None:
    assert str(trained.paused.status) == "paused" and trained.paused.finished_at is None
    assert trained.sft.status == "succeeded"
    # Every step up to the end is there: the resumed run went on to the last step after the pause.
    steps = [
        cast(dict[str, Any], e.data)["step"]
        for e in sdk(dep).fine_tuning.jobs.list_events(trained.sft.id)
        if e.type == "metrics"
    ]
    paused_at = [
        cast(dict[str, Any], e.data).get("step")
        for e in sdk(dep).fine_tuning.jobs.list_events(trained.sft.id)
        if e.type == "message" and cast(dict[str, Any], e.data).get("ftq_type") == "job.paused"
    ]
    assert len(paused_at) == 1 and paused_at[0] is not None and 2 <= paused_at[0] < SFT_STEPS, paused_at
    assert max(steps) == SFT_STEPS and any(s > paused_at[0] for s in steps)


def test_the_result_file_is_openai_csv(dep: Deployment, trained: Trained) -> None:
    client = sdk(dep)
    result_id = trained.sft.result_files[0]
    assert client.files.retrieve(result_id).purpose == "fine-tune-results"
    rows = list(csv.DictReader(io.StringIO(client.files.content(result_id).text)))
    assert list(rows[0]) == [
        "step",
        "train_loss",
        "train_accuracy",
        "valid_loss",
        "valid_mean_token_accuracy",
    ]
    assert [int(r["step"]) for r in rows] == sorted(int(r["step"]) for r in rows)
    assert any(r["valid_loss"] for r in rows) and all(r["train_loss"] for r in rows[:-1])


def test_a_dpo_job_trains_with_its_beta(dep: Deployment, trained: Trained) -> None:
    job = trained.dpo
    assert job.status == "succeeded", dep.report("job_" + job.id.removeprefix("ftjob-"))
    assert job.method is not None and job.method.type == "dpo"
    assert job.method.dpo is not None and job.method.dpo.hyperparameters is not None
    assert job.method.dpo.hyperparameters.beta == 0.2
    native = dep.http.get(f"/jobs/job_{job.id.removeprefix('ftjob-')}").json()
    assert native["spec"]["training"]["method"] == "dpo" and native["spec"]["training"]["dpo"]["beta"] == 0.2
    # It trained on OpenAI's preference rows, found by the file's format.
    upload = dep.http.get(f"/files/{native['spec']['dataset']['file_id']}").json()
    assert upload["formats"] == ["openai_preference"], upload


def test_cancel_and_owners_apart(dep: Deployment, trained: Trained, tiny_dir: Path) -> None:
    alice, bob = sdk(dep), sdk(dep, "bob")
    job = alice.fine_tuning.jobs.create(model="ftq-tiny", training_file=trained.sft.training_file)
    assert alice.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    assert _wait(alice, job.id, dep, timeout=120).status == "cancelled"
    listed = [j.id for j in alice.fine_tuning.jobs.list(limit=1)]
    assert (
        listed[:3] == [job.id, trained.weighted.id, trained.dpo.id]
        and trained.sft.id in listed
        and len(set(listed)) == len(listed)
    )

    for call in (
        lambda: bob.fine_tuning.jobs.retrieve(trained.sft.id),
        lambda: bob.fine_tuning.jobs.list_events(trained.sft.id),
        lambda: bob.files.content(trained.sft.result_files[0]),
        lambda: bob.files.retrieve(trained.sft.training_file),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert trained.sft.fine_tuned_model not in [m.id for m in bob.models.list()]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{dep.url}/v1", api_key="nope", max_retries=0).fine_tuning.jobs.list()


def _first_train_loss(client: openai.OpenAI, job_id: str) -> float:
    metrics = [cast(dict[str, Any], e.data) for e in client.fine_tuning.jobs.list_events(job_id)]
    return float(min((d for d in metrics if "train_loss" in d), key=lambda d: d["step"])["train_loss"])


def test_a_fine_tuned_model_goes_on_training_from_its_adapter(dep: Deployment, trained: Trained) -> None:
    """`model="ft:..."`: the SFT job's LoRA adapter trained further (a short run, 12 steps): it starts
    where the SFT job ended, not from the base model's loss."""
    client = sdk(dep)
    assert trained.sft.fine_tuned_model
    job = client.fine_tuning.jobs.create(
        model=trained.sft.fine_tuned_model,
        training_file=trained.sft.training_file,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 8}}},
    )
    native = "job_" + job.id.removeprefix("ftjob-")
    assert _wait(client, job.id, dep).status == "succeeded", dep.report(native)
    source = "job_" + trained.sft.id.removeprefix("ftjob-")
    spec = dep.http.get(f"/jobs/{native}").json()["spec"]
    assert spec["model"]["adapter"].endswith(f"/runs/{source}/final") and spec["lora"] is not None
    assert job.model == trained.sft.fine_tuned_model
    # The base model's first loss (the SFT job's) is well above where the adapter left it.
    assert _first_train_loss(client, job.id) < _first_train_loss(client, trained.sft.id) - 0.5


def test_a_reinforcement_job_with_a_string_check_grader_succeeds_with_reward_metrics(
    dep: Deployment, tiny_dir: Path
) -> None:
    """OpenAI's reinforcement method (GRPO here): rows up to the model's turn with a reference answer, a
    string_check grader; 4 steps of 1 prompt, 2 completions of it (compute_multiplier 0.25)."""
    client = sdk(dep)
    rows = [
        {"messages": [{"role": "user", "content": f"count from {w}."}], "answer": f"{w} two three."}
        for w in ("one", "two", "three", "four")
    ]
    train = client.files.create(
        file=("rl.jsonl", io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in rows))),
        purpose="fine-tune",
    )
    grader = {
        "type": "string_check",
        "name": "exact",
        "input": "{{sample.output_text}}",
        "reference": "{{item.answer}}",
        "operation": "eq",
    }
    job = client.fine_tuning.jobs.create(
        model="ftq-tiny",
        training_file=train.id,
        method={  # type: ignore[arg-type]
            "type": "reinforcement",
            "reinforcement": {
                "grader": grader,
                "hyperparameters": {"n_epochs": 1, "batch_size": 1, "compute_multiplier": 0.25},
            },
        },
    )
    done = _wait(client, job.id, dep)
    native = "job_" + job.id.removeprefix("ftjob-")
    assert done.status == "succeeded", dep.report(native)
    assert done.method is not None and done.method.type == "reinforcement"
    assert done.method.reinforcement is not None and done.method.reinforcement.grader.type == "string_check"
    metrics = [e for e in client.fine_tuning.jobs.list_events(job.id) if e.type == "metrics"]
    assert len(metrics) == 4, metrics
    for event in metrics:
        data = cast(dict[str, Any], event.data)
        assert data["train_reward_mean"] in (0.0, 0.5, 1.0) and "train_reward_exact_mean" in data, data
        assert "reward=" in event.message
    spec = dep.http.get(f"/jobs/{native}").json()["spec"]["training"]
    assert spec["method"] == "grpo" and spec["grpo"]["num_generations"] == 2
