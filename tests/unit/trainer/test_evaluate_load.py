"""How an evaluation loads what the job trained (trainer.evaluate.load_checkpoint, issue 49): on the GPUs it
was given (device_map="auto" over several, straight to one), a QLoRA job's base in 4 bits as training
loaded it, and FSDP's torch.distributed.checkpoint read straight into the model's own tensors in this
process (no merged copy in /tmp). No GPU here: the GPU decisions are checked on the arguments
from_pretrained gets; the CPU paths really load the tiny model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from tests.harness import REPO
from trainer import evaluate

MODEL = REPO / "examples" / "tiny" / "model"
QUANTIZATION = {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bf16"}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
ROWS = ["one two three four five six", "the black dog chases the cat", "alice has twelve apples"]


def spec(device: str = "cpu", lora: dict[str, Any] | None = None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": str(MODEL)},
            "dataset": {"name_or_path": "./d.jsonl"},
            "training": {"max_steps": 1},
            "resources": {"device": device},
            **({"lora": lora} if lora is not None else {}),
        }
    )


# Where and how: the decisions ---------------------------------------------------------------------------


def test_several_gpus_dispatch_the_weights_one_gpu_takes_them_directly_the_cpu_as_before() -> None:
    import torch

    many = evaluate.plan_load(spec("cuda"), device="cuda", gpus=4, bitsandbytes=True)
    assert many.device_map == "auto" and many.dtype == "bfloat16" and many.gpus == 4
    kwargs = evaluate.base_kwargs(spec("cuda"), many)
    assert kwargs["device_map"] == "auto" and kwargs["dtype"] == torch.bfloat16
    assert "quantization_config" not in kwargs

    one = evaluate.plan_load(spec("cuda"), device="cuda", gpus=1, bitsandbytes=True)
    assert evaluate.base_kwargs(spec("cuda"), one)["device_map"] == {"": 0}

    cpu = evaluate.plan_load(spec("cpu"), device="cpu", gpus=0, bitsandbytes=True)
    kwargs = evaluate.base_kwargs(spec("cpu"), cpu)
    assert "device_map" not in kwargs and kwargs["dtype"] == torch.float32
    assert cpu.record("weights") == {
        "device": "cpu",
        "gpus": 0,
        "device_map": None,
        "dtype": "float32",
        "quantization": None,
        "layout": "weights",
    }


def test_a_qlora_base_is_loaded_in_4_bits_as_training_loaded_it() -> None:
    import torch

    qlora = spec("cuda", {**LORA, "quantization": QUANTIZATION})
    plan = evaluate.plan_load(qlora, device="cuda", gpus=2, bitsandbytes=True)
    assert plan.quantization == QUANTIZATION and plan.note is None
    kwargs = evaluate.base_kwargs(qlora, plan)
    quant = kwargs["quantization_config"]
    assert quant.load_in_4bit and quant.bnb_4bit_quant_type == "nf4" and quant.bnb_4bit_use_double_quant
    assert quant.bnb_4bit_compute_dtype == torch.bfloat16 and kwargs["device_map"] == "auto"
    # A job's own whole weights (a full fine-tune's folder) are never quantized.
    assert "quantization_config" not in evaluate.base_kwargs(qlora, plan, quantized=False)
    # Without bitsandbytes on the evaluation's host: the bf16 base, and the record says so.
    plain = evaluate.plan_load(qlora, device="cuda", gpus=1, bitsandbytes=False)
    assert plain.quantization is None and "bitsandbytes is not installed" in (plain.note or "")
    assert evaluate._base_words(plain.record("adapter"))["base_dtype"] == "bfloat16"
    assert "base_note" in evaluate._base_words(plain.record("adapter"))


def test_on_gpus_from_pretrained_places_the_model_and_nothing_moves_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_checkpoint of an adapter with 4 visible GPUs: the base's from_pretrained gets device_map="auto"
    and the 4-bit config; the model is never loaded on the host and then moved (.to)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    calls: list[tuple[str, dict[str, Any]]] = []

    class Fake:
        config = type("C", (), {"use_cache": False})()
        is_loaded_in_4bit = True

        def to(self, *a: Any, **k: Any) -> Any:
            raise AssertionError("a model placed by from_pretrained is not moved")

        def eval(self) -> Fake:
            return self

    def base(name: str, **kwargs: Any) -> Fake:
        calls.append((name, kwargs))
        return Fake()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", staticmethod(base))
    monkeypatch.setattr(PeftModel, "from_pretrained", staticmethod(lambda b, path: b))
    monkeypatch.setattr(evaluate, "_device", lambda s: "cuda")
    monkeypatch.setattr(evaluate, "_visible_gpus", lambda: 4)
    monkeypatch.setattr(evaluate, "_bitsandbytes", lambda: True)
    _, _, record = evaluate.load_checkpoint_as(spec("cuda", {**LORA, "quantization": QUANTIZATION}), folder)
    [(name, kwargs)] = calls
    assert name == str(MODEL) and kwargs["device_map"] == "auto"
    assert kwargs["quantization_config"].load_in_4bit
    assert record["gpus"] == 4 and record["layout"] == "adapter" and record["quantization"] == QUANTIZATION


# What really loads on this CPU --------------------------------------------------------------------------


def _mean_loss(model: Any, tokenizer: Any) -> float:
    import torch

    losses = []
    for text in ROWS:
        ids = tokenizer(text, return_tensors="pt")["input_ids"].to(model.device)
        with torch.no_grad():
            losses.append(float(model(input_ids=ids, labels=ids).loss))
    return sum(losses) / len(losses)


def _trained_like(model: Any, seed: int) -> Any:
    """A LoRA model with nonzero adapter weights (as if trained)."""
    import torch
    from peft import get_peft_model

    from trainer.model import lora_config

    lora = spec(lora=LORA).lora
    assert lora is not None
    peft = get_peft_model(model, lora_config(lora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return peft


def test_a_qlora_adapter_is_scored_on_the_4_bit_base_on_this_cpu(tmp_path: Path) -> None:
    # bitsandbytes has 4-bit CPU kernels, and the spec lets QLoRA train on the CPU (one process or DDP):
    # its evaluation loads the base as the job did.
    bnb = pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "final"
    _trained_like(AutoModelForCausalLM.from_pretrained(MODEL), 1).save_pretrained(folder)
    qlora = spec("cpu", {**LORA, "quantization": QUANTIZATION})
    model, tokenizer, record = evaluate.load_checkpoint_as(qlora, folder)
    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) == 14  # every Linear of the two decoder layers, as training's log counts them
    assert record["quantization"] == QUANTIZATION and record["device"] == "cpu"
    assert evaluate._base_words(record) == {"base_dtype": "nf4 4-bit"}
    assert 0 < _mean_loss(model, tokenizer) < 20


def _save_dcp(state: dict[str, Any], folder: Path) -> Path:
    """A checkpoint as accelerate's FSDP save writes it: {"model": state dict} in
    torch.distributed.checkpoint's format (here from one process)."""
    import torch.distributed.checkpoint as dcp

    shard_dir = folder / "pytorch_model_fsdp_0"
    with pytest.warns(UserWarning):  # no process group: torch says it saves as one process
        dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(str(shard_dir)), no_dist=True)
    return shard_dir


def _no_tmp_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate import utils

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the shards are read into the model, never merged into a temp folder")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(utils, "merge_fsdp_weights", refuse)


def test_an_fsdp_lora_checkpoint_reads_the_adapters_tensors_alone_into_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = _trained_like(AutoModelForCausalLM.from_pretrained(MODEL), 2).eval()
    want = _mean_loss(trained, AutoTokenizer.from_pretrained(MODEL))
    folder = tmp_path / "checkpoint-4"
    # What FSDP's sharded save of a PEFT model holds: the adapter's tensors, without the adapter's name.
    _save_dcp(dict(get_peft_model_state_dict(trained)), folder)
    _no_tmp_copy(monkeypatch)
    import torch.distributed.checkpoint as dcp

    asked: list[str] = []
    load = dcp.load

    def spy(state: dict[str, Any], **kwargs: Any) -> None:
        asked.extend(state)
        assert kwargs["no_dist"] is True  # no process group in an evaluation
        load(state, **kwargs)

    monkeypatch.setattr(dcp, "load", spy)
    model, tokenizer, record = evaluate.load_checkpoint_as(spec("cpu", LORA), folder)
    assert record["layout"] == "fsdp"
    assert _mean_loss(model, tokenizer) == pytest.approx(want, rel=1e-6)
    # Only the 8 adapter tensors (q and v of two layers, A and B) were asked of the shards, by their
    # names in the checkpoint.
    assert len(asked) == 8 and all(k.startswith("model.base_model.") and "lora_" in k for k in asked)


def test_an_fsdp_full_checkpoint_loads_every_weight_and_refuses_one_that_lacks_some(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(MODEL).eval()
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(0.9)
    want = _mean_loss(trained, AutoTokenizer.from_pretrained(MODEL))
    state = trained.state_dict()
    folder = tmp_path / "checkpoint-4"
    _save_dcp(state, folder)
    _no_tmp_copy(monkeypatch)
    model, tokenizer, record = evaluate.load_checkpoint_as(spec("cpu"), folder)
    assert record["layout"] == "fsdp" and record["dtype"] == "float32"
    assert _mean_loss(model, tokenizer) == pytest.approx(want, rel=1e-6)

    partial = tmp_path / "checkpoint-6"
    _save_dcp({k: v for k, v in state.items() if "layers.1." not in k}, partial)
    with pytest.raises(evaluate.ModelError, match="lacks 9 tensors"):
        evaluate.load_checkpoint(spec("cpu"), partial)
