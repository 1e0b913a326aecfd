"""service/jobs/preflight.py in process: the deadline on a preflight's file work, and what a local
dataset or model path may be (a FIFO, a sparse gigabyte or a wrong format is named, at once)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from ftq.contract.spec import DatasetFormat, DatasetSpec, JobSpec, TrainingSpec
from ftq.planning.estimate import local_model_problem
from ftq.runtime.settings import Settings
from service.errors import SpecError
from service.jobs.preflight import (
    Deadline,
    chat_template_problem,
    local_dataset_problem,
    missing_dataset_field,
    pool_refusals,
    tool_calls_problem,
)

GiB = 1024**3


def sparse(path: Path, size: int = GiB) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_the_deadline_answers_while_the_file_work_hangs() -> None:
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(SpecError) as err:
        Deadline(0.3).run(lambda: release.wait(30))
    assert time.monotonic() - t0 < 5
    assert err.value.errors[0]["type"] == "preflight_timeout"
    assert "FTQ_PREFLIGHT_TIMEOUT_SECONDS=0.3" in err.value.errors[0]["msg"]
    # The deadline is the request's: one step that used it up leaves none for the next.
    deadline = Deadline(0.3)
    with pytest.raises(SpecError):
        deadline.run(lambda: release.wait(30))
    with pytest.raises(SpecError):
        deadline.run(lambda: 1)
    release.set()
    assert Deadline(5).run(lambda: 42) == 42


def test_dataset_files_that_cannot_be_what_their_suffix_says(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.jsonl")
    assert "FIFO" in (local_dataset_problem(str(tmp_path / "fifo.jsonl")) or "")
    assert "starts with byte 0x00" in (local_dataset_problem(str(sparse(tmp_path / "big.jsonl"))) or "")
    assert "not a parquet file" in (local_dataset_problem(str(sparse(tmp_path / "big.parquet"))) or "")
    assert "NUL" in (local_dataset_problem(str(sparse(tmp_path / "big.csv"))) or "")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert "empty" in (local_dataset_problem(str(tmp_path / "empty.jsonl")) or "")
    (tmp_path / "list.jsonl").write_text('["a"]\n')
    assert "not JSON Lines" in (local_dataset_problem(str(tmp_path / "list.jsonl")) or "")


def test_datasets_that_are_fine(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_bytes(b"\xef\xbb\xbf\n  " + json.dumps({"text": "hi"}).encode() + b"\n")
    (tmp_path / "train.json").write_text('[{"text": "hi"}]')
    (tmp_path / "train.csv").write_text("text\nhi\n")
    (tmp_path / "t.parquet").write_bytes(b"PAR1" + b"\x00" * 100 + b"PAR1")
    (tmp_path / "folder").mkdir()
    for name in ("train.jsonl", "train.json", "train.csv", "t.parquet", "folder"):
        assert local_dataset_problem(str(tmp_path / name)) is None, name
    assert local_dataset_problem("org/hub-dataset") is None


def test_model_folders_whose_config_is_not_a_small_regular_file(tmp_path: Path) -> None:
    def folder(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"")
        return d

    os.mkfifo(folder("fifo") / "config.json")
    assert "FIFO" in (local_model_problem(str(tmp_path / "fifo")) or "")
    sparse(folder("big") / "config.json")
    assert "1.0 GiB, more than the 1.0 MiB" in (local_model_problem(str(tmp_path / "big")) or "")
    over = folder("over") / "config.json"
    over.write_text(json.dumps({"model_type": "llama", "pad": "x" * 1024**2}))
    assert "more than the 1.0 MiB" in (local_model_problem(str(tmp_path / "over")) or "")
    assert local_model_problem(str(tmp_path / "over"), max_config_bytes=2 * 1024**2) is None
    os.mkfifo(tmp_path / "model-fifo")
    assert "not a model folder (it is a FIFO)" in (local_model_problem(str(tmp_path / "model-fifo")) or "")
    assert "not a model folder (it is a file)" in (local_model_problem(str(sparse(tmp_path / "m.bin"))) or "")


def test_a_node_without_the_host_ram_for_every_ranks_copy_is_refused(tmp_path: Path) -> None:
    """FSDP without RAM-efficient loading: each of 8 ranks reads Llama 2 70B in float32 (2 TiB); a node
    of 1 TiB is refused with the change that loads it once per node, which trains the same job."""
    import yaml

    from ftq.contract.spec import JobSpec
    from ftq.runtime.settings import Settings
    from service.jobs.preflight import preflight
    from tests.harness import EXAMPLES, model_config

    model = tmp_path / "llama-2-70b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(model_config("llama-2-70b-hf")))
    (model / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    body = yaml.safe_load((EXAMPLES / "llama2-70b-fsdp.yaml").read_text())
    body["model"]["name_or_path"] = str(model)
    body["distributed"]["fsdp"]["cpu_ram_efficient_loading"] = False
    body["training"]["save_steps"] = None
    spec = JobSpec.model_validate(body)
    settings = Settings(data_dir=tmp_path / "data", node_memory_gb=1024)
    estimate, refusals = preflight(spec, settings, "alice", Deadline(10))
    assert estimate.host_fits is False and estimate.fits is False
    (msg,) = [r["msg"] for r in refusals if r["loc"] == ["body", "resources"]]
    assert "of host RAM per node does not fit 1024 GiB (FTQ_NODE_MEMORY_GB; most of it: loading)" in msg
    assert "it would fit with distributed.fsdp.cpu_ram_efficient_loading: true" in msg
    # Loaded once per node, the same job fits the same node.
    body["distributed"]["fsdp"]["cpu_ram_efficient_loading"] = True
    estimate, refusals = preflight(JobSpec.model_validate(body), settings, "alice", Deadline(10))
    assert estimate.fits is True and estimate.host_fits is True
    assert [r for r in refusals if r["loc"] == ["body", "resources"]] == []  # (its 257 GiB final/ may not)
    # allow_oversubscribe launches past the GPU estimate, but past the node's RAM only for owners the
    # operator names: an OOM-killed node takes other jobs down with it.
    body["distributed"]["fsdp"]["cpu_ram_efficient_loading"] = False
    body["allow_oversubscribe"] = True
    _, refusals = preflight(JobSpec.model_validate(body), settings, "alice", Deadline(10))
    (msg,) = [r["msg"] for r in refusals if r["loc"] == ["body", "resources"]]
    assert "does not skip this check on this server: FTQ_ALLOW_OVERSUBSCRIBE" in msg
    trusted = Settings(data_dir=tmp_path / "data", node_memory_gb=1024, allow_oversubscribe="alice")
    _, refusals = preflight(JobSpec.model_validate(body), trusted, "alice", Deadline(10))
    assert [r for r in refusals if r["loc"] == ["body", "resources"]] == []


def test_local_gpu_jobs_on_a_server_without_gpus_are_named_with_the_fix() -> None:
    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": "org/model"},
            "dataset": {"name_or_path": "org/data"},
            "training": {"max_steps": 1},
            "resources": {"launcher": "local", "device": "cuda", "processes_per_node": 1},
        }
    )
    (refusal,) = pool_refusals(spec, Settings(gpu_pool=""))
    assert refusal["loc"] == ["body", "resources", "device"]
    assert "no GPUs" in refusal["msg"] and "device: cpu" in refusal["msg"]
    assert pool_refusals(spec, Settings(gpu_pool="0")) == []
    cpu = spec.model_copy(update={"resources": spec.resources.model_copy(update={"device": "cpu"})})
    assert pool_refusals(cpu, Settings(gpu_pool="")) == []


def test_the_dataset_field_is_looked_for_as_the_trainer_picks_it(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "p", "messages": []}) + "\n")
    auto = DatasetSpec(name_or_path=str(rows))
    assert missing_dataset_field(auto) is None  # auto: a messages column makes it chat data
    text = DatasetSpec(name_or_path=str(rows), format=DatasetFormat.text)
    loc, msg = missing_dataset_field(text) or ((), "")
    assert loc == ("dataset", "text_field") and "prompt, messages" in msg


def training(**fields: object) -> TrainingSpec:
    return TrainingSpec.model_validate({"max_steps": 1, **fields})


def jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_preference_method_on_text_rows_names_the_method_and_the_missing_columns(tmp_path: Path) -> None:
    rows = jsonl(tmp_path / "text.jsonl", [{"text": "one two"}, {"text": "three"}])
    dpo = training(method="dpo")
    loc, msg = missing_dataset_field(DatasetSpec(name_or_path=str(rows)), dpo) or ((), "")
    assert loc == ("training", "method")
    assert "chosen, rejected" in msg and "fields found: text" in msg and "suit training.method sft" in msg
    given = DatasetSpec(name_or_path=str(rows), format=DatasetFormat.preference)
    loc, msg = missing_dataset_field(given, dpo) or ((), "")
    assert loc == ("dataset", "format") and "dataset.format preference" in msg
    kto = training(method="kto", per_device_train_batch_size=2)
    loc, msg = missing_dataset_field(DatasetSpec(name_or_path=str(rows)), kto) or ((), "")
    assert loc == ("training", "method") and "prompt, completion, label" in msg


def test_the_method_s_columns_pass(tiny_dir: Path) -> None:
    cases = {
        "preference/train.jsonl": training(method="dpo"),
        "preference_chat/train.jsonl": training(method="reward"),
        "unpaired/train.jsonl": training(method="kto", per_device_train_batch_size=2),
        "prompt_completion/train.jsonl": training(loss_on="completion"),
        "chat/train.jsonl": training(loss_on="assistant"),
        "data/train.jsonl": training(),
    }
    for name, method in cases.items():
        assert missing_dataset_field(DatasetSpec(name_or_path=str(tiny_dir / name)), method) is None, name


def test_loss_on_needs_rows_it_can_mask(tiny_dir: Path) -> None:
    text = DatasetSpec(name_or_path=str(tiny_dir / "data" / "train.jsonl"))
    loc, msg = missing_dataset_field(text, training(loss_on="completion")) or ((), "")
    assert loc == ("training", "loss_on") and "prompt_completion" in msg and "are text" in msg
    chat = DatasetSpec(name_or_path=str(tiny_dir / "chat" / "train.jsonl"))
    loc, _ = missing_dataset_field(chat, training(loss_on="completion")) or ((), "")
    assert loc == ("training", "loss_on")


def test_assistant_only_loss_on_a_local_tokenizer_without_a_chat_template(
    tmp_path: Path, tiny_dir: Path
) -> None:
    def job(model: Path) -> JobSpec:
        return JobSpec.model_validate(
            {
                "model": {"name_or_path": str(model)},
                "dataset": {"name_or_path": str(tiny_dir / "chat" / "train.jsonl")},
                "training": {"max_steps": 1, "loss_on": "assistant"},
            }
        )

    assert chat_template_problem(job(tiny_dir / "model")) is None
    # A template without generation markers may be one TRL rewrites: the trainer decides (not a 422).
    assert chat_template_problem(job(tiny_dir / "model-plain-template")) is None
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    (bare / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    problem = chat_template_problem(job(bare)) or ""
    assert "no chat template" in problem and "{% generation %}" in problem and "loss_on: all" in problem


def test_tool_calls_a_local_chat_template_cannot_render_are_refused_naming_the_line(
    tiny_dir: Path, tmp_path: Path
) -> None:
    import shutil

    call = {"id": "c1", "type": "function", "function": {"name": "count", "arguments": "{}"}}
    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    with_call = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]}
    rows = tmp_path / "chat.jsonl"
    rows.write_text("\n".join([json.dumps(plain), "", json.dumps(with_call)]) + "\n")

    def spec(model: Path) -> JobSpec:
        return JobSpec.model_validate(
            {
                "model": {"name_or_path": str(model)},
                "dataset": {"name_or_path": str(rows)},
                "training": {"max_steps": 1, "mixed_precision": "no"},
                "resources": {"device": "cpu"},
            }
        )

    problem = tool_calls_problem(spec(tiny_dir / "model"))  # the tiny template renders no tool calls
    assert problem == (
        f"line 3 of {rows}: the chat template of {tiny_dir / 'model'} cannot render tool_calls; use a model "
        "whose chat template renders tool calls, or leave them out"
    )
    rows.write_text(json.dumps(plain) + "\n")
    assert tool_calls_problem(spec(tiny_dir / "model")) is None
    # A template that renders tool calls takes them.
    rows.write_text(json.dumps(with_call) + "\n")
    model = tmp_path / "model"
    shutil.copytree(tiny_dir / "model", model, ignore=shutil.ignore_patterns("*.safetensors"))
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
        "{% endfor %}"
    )
    assert tool_calls_problem(spec(model)) is None
