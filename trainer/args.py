"""Command-line arguments: `--spec spec.json`, or the flags of the `train.py` that the Llama 2 70B (FSDP)
and Falcon 180B (LoRA, ZeRO-3) fine-tuning guides launch, so that their command lines run unchanged.

Both forms end as one `JobSpec`, so there is a single training code path. The train.py flags are
mapped onto the spec field by field (see `TrainPyFlags.to_job_spec`); what they leave to the launcher
(which strategy, how many processes) is read back from the environment `accelerate launch` sets.
Nothing heavy is imported here, so `python -m trainer --help` is instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ftq.contract.spec import JobSpec, SpecFieldError

USAGE_EXAMPLE = """\
examples:
  accelerate launch --config_file accelerate_config.yaml -m trainer --spec spec.json --output_dir run/
  accelerate launch --config_file fsdp.yaml -m trainer --model_name ./tiny/model \\
      --dataset_name ./tiny/data/train.jsonl --dataset_text_field text --max_seq_len 128 --max_steps 40 \\
      --logging_steps 1 --bf16 False --packing True --output_dir out/ --use_peft_lora True \\
      --lora_target_modules q_proj,k_proj,v_proj,o_proj --lr_scheduler_type cosine --warmup_ratio 0.1
"""


def str2bool(value: str) -> bool:
    """Booleans as train.py command lines write them (`True`/`False`), and the usual other spellings."""
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "y", "on"):
        return True
    if lowered in ("false", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


@dataclass
class TrainPyFlags:
    """The flags `train.py` takes, with its names and meanings (None: not given on the command line)."""

    model_name: str | None = field(default=None, metadata={"help": "Hub id or local model folder."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub id, local dataset folder, or a .jsonl/.json/.parquet file."}
    )
    dataset_text_field: str | None = field(default=None, metadata={"help": "Column holding the text."})
    max_seq_len: int | None = None
    max_steps: int | None = None
    num_train_epochs: float | None = None
    logging_steps: int | None = None
    eval_steps: int | None = field(
        default=None, metadata={"help": "Evaluate every N steps on the `test` split (held out if absent)."}
    )
    save_steps: int | None = None
    bf16: bool | None = None
    packing: bool | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    use_gradient_checkpointing: bool | None = None
    learning_rate: float | None = None
    lr_scheduler_type: str | None = None
    weight_decay: float | None = None
    warmup_ratio: float | None = None
    use_flash_attn: bool | None = field(
        default=None, metadata={"help": "True: flash_attention_2 when installed on CUDA, else sdpa."}
    )
    use_peft_lora: bool | None = None
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_target_modules: str | None = field(
        default=None, metadata={"help": "Comma-separated module names, or all-linear."}
    )
    seed: int | None = None

    def given(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def to_job_spec(self) -> JobSpec:
        """Build the spec these flags describe; the launch environment fills in the distributed part."""
        training: dict[str, Any] = {
            key: value
            for key in (
                "max_seq_len",
                "max_steps",
                "num_train_epochs",
                "logging_steps",
                "eval_steps",
                "save_steps",
                "packing",
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "learning_rate",
                "lr_scheduler_type",
                "weight_decay",
                "warmup_ratio",
                "seed",
            )
            if (value := getattr(self, key)) is not None
        }
        if self.max_steps is None and self.num_train_epochs is None:
            training["num_train_epochs"] = 1.0  # train.py's default: one pass over the data
        training["mixed_precision"] = "bf16" if self.bf16 else "no"
        training["gradient_checkpointing"] = bool(self.use_gradient_checkpointing)

        dataset: dict[str, Any] = {"name_or_path": self.dataset_name}
        if self.dataset_text_field is not None:
            dataset.update(format="text", text_field=self.dataset_text_field)
        if self.eval_steps is not None:
            # train.py evaluates on the dataset's `test` split, so --eval_steps means that one.
            dataset["eval_split"] = "test"

        lora: dict[str, Any] | None = None
        if self.use_peft_lora:
            lora = {}
            for flag, key in (("lora_r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout")):
                if (value := getattr(self, flag)) is not None:
                    lora[key] = value
            if self.lora_target_modules is not None:
                names = [m.strip() for m in self.lora_target_modules.split(",") if m.strip()]
                lora["target_modules"] = "all-linear" if names == ["all-linear"] else names

        return JobSpec.model_validate(
            {
                "model": {
                    "name_or_path": self.model_name,
                    "attn_implementation": "auto" if self.use_flash_attn else "sdpa",
                },
                "dataset": dataset,
                "training": training,
                "lora": lora,
                **launch_environment(),
            }
        )


def launch_environment() -> dict[str, Any]:
    """The `distributed` and `resources` sections as `accelerate launch` set them up for this process."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    nodes = max(1, world // max(1, local_world))
    distributed: dict[str, Any] = {"strategy": "ddp" if world > 1 else "none"}
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        distributed = {"strategy": "deepspeed"}
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        if stage is not None and stage.isdigit():
            distributed["deepspeed"] = {"zero_stage": int(stage)}
    elif env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        distributed = {"strategy": "fsdp", "fsdp": {"version": int(env.get("FSDP_VERSION", "1"))}}
    return {
        "distributed": distributed,
        "resources": {
            # A launch over several nodes is a SLURM one here; the spec insists on saying so.
            "launcher": "slurm" if nodes > 1 else "local",
            # Whether CUDA is there is settled in train.run (torch is not imported while parsing).
            "device": "cpu" if env.get("ACCELERATE_USE_CPU", "false").lower() == "true" else "cuda",
            "num_nodes": nodes,
            "processes_per_node": local_world,
        },
    }


@dataclass
class TrainerArgs:
    """What `main` needs: the spec, where to write, and where to resume from."""

    spec: JobSpec
    output_dir: Path
    resume_from_checkpoint: str | None = None
    from_train_py_flags: bool = False  # parsed from train.py's flags, not --spec
    process_group_timeout: int | None = None  # seconds; the plan's, sized from the model's load


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Fine-tune a causal LM (TRL SFT, optional LoRA) from an ftq job spec or train.py flags.",
        epilog=USAGE_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--spec", help="spec.json written by the ftq worker (JobSpec as JSON).")
    parser.add_argument(
        "--output_dir", required=True, help="Run directory: metrics.jsonl, checkpoints/, final/."
    )
    parser.add_argument(
        "--resume_from_checkpoint",
        help="`latest` (newest under <output_dir>/checkpoints) or a checkpoint folder.",
    )
    parser.add_argument(
        "--trust_remote_code",
        type=str2bool,
        default=False,
        metavar="True|False",
        help="Let transformers run code from the model repo, when the spec also sets "
        "model.trust_remote_code (ftq's plan adds it only where the operator allows remote code).",
    )
    parser.add_argument(
        "--process_group_timeout",
        type=int,
        metavar="SECONDS",
        help="Timeout of the process group's collectives, the first of which waits for rank 0 to load "
        "the model (ftq's plan sizes it from the model's bytes); never under 1800.",
    )
    train_py = parser.add_argument_group("train.py flags (instead of --spec)")
    hints = {"str": str, "int": int, "float": float, "bool": str2bool}
    for f in dataclasses.fields(TrainPyFlags):
        kind = str(f.type).split(" | ")[0]
        kwargs: dict[str, Any] = {"type": hints[kind], "default": None, "help": f.metadata.get("help")}
        if kind == "bool":
            # `--packing` alone means True, as with HfArgumentParser; `--packing False` is explicit.
            kwargs.update(nargs="?", const=True, metavar="True|False")
        train_py.add_argument(f"--{f.name}", **kwargs)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainerArgs:
    """Parse and validate; a bad combination ends here with one sentence (argparse exit status 2)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    flags = TrainPyFlags(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(TrainPyFlags)})
    given = flags.given()

    if ns.spec is not None:
        if given:
            parser.error(
                f"--spec and the train.py flags ({', '.join('--' + g for g in given)}) are exclusive; "
                "put those settings in the spec"
            )
        spec = _load_spec(parser, Path(ns.spec))
    else:
        if flags.model_name is None or flags.dataset_name is None:
            parser.error("give --spec spec.json, or --model_name and --dataset_name with the train.py flags")
        if flags.max_steps is not None and flags.num_train_epochs is not None:
            parser.error("set --max_steps or --num_train_epochs, not both")
        if not flags.use_peft_lora and any(g.startswith("lora_") for g in given):
            parser.error("--lora_* flags need --use_peft_lora True")
        try:
            spec = flags.to_job_spec()
        except (ValidationError, SpecFieldError) as err:
            parser.error(f"the flags do not make a valid job: {_first_error(err)}")

    if spec.model.trust_remote_code and not ns.trust_remote_code:
        # Code from the model repo runs only when the spec asks for it AND the launch says the operator
        # allowed it: ftq's plan adds `--trust_remote_code True` only to a submit its policy allowed, so
        # a spec.json that says so on its own (written by hand, or stored before the policy) runs none.
        print(
            "ftq: model.trust_remote_code is set but the launch does not allow remote code "
            "(--trust_remote_code True); loading without it",
            file=sys.stderr,
        )
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"trust_remote_code": False})})

    resume = ns.resume_from_checkpoint
    if resume is not None and resume != "latest" and not Path(resume).is_dir():
        parser.error(f"--resume_from_checkpoint {resume}: no such checkpoint folder (or use `latest`)")
    return TrainerArgs(
        spec=spec,
        output_dir=Path(ns.output_dir),
        resume_from_checkpoint=resume,
        from_train_py_flags=ns.spec is None,
        process_group_timeout=ns.process_group_timeout,
    )


def _load_spec(parser: argparse.ArgumentParser, path: Path) -> JobSpec:
    try:
        raw = json.loads(path.read_text())
    except OSError as err:
        parser.error(f"cannot read --spec {path}: {err.strerror}")
    except json.JSONDecodeError as err:
        parser.error(f"--spec {path} is not JSON: {err}")
    try:
        return JobSpec.model_validate(raw)
    except (ValidationError, SpecFieldError) as err:
        parser.error(f"--spec {path} is not a valid job spec: {_first_error(err)}")


def _first_error(err: ValidationError | SpecFieldError) -> str:
    if isinstance(err, SpecFieldError):
        return f"{'.'.join(str(p) for p in err.loc)}: {err.message}"
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return f"{loc}: {first['msg']}" if loc else first["msg"]
