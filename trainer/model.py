"""Model, tokenizer, attention choice, load dtype and the LoRA config.

Load dtype rule (why each case):
- mixed_precision `no`: float32.
- FSDP: float32. FSDP's mixed-precision policy computes in bf16/fp16 anyway, FSDP1 flattens parameters
  into buffers of one dtype (LoRA adapters are kept in float32 by PEFT), and the full state dict gathered
  for `final/` stays in the precision training kept.
- FSDP2 with LoRA: the half dtype. The base is frozen, so float32 would only double its shards, rank 0's
  host RAM at load and the broadcast (70B on 8 GPUs: 33 GiB a GPU instead of 16.5, 263 GiB of rank 0's
  RAM instead of 131). accelerate's FSDP2 prepare upcasts only the trainable parameters (the adapter) to
  float32, and FSDP2 needs one dtype among the trainable parameters of a unit only, not the frozen ones.
- DeepSpeed, and LoRA elsewhere: the half dtype of `mixed_precision`. DeepSpeed keeps float32 master
  weights in its optimizer itself; under LoRA the base is frozen, so half precision only saves memory.
- Full fine-tuning under DDP or one process: float32 master weights, autocast computes in half.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftq.contract import runs
from ftq.contract.spec import JobSpec, LoraSpec, ModelSpec, looks_local

from . import hub
from .errors import ModelError

if TYPE_CHECKING:
    import torch


def check_model_path(spec: ModelSpec) -> None:
    """A local model folder must hold a config and weights, and a hub id one the Hub can be asked
    for; say what is wrong before loading."""
    if not looks_local(spec.name_or_path):
        problem = hub.unreachable_reason(spec.name_or_path, "model", spec.revision)
        if problem:
            raise ModelError(problem)
        return
    path = Path(spec.name_or_path)
    if not path.is_dir():
        raise ModelError(f"model path {spec.name_or_path} is not a folder (or does not exist)")
    if not (path / "config.json").is_file():
        raise ModelError(f"model folder {spec.name_or_path} has no config.json")
    if not runs.has_weights(path):
        raise ModelError(
            f"model folder {spec.name_or_path} has no weights (expected model.safetensors, "
            "a sharded *.safetensors index or pytorch_model.bin)"
        )


@dataclasses.dataclass(frozen=True)
class AttnChoice:
    """The attention the model is loaded with, and why `auto` could not take a flash kernel (None: it
    did, or nothing faster could run here: the CPU, or float32, which flash kernels do not compute in)."""

    name: str
    fallback: str | None = None


# FA3 (flash-attention's `hopper/` build, imported as flash_attn_interface) runs on Hopper (sm90) only.
HOPPER = 9


def resolve_attn(requested: str, device_type: str, mixed_precision: str) -> str:
    return choose_attn(requested, device_type, mixed_precision).name


def choose_attn(
    requested: str, device_type: str, mixed_precision: str, *, packing: bool = False
) -> AttnChoice:
    """`auto`: on CUDA in a half dtype, flash_attention_3 on Hopper where FA3 imports or the `kernels`
    package can fetch it, else flash_attention_2 where flash-attn really imports, else sdpa, with the
    reason in `fallback` (the trainer makes it a job.warning: with packing, sdpa builds a dense
    block-diagonal mask, so each packed row pays attention quadratic in its whole length).

    An installed flash-attn can still fail to import (a wheel built for another torch or CUDA raises an
    undefined-symbol OSError or ImportError, some builds a RuntimeError), and its kernels have no float32
    path: `auto` must never pick what would crash the first forward. An explicit choice is kept:
    transformers refuses one that cannot load, which is not silent.
    """
    if requested != "auto":
        return AttnChoice(requested)
    if device_type != "cuda" or mixed_precision not in ("bf16", "fp16"):
        return AttnChoice("sdpa")
    hopper = cuda_capability_major() == HOPPER
    if hopper and (module_importable("flash_attn_interface") or module_importable("kernels")):
        return AttnChoice("flash_attention_3")
    if flash_attn_importable():
        return AttnChoice("flash_attention_2")
    why = (
        "flash-attn is not installed"
        if importlib.util.find_spec("flash_attn") is None
        else "flash-attn is installed but does not import (built for another torch or CUDA?)"
    )
    if hopper:
        why += ", nor FA3 (flash_attn_interface) or the kernels package"
    cost = (
        "; with packing, sdpa attends over a dense block-diagonal mask: each packed row pays attention "
        "quadratic in its whole length"
        if packing
        else ""
    )
    return AttnChoice(
        "sdpa",
        f"model.attn_implementation auto: {why}, so attention falls back to sdpa{cost}; install "
        "flash-attn (pip install -e '.[flash]') or set attn_implementation: sdpa to silence this",
    )


def cuda_capability_major() -> int | None:
    """The first GPU's compute capability major (9: Hopper); None without CUDA."""
    try:
        import torch

        return int(torch.cuda.get_device_capability()[0]) if torch.cuda.is_available() else None
    except (RuntimeError, AssertionError):
        return None


def module_importable(name: str) -> bool:
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def flash_attn_importable() -> bool:
    return module_importable("flash_attn")


def load_dtype(spec: JobSpec, strategy: str) -> torch.dtype:
    import torch

    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(spec.training.mixed_precision))
    if half is None:
        return torch.float32
    if strategy == "fsdp":
        fsdp2 = os.environ.get("FSDP_VERSION", "1") == "2"
        return half if fsdp2 and spec.lora is not None else torch.float32
    if strategy == "deepspeed" or spec.lora is not None:
        return half
    return torch.float32


def load_tokenizer(spec: ModelSpec) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            spec.name_or_path, revision=spec.revision, trust_remote_code=spec.trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot load the tokenizer of {spec.name_or_path}: {_first_line(err)}") from err
    if tokenizer.pad_token is None:
        # Llama-style tokenizers ship without one; the collator needs it for batches without packing.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def quantization_config(spec: JobSpec) -> Any:
    """QLoRA's BitsAndBytesConfig for `lora.quantization`, or None. The 4-bit weights are stored in the
    compute dtype's storage (`bnb_4bit_quant_storage`) so that ZeRO-3 can partition them like any other
    16-bit parameter. Building it needs no bitsandbytes; loading with it does (a model_error without)."""
    quant = spec.lora.quantization if spec.lora is not None else None
    if quant is None:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[quant.compute_dtype]
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant.type,
        bnb_4bit_use_double_quant=quant.double_quant,
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_quant_storage=compute,
    )


def load_model(
    spec: JobSpec, dtype: torch.dtype, attn_implementation: str, *, placeholders: str | None = None
) -> Any:
    """from_pretrained, after the training arguments exist (so ZeRO-3 init sees the launch environment).

    `placeholders` (`meta` or `cpu`): build the model from its config and read no weights. It is for
    the ranks that FSDP fills from rank 0 when it wraps the model: transformers 5 reads the full weights
    on every rank, although its FSDP check says otherwise, so 8 ranks of a 70B job would each hold all
    of it. FSDP1 (`sync_module_states`) materialises `meta` parameters one unit at a time. FSDP2's
    prepare in accelerate matches optimizer parameters to sharded ones by storage address, which all
    `meta` tensors share, so there the parameters are uninitialised CPU storage (`cpu`): the kernel
    backs a page only once it is written, so RSS does not grow until rank 0's shard arrives.
    Buffers stay real: non-persistent ones such as rotary `inv_freq` are in no checkpoint and not
    broadcast, so they are computed here exactly as rank 0's from_pretrained computes them.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    m = spec.model
    # A reward model scores a whole sequence: the base model with a one-output classification head
    # (new, randomly initialised: loading a causal LM's checkpoint into it leaves the LM head unused).
    reward = spec.training.method == "reward"
    auto: Any = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    head: dict[str, Any] = {"num_labels": 1} if reward else {}
    try:
        if placeholders is not None:
            from accelerate import init_empty_weights

            config = AutoConfig.from_pretrained(
                m.name_or_path, revision=m.revision, trust_remote_code=m.trust_remote_code, **head
            )
            with init_empty_weights(include_buffers=False):
                model = auto.from_config(
                    config,
                    trust_remote_code=m.trust_remote_code,
                    dtype=dtype,
                    attn_implementation=attn_implementation,
                )
            if placeholders != "meta":
                _to_empty_keeping_buffers(model, placeholders)
            # Tying inside init_empty_weights (or to_empty) leaves two parameters instead of one shared.
            model.tie_weights()
        else:
            quant = quantization_config(spec)
            if quant is not None:
                head = {**head, "quantization_config": quant}
            model = auto.from_pretrained(
                m.name_or_path,
                **head,
                revision=m.revision,
                trust_remote_code=m.trust_remote_code,
                dtype=dtype,
                attn_implementation=attn_implementation,
            )
    except (OSError, ValueError, ImportError) as err:
        raise ModelError(f"cannot load model {m.name_or_path}: {_first_line(err)}") from err
    if spec.training.gradient_checkpointing:
        model.config.use_cache = False  # the KV cache is useless in training and clashes with checkpointing
    return model


def load_adapter(model: Any, adapter: str, *, keep_model_dtype: bool = False) -> Any:
    """The model with a LoRA adapter loaded onto it (a job's final/), its weights trainable: a job that
    goes on from a LoRA fine-tune trains the same adapter further rather than a new one on top.

    `keep_model_dtype` (ZeRO-3 on a half-precision base that is not quantized): the adapter in the
    base's dtype, as TRL makes the adapters it creates there (autocast_adapter_dtype=False). PEFT's
    default upcasts it to float32, and ZeRO-3 allocates its coalesced all-gather buffers in the dtype of
    the first persistent parameter: a bf16 base with a float32 adapter fails at the first optimizer step
    (TRL issue 6089, DeepSpeed issue 8072)."""
    from peft import PeftModel

    if getattr(model.config, "use_cache", True) is False:  # gradient checkpointing (load_model)
        # The frozen embeddings' output must carry grad for checkpointed blocks to backpropagate into the
        # adapter; TRL does this only for the adapters it creates itself.
        model.enable_input_require_grads()
    try:
        return PeftModel.from_pretrained(
            model, adapter, is_trainable=True, autocast_adapter_dtype=not keep_model_dtype
        )
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot load the adapter {adapter}: {_first_line(err)}") from err


def _to_empty_keeping_buffers(model: Any, device: str) -> None:
    buffers = {name: buf.clone() for name, buf in model.named_buffers()}
    model.to_empty(device=device)
    for name, buf in model.named_buffers():
        buf.copy_(buffers[name])


def check_target_modules(model: Any, lora: LoraSpec) -> None:
    """Every LoRA target must name a module of this model (PEFT matches on the dotted-name suffix)."""
    if lora.target_modules == "all-linear":
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        import torch

        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
        )
        raise ModelError(
            f"LoRA target module(s) {', '.join(missing)} not found in {type(model).__name__}; "
            f"its linear layers are: {', '.join(linear)} (or use all-linear)"
        )


def lora_config(lora: LoraSpec, task_type: str = "CAUSAL_LM") -> Any:
    """PEFT's LoraConfig; `SEQ_CLS` (a reward model) also trains and saves the new score head."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # PEFT annotates int; it scales by alpha / r
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type=task_type,
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
