"""Evaluate one saved checkpoint of a job with the spec's suites (`eval.suites`), as a run of its own.

The worker launches it as one process (launch.sh locally, job.sbatch on SLURM) in the evaluation's own
folder of the run directory, from the request it wrote there:

    python -m trainer.evaluate --request RUN_DIR/evaluations/<evaluation id>/evaluation.json

It loads the checkpoint (`checkpoints/checkpoint-<step>/` or `final/`) in one process, on the GPUs the
worker sized it for (device_map="auto" over several, straight onto one): a LoRA adapter on its base model
(a QLoRA job's base in 4 bits, as it trained), whole weights, FSDP's torch.distributed.checkpoint read
straight into the model's tensors, or DeepSpeed ZeRO's partitions gathered in memory. Then each
suite runs and `results.json` is written beside the request:
`{"checkpoint": "final" | "<step>", "step", "metrics": {name: value}, "suites": {name: details},
"load": how the model was loaded}`.

Why a run of its own rather than inside training: it works the same whatever sharded the training
(no sharded generate under FSDP or ZeRO-3), it never holds up the ranks' collectives (a rank that
generates while the others wait times NCCL out), and the scheduler places it like any run, under the
same quotas. Errors a user can act on end as one `ftq-error: <code>: <message>` line and exit status 2.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.datasets import SuitePrompt, suite_prompt
from ftq.contract.errors import ErrorCode
from ftq.contract.evaluation import EVALUATION_REQUEST, RESULTS, GradersSuite, LmEvalSuite, LossSuite
from ftq.contract.spec import JobSpec

from . import side_run, task_sandbox
from .errors import DatasetError, FtqError, ModelError

log = logging.getLogger("trainer.evaluate")


class SuiteGraderError(FtqError):
    code: ErrorCode = ErrorCode.grader_error


@dataclass(frozen=True)
class EvaluationArgs:
    """evaluation.json, written by the worker (paths the server chose, never a client)."""

    evaluation_id: str
    job_id: str
    run_dir: Path
    out_dir: Path
    step: int | None  # None: final/
    suites: list[str] = field(default_factory=list)  # the spec's suites to run; empty: all of them
    trust_remote_code: bool = False

    @classmethod
    def read(cls, path: Path) -> EvaluationArgs:
        d = json.loads(path.read_text())
        return cls(
            **side_run.request_fields(d),
            evaluation_id=str(d["evaluation_id"]),
            step=None if d.get("step") is None else int(d["step"]),
            suites=[str(s) for s in d.get("suites") or []],
        )

    @property
    def checkpoint_dir(self) -> Path:
        if self.step is None:
            return self.run_dir / runs.FINAL
        return self.run_dir / runs.CHECKPOINTS / f"{runs.CHECKPOINT_PREFIX}{self.step}"


def main(argv: list[str] | None = None) -> None:
    side_run.main_of("trainer.evaluate", __doc__ or "", EVALUATION_REQUEST, run, argv)


def run(request: Path) -> None:
    evaluate(EvaluationArgs.read(request))


def evaluate(args: EvaluationArgs) -> dict[str, Any]:
    _, spec = side_run.read_spec(args.run_dir, args.trust_remote_code)
    suites = [s for s in spec.eval.suites if not args.suites or s.name in args.suites]
    folder = args.checkpoint_dir
    if not folder.is_dir():
        raise ModelError(f"{folder.relative_to(args.run_dir)} is not there (rotated away, or never saved)")
    loaded: tuple[Any, Any] | None = None
    load: dict[str, Any] | None = None
    backend: LmEvalBackend | None = None  # chosen at the first lm_eval suite, kept for the others
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {}
    for suite in suites:
        log.info("suite %s (%s) on %s", suite.name, suite.type, folder.name)
        if isinstance(suite, LmEvalSuite):
            if backend is None:
                backend = lm_eval_backend(spec, folder)
                log.info("lm_eval suites on %s: %s", backend.name, backend.reason)
            ran: tuple[dict[str, float], dict[str, Any]] | None = None
            if backend.name == "vllm":
                try:
                    # In a child on the vLLM venv's interpreter; in the sandbox for a task folder.
                    ran = task_sandbox.run_lm_eval_vllm(
                        suite, spec, folder, args.out_dir, backend.python, backend.lm, backend.env
                    )
                except task_sandbox.BackendUnavailable as err:
                    backend = LmEvalBackend("hf", f"vLLM could not load {folder.name}: {err}")
                    log.warning("lm_eval suites on hf: %s", backend.reason)
            if ran is None and suite.task_dir:
                # The owner's task folder is tenant code: it runs in the sandbox, never in this process.
                ran = task_sandbox.run_lm_eval(suite, spec, folder, args.out_dir)
            if ran is not None:
                metrics.update(ran[0])
                details[suite.name] = {**ran[1], "backend": backend.name, "backend_reason": backend.reason}
                continue
        if loaded is None:  # loaded once, and only for the suites that run in this process
            model, tokenizer, load = load_checkpoint_as(spec, folder)
            loaded = (model, tokenizer)
        model, tokenizer = loaded
        if isinstance(suite, GradersSuite):
            found, detail = run_graders(suite, model, tokenizer)
        elif isinstance(suite, LmEvalSuite):
            assert backend is not None
            found, detail = run_lm_eval(suite, model, tokenizer)
            detail = {**detail, "backend": backend.name, "backend_reason": backend.reason}
        else:
            found, detail = run_loss(suite, model, tokenizer)
        metrics.update(found)
        details[suite.name] = {**detail, **_base_words(load)}
    out = {
        "evaluation_id": args.evaluation_id,
        "checkpoint": "final" if args.step is None else str(args.step),
        "step": args.step,
        "metrics": metrics,
        "suites": details,
        # How this process loaded the model (None: every suite ran in a child that loads it itself).
        "load": load,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = args.out_dir / f".{RESULTS}.tmp"
    tmp.write_text(json.dumps(out, indent=2, allow_nan=False, default=str) + "\n")
    tmp.replace(args.out_dir / RESULTS)
    log.info("metrics of %s: %s", folder.name, metrics)
    return out


# Loading a checkpoint ------------------------------------------------------------------------------------
#
# What the job trained, on the devices this run was given: the scheduler sizes an evaluation of a cuda job
# from the base's weights in the dtype loaded here (worker.evaluations.evaluation_gpus, with
# ftq.planning.serving.engine_size), so a 70B base gets the GPUs of one node that hold it. Over several
# visible GPUs the weights go straight to them (accelerate's big-model dispatch, device_map="auto"); on one
# GPU straight to it; never the whole model in this process's RAM first. A QLoRA job's base is loaded in 4
# bits as training loaded it (trainer.model.quantization_config), and its adapter on top.


@dataclass(frozen=True)
class LoadPlan:
    """How load_checkpoint loads the model here; results.json's `load` records it with the layout."""

    device: str  # cpu or cuda
    gpus: int  # the GPUs the weights are spread over (0 on the CPU)
    dtype: str  # the weights' dtype (of a 4-bit base: the modules bitsandbytes does not hold in 4 bits)
    quantization: dict[str, Any] | None = None  # QLoRA's 4-bit base, as the spec's lora.quantization
    note: str | None = None  # why the base is not loaded as the job trained it (bitsandbytes missing)

    @property
    def device_map(self) -> str | dict[str, int] | None:
        if self.device != "cuda":
            return None  # today's CPU path: from_pretrained on the host
        return "auto" if self.gpus > 1 else {"": 0}

    def record(self, layout: str) -> dict[str, Any]:
        return {
            "device": self.device,
            "gpus": self.gpus,
            "device_map": self.device_map,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "layout": layout,
            **({"note": self.note} if self.note else {}),
        }


def plan_load(spec: JobSpec, *, device: str, gpus: int, bitsandbytes: bool) -> LoadPlan:
    """Where and in what dtype this evaluation loads the model: float32 on the CPU and bfloat16 on GPUs
    (as before), and a QLoRA job's base in 4 bits wherever bitsandbytes is (on the CPU too, where the spec
    lets QLoRA train on one process or DDP and bitsandbytes has 4-bit kernels)."""
    dtype = "bfloat16" if device == "cuda" else "float32"
    gpus = max(1, gpus) if device == "cuda" else 0
    quant = spec.lora.quantization if spec.lora is not None else None
    if quant is None:
        return LoadPlan(device, gpus, dtype)
    if not bitsandbytes:
        note = (
            "the job trained on a 4-bit base (lora.quantization) but bitsandbytes is not installed here: "
            f"the adapter is scored on the {dtype} base"
        )
        return LoadPlan(device, gpus, dtype, note=note)
    return LoadPlan(device, gpus, dtype, quantization=quant.model_dump(mode="json"))


def base_kwargs(spec: JobSpec, plan: LoadPlan, *, quantized: bool = True) -> dict[str, Any]:
    """from_pretrained's arguments under `plan`: dtype, device_map, and for the base of a QLoRA adapter
    (`quantized`) the job's BitsAndBytesConfig."""
    import torch

    kwargs: dict[str, Any] = {
        "trust_remote_code": spec.model.trust_remote_code,
        "dtype": getattr(torch, plan.dtype),
    }
    if plan.device_map is not None:
        kwargs["device_map"] = plan.device_map
    if quantized and plan.quantization is not None:
        from .model import quantization_config

        kwargs["quantization_config"] = quantization_config(spec)
    return kwargs


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def current_plan(spec: JobSpec) -> LoadPlan:
    device = _device(spec)
    return plan_load(
        spec, device=device, gpus=_visible_gpus() if device == "cuda" else 0, bitsandbytes=_bitsandbytes()
    )


def load_checkpoint(spec: JobSpec, folder: Path) -> tuple[Any, Any]:
    """The model in `folder` in eval mode on this process's devices, and its tokenizer."""
    model, tokenizer, _ = load_checkpoint_as(spec, folder)
    return model, tokenizer


def load_checkpoint_as(spec: JobSpec, folder: Path) -> tuple[Any, Any, dict[str, Any]]:
    """load_checkpoint, and how it loaded the model (results.json's `load`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = spec.model
    plan = current_plan(spec)
    model: Any
    tok_source = str(folder) if (folder / "tokenizer_config.json").is_file() else m.name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(tok_source, trust_remote_code=m.trust_remote_code)
        if (folder / "adapter_config.json").is_file():
            from peft import PeftModel

            layout = "adapter"
            base = AutoModelForCausalLM.from_pretrained(
                m.name_or_path, revision=m.revision, **base_kwargs(spec, plan)
            )
            if m.adapter:  # the adapter training started from, merged under the one trained here
                base = PeftModel.from_pretrained(base, m.adapter).merge_and_unload()
            model = PeftModel.from_pretrained(base, str(folder))
        elif runs.has_weights(folder):
            layout = "weights"
            model = AutoModelForCausalLM.from_pretrained(
                str(folder), **base_kwargs(spec, plan, quantized=False)
            )
        else:
            layout = runs.checkpoint_layout(folder).kind
            model = _from_shards(spec, folder, plan)
    except (OSError, ValueError, ImportError, RuntimeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelError(f"cannot load {folder.name}: {first}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if plan.device_map is None and not getattr(model, "is_loaded_in_4bit", False):
        model.to(plan.device)  # the CPU: where from_pretrained put it (a 4-bit model is not moved)
    model.eval()
    model.config.use_cache = True
    record = plan.record(layout)
    log.info("loaded %s: %s", folder.name, record)
    return model, tokenizer, record


def _base_words(load: dict[str, Any] | None) -> dict[str, Any]:
    """What an in-process suite's details say the weights were (`base_dtype`: `nf4 4-bit` for a QLoRA
    base, else the dtype), and why where that is not what the job trained on (`base_note`)."""
    if load is None:
        return {}
    quant = load.get("quantization")
    out: dict[str, Any] = {"base_dtype": f"{quant['type']} 4-bit" if quant else str(load["dtype"])}
    if load.get("note"):
        out["base_note"] = load["note"]
    return out


def _from_shards(spec: JobSpec, folder: Path, plan: LoadPlan) -> Any:
    """A checkpoint of sharded states loaded into the model in this process (with a fresh LoRA wrapper
    for a LoRA job): FSDP's torch.distributed.checkpoint read straight into the model's own parameters
    (a LoRA job's adapter tensors alone are read); DeepSpeed ZeRO's partitions gathered to one fp32 state
    dict first (zero_to_fp32)."""
    from transformers import AutoModelForCausalLM

    layout = runs.checkpoint_layout(folder)
    if layout.kind not in ("fsdp", "deepspeed"):
        raise ModelError(f"{folder.name} holds no weights this evaluation can load")
    m = spec.model
    model = AutoModelForCausalLM.from_pretrained(
        m.name_or_path, revision=m.revision, **base_kwargs(spec, plan)
    )
    if spec.lora is not None:
        from peft import get_peft_model

        from .model import lora_config

        model = get_peft_model(model, lora_config(spec.lora))
    shard_dirs = [p for p in sorted(folder.glob("pytorch_model_fsdp*")) if p.is_dir()]
    if layout.kind == "fsdp" and shard_dirs:
        _read_dcp_into(model, shard_dirs[0], lora=spec.lora is not None, name=folder.name)
        return model
    if layout.kind == "fsdp":  # FSDP's full state dict, one file
        import torch

        file = next(iter(sorted(folder.glob("pytorch_model_fsdp*.bin"))), None)
        if file is None:
            raise ModelError(f"{folder.name} holds no weights this evaluation can load")
        state = torch.load(file, map_location="cpu", weights_only=True)
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(folder))
    state = _strip_wrappers(state)
    if spec.lora is not None:
        from peft import set_peft_model_state_dict

        # ZeRO's gathered state names the adapter (`lora_A.default.weight`); peft's loader takes the names
        # get_peft_model_state_dict gives (no adapter name).
        adapter = {k.replace(".default.", "."): v for k, v in state.items() if "lora_" in k}
        if not adapter:
            raise ModelError(f"{folder.name}: the consolidated state holds no LoRA tensors")
        result = set_peft_model_state_dict(model, adapter)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise ModelError(f"{folder.name}: {len(unexpected)} LoRA tensors match no module of the model")
        return model
    missing, _unexpected = model.load_state_dict(state, strict=False)
    if missing:
        raise ModelError(f"{folder.name}: the consolidated weights lack {len(missing)} tensors")
    return model


# The adapter's name in a PEFT model's parameter names, which FSDP's checkpoint of it leaves out.
_ADAPTER = "default"


def _read_dcp_into(model: Any, shard_dir: Path, *, lora: bool, name: str) -> None:
    """Read FSDP's torch.distributed.checkpoint folder straight into `model`'s own tensors, in this one
    process (no process group, no merged copy on disk or in RAM): each tensor is read from the shards into
    the parameter it belongs to, on whatever device that parameter is. Of a LoRA job only the adapter's
    tensors are read (its checkpoint holds those alone; a checkpoint that holds the base too is read no
    further). The checkpoint's names are accelerate's: `model.` + the state dict's own, FSDP1's wrappers
    inside them, and no adapter name in a PEFT model's."""
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(shard_dir))
    metadata = reader.read_metadata()
    planner_data = metadata.planner_data or {}
    by_name: dict[str, str] = {}
    for key in metadata.state_dict_metadata:
        path = planner_data.get(key)
        inner = ".".join(str(p) for p in path[1:]) if path and len(path) > 1 and path[0] == "model" else key
        by_name[_strip_name(inner)] = key
    targets: dict[str, Any] = {}
    missing: list[str] = []
    loaded_ptrs: set[int] = set()
    tensors = model.state_dict(keep_vars=True)
    for pname, tensor in tensors.items():
        if lora and "lora_" not in pname and "modules_to_save" not in pname:
            continue
        candidates = [pname.replace(f".{_ADAPTER}", ""), pname] if lora else [pname]
        found = next((by_name[c] for c in candidates if c in by_name), None)
        if found is None:
            missing.append(pname)
            continue
        targets[found] = tensor.data
        loaded_ptrs.add(tensor.data_ptr())
    if lora and not targets:
        raise ModelError(f"{name}: the sharded checkpoint holds no LoRA tensors of this model")
    # A tensor tied to one read (the LM head to the embeddings) has its values already.
    missing = [p for p in missing if tensors[p].data_ptr() not in loaded_ptrs]
    if missing:
        what = "LoRA tensors" if lora else "tensors"
        raise ModelError(
            f"{name}: the sharded checkpoint lacks {len(missing)} {what} of the model ({missing[0]})"
        )
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(targets, storage_reader=reader, no_dist=True)
    log.info("read %d tensors of %s straight into the model", len(targets), shard_dir.name)


def _strip_name(name: str) -> str:
    from .train import WRAPPERS

    for w in WRAPPERS:
        name = name.replace(f"{w}.", "")
    return name


def _strip_wrappers(state: dict[str, Any]) -> dict[str, Any]:
    return {_strip_name(k): v for k, v in state.items()}


# The suites --------------------------------------------------------------------------------------------


def _rows(path: str | None, limit: int | None) -> list[dict[str, Any]]:
    if path is None:  # an upload (file_id) the worker did not turn into the run's copy
        raise DatasetError("the suite names no dataset file")
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise DatasetError(f"{path} line {n}: a row must be a JSON object")
                rows.append(row)
                if limit is not None and len(rows) >= limit:
                    break
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot read {path}: {err}") from err
    if not rows:
        raise DatasetError(f"{path} has no rows")
    return rows


def _prompt_ids(tokenizer: Any, prompt: SuitePrompt) -> list[int]:
    """A text prompt goes through the chat template as one user turn where the tokenizer has one; a
    conversation (a prompt_only row's, or OpenAI's reinforcement `messages`) always does, with the
    generation prompt, as GRPO renders it."""
    if isinstance(prompt, list):
        from .data import hf_message

        if not getattr(tokenizer, "chat_template", None):
            raise DatasetError(
                "the suite's prompts are conversations but the tokenizer has no chat template; use a chat "
                "model's tokenizer or text prompts"
            )
        conversation = [hf_message(m) for m in prompt]
    elif getattr(tokenizer, "chat_template", None):
        conversation = [{"role": "user", "content": prompt}]
    else:
        return list(tokenizer(prompt)["input_ids"])
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


# Prompts generated together: one forward per new token for the batch, with the KV cache, instead of one
# generate per prompt. HF's generate on the loaded checkpoint, in this one process (the engine of issue 49
# takes this over where it can load what the job trained).
GENERATE_BATCH = 16


def generate_greedy(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Each prompt's greedy completion, decoded, in batches of GENERATE_BATCH: left-padded, so every row's
    new tokens start at the same column, with the padding masked out."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[str] = []
    for at in range(0, len(prompts), GENERATE_BATCH):
        batch = prompts[at : at + GENERATE_BATCH]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
        with torch.no_grad():
            generated = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        out += [tokenizer.decode(row[width:], skip_special_tokens=True) for row in generated]
    return out


def run_graders(suite: GradersSuite, model: Any, tokenizer: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """Greedy completions of the prompts, scored by the grader in one batch (a python grader in one
    sandboxed child, under the operator's FTQ_GRADER_* limits, as GRPO's rewards are)."""

    from ftq.grading.errors import GraderError
    from ftq.grading.score import sample_dict, score_batch
    from ftq.sandbox import SandboxUnavailable

    from .rewards import limits_from_env

    rows = _rows(suite.dataset, suite.limit)
    prompts: list[list[int]] = []
    texts: list[SuitePrompt] = []
    for n, row in enumerate(rows):
        # The row formats GRPO trains on: a text or conversation prompt, or OpenAI's reinforcement rows.
        prompt, why = suite_prompt(row, suite.prompt_field)
        if prompt is None:
            raise DatasetError(f"suite {suite.name}: {suite.dataset} row {n + 1} {why}")
        texts.append(prompt)
        prompts.append(_prompt_ids(tokenizer, prompt))
    completions = generate_greedy(model, tokenizer, prompts, suite.max_new_tokens)
    try:
        results = score_batch(suite.grader, [sample_dict(c) for c in completions], rows, limits_from_env())
    except GraderError as err:
        raise SuiteGraderError(f"suite {suite.name}: {err.message}") from err
    except SandboxUnavailable as err:
        raise SuiteGraderError(f"suite {suite.name}: {err}") from err
    rewards = [float(r.reward) for r in results]
    subs: dict[str, list[float]] = {}
    for result in results:
        for name, value in (result.sub_rewards or {}).items():
            subs.setdefault(name, []).append(float(value))
    examples = [
        {"prompt": prompt, "completion": completion, "reward": reward}
        for prompt, completion, reward in list(zip(texts, completions, rewards, strict=True))[:8]
    ]
    metrics = {f"{suite.name}/score": sum(rewards) / len(rewards)}
    for name, values in subs.items():
        metrics[f"{suite.name}/{name}"] = sum(values) / len(values)
    return metrics, {"rows": len(rows), "examples": examples}


@contextmanager
def _in_dir(folder: str | None) -> Any:
    """lm-eval resolves a task's relative `data_files` from the working directory: the task folder's."""
    if folder is None:
        yield
        return
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _local_task_manager(suite: LmEvalSuite) -> Any:
    """An index of `task_dir` alone when every name the suite runs is a task defined there, else None.

    lm-eval's full index reads every YAML file it ships (~14,700 tasks): about 6 CPU-s at the start of
    every evaluation. A group or a tag may gather built-in tasks by name, so only tasks qualify."""
    if not suite.task_dir:
        return None
    from lm_eval.tasks import TaskManager

    local = TaskManager(include_path=suite.task_dir, include_defaults=False)
    return local if set(suite.tasks) <= set(local.all_subtasks) else None


def run_lm_eval(suite: LmEvalSuite, model: Any, tokenizer: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """lm-evaluation-harness on the loaded model (its HF wrapper), offline: a task's data must be local
    or already in the datasets cache."""
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError as err:
        raise ModelError(
            f"suite {suite.name}: lm-evaluation-harness is not installed on this machine "
            "(pip install 'ftq[eval]')"
        ) from err
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=suite.batch_size, device=str(model.device))
    return _simple_evaluate(suite, lm)


def _simple_evaluate(suite: LmEvalSuite, lm: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """The suite's tasks on lm-eval's model `lm` (whichever backend), as metrics and details."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = _local_task_manager(suite) or TaskManager(include_path=suite.task_dir)
    with _in_dir(suite.task_dir):
        try:
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=list(suite.tasks),
                task_manager=manager,
                num_fewshot=suite.num_fewshot,
                limit=suite.limit,
                log_samples=False,
            )
        except (KeyError, ValueError, FileNotFoundError) as err:
            raise DatasetError(f"suite {suite.name}: lm-eval: {err}") from err
    metrics: dict[str, float] = {}
    for task, values in (out or {}).get("results", {}).items():
        for key, value in values.items():
            if "_stderr" in key or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            name, _, flt = key.partition(",")
            label = name if flt in ("", "none") else f"{name},{flt}"
            if math.isfinite(float(value)):
                metrics[f"{suite.name}/{task}/{label}"] = float(value)
    return metrics, {"tasks": list(suite.tasks), "versions": (out or {}).get("versions", {})}


def lm_eval_child() -> None:
    """The sandbox's side of trainer.task_sandbox: load the checkpoint, run the suite, answer on the
    stdout this process was started with (the libraries' own prints go to stderr)."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    request = json.loads(sys.stdin.read())
    spec = JobSpec.model_validate(request["spec"])
    suite = LmEvalSuite.model_validate(request["suite"])
    try:
        model, tokenizer = load_checkpoint(spec, Path(request["folder"]))
        metrics, detail = run_lm_eval(suite, model, tokenizer)
        answer: dict[str, Any] = {"metrics": metrics, "detail": detail}
    except FtqError as err:
        answer = {"code": err.code.value, "message": err.message}
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer, default=str))


# lm_eval's backends -------------------------------------------------------------------------------------
#
# An lm_eval suite runs on lm-eval's own `vllm` model type where the vLLM venv (`make vllm`, or
# FTQ_VLLM_VENV) is there and can serve the checkpoint as it is saved: a LoRA adapter on its base model
# (vLLM's LoRA, lm-eval's `lora_local_path`), or a folder of whole weights. vLLM cannot be imported here
# (it pins a transformers that this venv cannot have), so it runs in a child on that venv's interpreter.
# Everything else (sharded states, an adapter over another adapter, a model of remote code...) runs on
# lm-eval's HF backend over the model this process loads, and the suite's details say which and why.

# vLLM's CPU attention kernels take a head_dim of 32 and above.
_VLLM_CPU_MIN_HEAD_DIM = 32
# On the CPU, vLLM reserves its KV cache up front for the longest context it admits: at least this much...
_VLLM_CPU_KV_BYTES = 256 * 2**20
# ...and contexts up to the model's own limit (as lm-eval's HF backend cuts them), at most this many tokens.
_VLLM_CPU_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class LmEvalBackend:
    """Where this evaluation's lm_eval suites run (`vllm` or `hf`), why, and for vLLM the arguments of
    lm-eval's VLLM model (with `python`, the vLLM venv's interpreter)."""

    name: str
    reason: str
    python: str = ""
    lm: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the child's own settings


def _hf(reason: str) -> LmEvalBackend:
    return LmEvalBackend("hf", reason)


def _site_packages(venv: Path) -> list[Path]:
    return sorted(venv.glob("lib/python3*/site-packages"))


def _model_config(name: str, revision: str | None) -> dict[str, Any] | None:
    """config.json of a local model folder, or of a hub model in the local cache; None where not at hand."""
    path: Path | None = Path(name) / "config.json"
    if not Path(name, "config.json").is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json", revision=revision)
        except (ImportError, ValueError):
            cached = None
        path = Path(cached) if isinstance(cached, str) else None
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _vllm_cpu_limits(config: dict[str, Any]) -> dict[str, Any] | str:
    """vLLM's context and KV cache arguments on the CPU for the model of `config`, or why it cannot serve
    it there."""
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // heads if heads and "hidden_size" in config else None
    )
    if head_dim is not None and int(head_dim) < _VLLM_CPU_MIN_HEAD_DIM:
        least = _VLLM_CPU_MIN_HEAD_DIM
        return f"vLLM's CPU attention needs a head_dim of {least} or more; this model's is {head_dim}"
    limit = int(config.get("max_position_embeddings") or 2048)
    max_len = min(limit, _VLLM_CPU_MAX_MODEL_LEN)
    kv = _VLLM_CPU_KV_BYTES
    layers, kv_heads = config.get("num_hidden_layers"), config.get("num_key_value_heads") or heads
    if head_dim and layers and kv_heads:  # keys and values of every layer, float32, for one whole context
        kv = max(kv, 2 * int(layers) * int(kv_heads) * int(head_dim) * 4 * max_len)
    return {"max_model_len": max_len, "kv_cache_memory_bytes": kv}


def _device(spec: JobSpec) -> str:
    """Where load_checkpoint puts the model: the spec's cuda where this host has a GPU, else the CPU."""
    import torch

    return "cuda" if spec.resources.device == "cuda" and torch.cuda.is_available() else "cpu"


def lm_eval_backend(spec: JobSpec, folder: Path) -> LmEvalBackend:
    """vLLM where its venv holds vLLM and lm-eval for this evaluation's device and can serve `folder` as
    it is saved; else HF, with the reason."""
    from ftq.engine.base import EngineError, adapter_rank, lora_rank_slot
    from ftq.engine.local import default_venv

    venv = default_venv()
    python = venv / "bin" / "python"
    site = _site_packages(venv)
    if not python.exists() or not any((p / "vllm" / "__init__.py").is_file() for p in site):
        return _hf(f"no vLLM venv at {venv} (`make vllm` builds it)")
    if not any((p / "lm_eval" / "__init__.py").is_file() for p in site):
        return _hf(f"{venv} has vLLM but not lm-eval (`make vllm` installs it)")
    cpu_build = any(any(p.glob("vllm_cpu-*.dist-info")) for p in site)
    device = _device(spec)
    if cpu_build != (device == "cpu"):
        build = "CPU" if cpu_build else "CUDA"
        return _hf(f"{venv} holds vLLM's {build} build, and this evaluation runs on {device}")
    m = spec.model
    if m.trust_remote_code:
        return _hf("the model runs code of its own (trust_remote_code), which vLLM does not load")
    local = Path(m.name_or_path).is_dir()
    base = str(Path(m.name_or_path).resolve()) if local else m.name_or_path
    own_tokenizer = (folder / "tokenizer_config.json").is_file()
    lm: dict[str, Any] = {
        "dtype": "float32" if device == "cpu" else "bfloat16",  # as load_checkpoint loads it
        "tokenizer": str(folder.resolve()) if own_tokenizer else base,
    }
    if not own_tokenizer and m.revision:
        lm["tokenizer_revision"] = m.revision
    if (folder / "adapter_config.json").is_file():
        if spec.lora is not None and spec.lora.quantization is not None:
            return _hf(
                "the adapter was trained on a 4-bit base (QLoRA), which this process loads as training did"
            )
        if m.adapter:
            return _hf(
                "the adapter was trained over another one (model.adapter), and vLLM serves one at a time"
            )
        try:
            adapter = json.loads((folder / "adapter_config.json").read_text())
            rank = lora_rank_slot(adapter_rank(folder))
        except (OSError, ValueError, EngineError) as err:
            return _hf(f"vLLM cannot load the adapter: {err}")
        if adapter.get("modules_to_save"):
            return _hf("the adapter saves whole modules (modules_to_save), which vLLM's LoRA does not load")
        lm.update(pretrained=base, lora_local_path=str(folder.resolve()), max_lora_rank=rank)
        if m.revision:
            lm["revision"] = m.revision
        config = _model_config(m.name_or_path, m.revision)
    elif runs.has_weights(folder) and (folder / "config.json").is_file():
        lm["pretrained"] = str(folder.resolve())
        config = _model_config(str(folder), None)
    else:
        return _hf(f"{folder.name} holds sharded states, which only this process consolidates")
    env: dict[str, str] = {}
    if device == "cpu":
        if config is not None:
            limits = _vllm_cpu_limits(config)
            if isinstance(limits, str):
                return _hf(limits)
            lm.update(limits)
        # On the CPU vLLM runs the model eagerly, and compiles only a few small ops (a logprob's rank)
        # with inductor and g++: seconds of every evaluation's start for no gain over eager, the same
        # numbers either way, and a cache the sandbox could not keep.
        env["TORCHDYNAMO_DISABLE"] = "1"
    return LmEvalBackend("vllm", f"lm-eval's vllm model type, from {venv}", str(python), lm, env)


def _vllm_cpu_build_fixes() -> None:
    """Make lm-eval's vllm model run on the vllm-cpu distribution (what `make vllm` installs); nothing
    for a CUDA build (the distribution `vllm`)."""
    import importlib.metadata as metadata

    found = metadata.version
    try:
        found("vllm")
        return
    except metadata.PackageNotFoundError:
        pass

    # lm-eval asks for the version of a distribution named `vllm`; the CPU build's is `vllm-cpu`, and vLLM
    # itself reads that one as `<version>+cpu` (vllm.platforms) when `vllm` is not there.
    def version(distribution_name: str) -> str:
        try:
            return found(distribution_name)
        except metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            return found("vllm-cpu") + "+cpu"

    metadata.version = version
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU  # type: ignore[import-not-found]
    from vllm.model_executor.models import registry  # type: ignore[import-not-found]

    # vLLM inspects a model's class in a new interpreter (so as not to initialize CUDA in this one), which
    # imports vLLM again, unless its cache under HOME has the answer: in the sandbox HOME is a fresh
    # scratch folder every time. The CPU build has no CUDA to keep uninitialized.
    registry._run_in_subprocess = lambda fn: fn()
    # lm-eval scores a choice from the prompt's logprobs (prompt_logprobs); vLLM computes those one request
    # at a time, but its CPU LoRA path applies the logits' LoRA with one adapter index per request of the
    # whole batch, which fails on any batch of two or more. Every request here carries the same adapter, so
    # one index, broadcast over the rows, is the right one for every row.
    indices = PunicaWrapperCPU.sampler_indices

    def one_adapter(self: Any) -> Any:
        found_indices = indices.fget(self)
        if found_indices.numel() and bool((found_indices == found_indices[0]).all()):
            return found_indices[:1]
        return found_indices

    PunicaWrapperCPU.sampler_indices = property(one_adapter)


def lm_eval_vllm_child() -> None:
    """The vLLM venv's side of task_sandbox.run_lm_eval_vllm: lm-eval's VLLM model on the request's
    arguments, the suite's tasks, and the answer on the stdout this process was started with (the
    libraries' own prints go to stderr). A model vLLM cannot load answers `unservable` and why: the
    evaluation then runs the suite on HF."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    request = json.loads(sys.stdin.read())
    suite = LmEvalSuite.model_validate(request["suite"])
    answer: dict[str, Any]
    try:
        _vllm_cpu_build_fixes()
        from lm_eval.models.vllm_causallms import VLLM

        lm = VLLM(**request["lm"], batch_size=suite.batch_size)
    except Exception as err:  # whatever vLLM raises on a model it cannot serve: the suite goes to HF
        log.exception("vLLM could not load the model")
        lines = [line for line in str(err).splitlines() if line.strip()]
        answer = {"unservable": f"{type(err).__name__}: {lines[0] if lines else ''}"[:500]}
    else:
        try:
            metrics, detail = _simple_evaluate(suite, lm)
            answer = {"metrics": metrics, "detail": detail}
        except FtqError as err:
            answer = {"code": err.code.value, "message": err.message}
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer, default=str))


def run_loss(suite: LossSuite, model: Any, tokenizer: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """The mean token loss over the rows' texts (each cut to max_seq_len tokens)."""
    import torch

    rows = _rows(suite.dataset, suite.limit)
    total, tokens = 0.0, 0
    for n, row in enumerate(rows):
        text = row.get(suite.text_field)
        if not isinstance(text, str):
            raise DatasetError(f"{suite.dataset} row {n + 1} has no text field {suite.text_field!r}")
        ids = tokenizer(text, truncation=True, max_length=suite.max_seq_len, return_tensors="pt")["input_ids"]
        if ids.shape[1] < 2:
            continue
        ids = ids.to(model.device)
        with torch.no_grad():
            loss = model(input_ids=ids, labels=ids).loss
        total += float(loss) * (ids.shape[1] - 1)
        tokens += ids.shape[1] - 1
    if tokens == 0:
        raise DatasetError(f"{suite.dataset}: no row has two tokens to score")
    return {f"{suite.name}/loss": total / tokens}, {"rows": len(rows), "tokens": tokens}


if __name__ == "__main__":
    main()
