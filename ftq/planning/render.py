"""Render a job spec into its launch: the accelerate config, the argv, `launch.sh` and `job.sbatch`.

Pure functions: no I/O, no torch, no clock. The same spec, job id, run dir and settings always give the
same plan, so a dry run shows exactly what a real run will start, and golden files can pin it.

The scripts' text is in templates/ (`launch.sh`, `job.sbatch`, `export.sbatch`), to be read next to the
golden files it renders to (tests/unit/ftq/golden); this module computes the values it is filled with.

Safety: every value that reaches a script is quoted (`shlex.quote` in shell lines, sbatch's own quoting
in `#SBATCH` lines) before it is filled in. Spec text becomes argv words or YAML data, never a script line
of its own. The only verbatim script text is operator-owned (`FTQ_SLURM_SETUP`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ftq.contract import runs
from ftq.contract.plans import DatasetPreflight, Estimate, Parallelism, Plan
from ftq.contract.spec import METHOD_TRAINERS, JobSpec, needs_fetch
from ftq.planning.timecost import time_estimate
from ftq.runtime.settings import Settings, slurm_env_lines

ACCELERATE_LAUNCH = ["-m", "accelerate.commands.launch"]
TRAINER_MODULE = "trainer"
# Node-local folder for DeepSpeed NVMe offload, one per job (never the shared run dir: it must be fast
# local disk).
NVME_OFFLOAD_ROOT = "/tmp/ftq-offload"
# Rendezvous ports: below Linux's ephemeral range (32768-60999), where an outgoing connection of any
# process on the node could already hold the port, and clear of torchrun's default 29500.
PORT_BASE = 20000
PORT_SPAN = 9500
# What torch's elastic agent forwards to its ranks: its defaults plus SLURM's time-limit warning.
ELASTIC_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# After SLURM's warning the trainer checkpoints at its next step: the lead time leaves this long for the
# step in flight on top of writing the checkpoint.
SIGNAL_STEP_MARGIN_S = 120
# The most --signal=...@N accepts (a 16-bit field in SLURM).
SIGNAL_MAX_S = 65535


def signal_lead_seconds(settings: Settings, estimate: Estimate | None) -> int:
    """How long before the time limit SLURM warns the job: the time to write the estimated checkpoint at
    FTQ_CHECKPOINT_WRITE_GBPS plus one step, in whole minutes, never under FTQ_SLURM_SIGNAL_GRACE_SECONDS
    (0 there: no warning at all). Without a disk estimate, that floor."""
    floor = settings.slurm_signal_grace_seconds
    disk = estimate.disk if estimate is not None else None
    if not floor or disk is None or not disk.checkpoint_bytes:
        return floor
    write_s = disk.checkpoint_bytes / (settings.checkpoint_write_gbps * 1e9)
    lead = math.ceil((write_s + SIGNAL_STEP_MARGIN_S) / 60) * 60
    return min(SIGNAL_MAX_S, max(floor, lead))


# The first collective's timeout never goes under torch's usual 30 min.
PROCESS_GROUP_TIMEOUT_MIN_S = 1800


def process_group_timeout_seconds(settings: Settings, estimate: Estimate | None) -> int | None:
    """The trainer's process-group timeout: the other ranks wait in the first collective while rank 0
    reads the model's 16-bit weights, so it is their bytes at FTQ_LOAD_BANDWIDTH_GBPS, in whole minutes,
    never under 30 min; None (the trainer's 30 min) without a parameter count."""
    if estimate is None or not estimate.num_parameters:
        return None
    load_s = estimate.num_parameters * 2 / (settings.load_bandwidth_gbps * 1e9)
    return max(PROCESS_GROUP_TIMEOUT_MIN_S, math.ceil(load_s / 60) * 60)


def cuda_env_line(spec: JobSpec, settings: Settings) -> str:
    """`export PYTORCH_CUDA_ALLOC_CONF=...` for a cuda job (the run's own value wins: the operator's,
    passed in its environment); empty for a CPU job or with FTQ_CUDA_ALLOC_CONF empty."""
    if spec.resources.device != "cuda" or not settings.cuda_alloc_conf:
        return ""
    value = shlex.quote(settings.cuda_alloc_conf)
    return (
        "# Fewer fragmentation OOMs hours in (FTQ_CUDA_ALLOC_CONF); a value in the run's environment wins\n"
        f'export PYTORCH_CUDA_ALLOC_CONF="${{PYTORCH_CUDA_ALLOC_CONF:-{value}}}"'
    )


# Accelerate config ----------------------------------------------------------------------------------------


def accelerate_config(
    spec: JobSpec, job_id: str = "job", parallelism: Parallelism | None = None
) -> dict[str, Any]:
    """The accelerate config file a careful `accelerate config` session would write for this spec, with
    the parallelism the estimate decided (HSDP, context parallelism).

    Every key is one `ClusterConfig.from_yaml_file` accepts (it refuses unknown keys).
    """
    res, dist, tr = spec.resources, spec.distributed, spec.training
    world = res.num_nodes * res.processes_per_node
    cpu = res.device == "cpu"
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": str(tr.mixed_precision),
        "num_machines": res.num_nodes,
        "num_processes": world,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": cpu,
    }
    strategy = str(dist.strategy)
    if strategy == "fsdp":
        cfg["distributed_type"] = "FSDP"
        replicate = parallelism.dp_replicate_size if parallelism is not None else 1
        cp = parallelism.cp_size if parallelism is not None else 1
        cfg["fsdp_config"] = _fsdp_config(spec, hybrid=replicate > 1)
        if dist.fsdp.version == 2 and parallelism is not None and (replicate > 1 or cp > 1):
            # accelerate's ParallelismConfig (FSDP2 only), as `accelerate config` writes it: the launch
            # passes it to every rank's Accelerator, which builds the (replicate, shard, cp) device mesh.
            cfg["parallelism_config"] = {
                "parallelism_config_cp_size": cp,
                "parallelism_config_dp_replicate_size": replicate,
                "parallelism_config_dp_shard_size": parallelism.dp_shard_size,
                "parallelism_config_tp_size": 1,
            }
    elif strategy == "deepspeed":
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = _deepspeed_config(spec, f"{NVME_OFFLOAD_ROOT}/{job_id}")
    elif strategy == "ddp" and world > 1:
        # MULTI_GPU on CPU too: accelerate launches MULTI_CPU with its simple launcher, one process per
        # machine (more only through mpirun), while MULTI_GPU goes through torchrun and starts all of them;
        # with `use_cpu` the processes then join over gloo as MULTI_CPU.
        cfg["distributed_type"] = "MULTI_GPU"
    else:
        # One process (strategy none, or ddp over a world of one, which `--multi_gpu` refuses).
        cfg["distributed_type"] = "NO"
    return cfg


def _fsdp_config(spec: JobSpec, hybrid: bool = False) -> dict[str, Any]:
    fsdp = spec.distributed.fsdp
    state_dict = "SHARDED_STATE_DICT" if fsdp.state_dict_type == "sharded" else "FULL_STATE_DICT"
    common = {
        "fsdp_activation_checkpointing": fsdp.activation_checkpointing,
        # One FSDP unit per decoder layer (the model's `_no_split_modules`): the full weights are gathered a
        # layer at a time as it runs, never the whole model on one rank.
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        # Meta-device init on every rank, real weights on rank 0 only: the 70B CPU RAM fix.
        "fsdp_cpu_ram_efficient_loading": fsdp.cpu_ram_efficient_loading,
        "fsdp_offload_params": fsdp.offload_params,
        # Sharded intermediate checkpoints are fast and resumable; the trainer gathers a full state
        # dict only for final/.
        "fsdp_state_dict_type": state_dict,
        "fsdp_version": fsdp.version,
    }
    if fsdp.version == 2:
        return {**common, "fsdp_reshard_after_forward": fsdp.reshard_after_forward}
    # FSDP1 broadcasts rank 0's weights to the ranks that built on `meta` with sync_module_states,
    # which cpu_ram_efficient_loading needs. accelerate allows it only on an accelerator; the trainer
    # sets it up itself on a CPU launch (trainer.train), so a CPU rehearsal loads as a GPU job does.
    return {
        **common,
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False,
        # FSDP1 spells "reshard after forward" as a sharding strategy; HSDP (shard within each node,
        # replicate across nodes, where the estimate found a node's shard fits) as its hybrid forms.
        "fsdp_sharding_strategy": (
            ("HYBRID_SHARD" if fsdp.reshard_after_forward else "_HYBRID_SHARD_ZERO2")
            if hybrid
            else ("FULL_SHARD" if fsdp.reshard_after_forward else "SHARD_GRAD_OP")
        ),
        # Rank 0's weights are broadcast to the others; needed with cpu_ram_efficient_loading.
        "fsdp_sync_module_states": spec.resources.device == "cuda" or fsdp.cpu_ram_efficient_loading,
        # PEFT (frozen and trainable params in one FSDP unit) needs the original parameters.
        "fsdp_use_orig_params": True,
    }


def _deepspeed_config(spec: JobSpec, nvme_dir: str) -> dict[str, Any]:
    ds = spec.distributed.deepspeed
    cfg: dict[str, Any] = {
        # `standard`: one torchrun per node, started by us (srun), not pdsh over ssh.
        "deepspeed_multinode_launcher": "standard",
        # Must equal the trainer's value: transformers refuses a mismatch with the DeepSpeed config.
        "gradient_accumulation_steps": spec.training.gradient_accumulation_steps,
        "offload_optimizer_device": str(ds.offload_optimizer),
        "offload_param_device": str(ds.offload_params),
        "zero3_init_flag": ds.zero_stage == 3 and ds.zero3_init,
        "zero_stage": ds.zero_stage,
    }
    if ds.zero_stage == 3:
        cfg["zero3_save_16bit_model"] = ds.save_16bit_model
    if ds.offload_optimizer == "nvme":
        cfg["offload_optimizer_nvme_path"] = nvme_dir
    if ds.offload_params == "nvme":
        cfg["offload_param_nvme_path"] = nvme_dir
    return cfg


def config_yaml(cfg: dict[str, Any]) -> str:
    # Sorted keys, block style: the form `accelerate config` writes and a reviewer can diff.
    return yaml.safe_dump(cfg, sort_keys=True, default_flow_style=False)


# Launch argv ------------------------------------------------------------------------------------------------


def default_port(job_id: str) -> int:
    """A rendezvous port from the job id: stable across renders, spread so concurrent jobs rarely share."""
    digest = hashlib.sha256(job_id.encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN


def trainer_argv(
    run_dir: Path,
    resume_from_checkpoint: str | None,
    *,
    trust_remote_code: bool = False,
    process_group_timeout: int | None = None,
) -> list[str]:
    argv = ["-m", TRAINER_MODULE, "--spec", str(run_dir / runs.SPEC), "--output_dir", str(run_dir)]
    if process_group_timeout is not None:
        # Sized from the model's load (process_group_timeout_seconds).
        argv += ["--process_group_timeout", str(process_group_timeout)]
    if trust_remote_code:
        # The plan rendered when the operator's policy let this job run remote code (checked at submit):
        # the trainer passes trust_remote_code to transformers only with this flag and the spec's field.
        argv += ["--trust_remote_code", "True"]
    if resume_from_checkpoint:
        argv += ["--resume_from_checkpoint", resume_from_checkpoint]
    return argv


def launch_argv(
    spec: JobSpec,
    *,
    run_dir: Path,
    settings: Settings,
    port: int,
    resume_from_checkpoint: str | None,
    estimate: Estimate | None = None,
) -> list[str]:
    """The local launch: one `accelerate launch` on this host."""
    res = spec.resources
    return [
        settings.python,
        *ACCELERATE_LAUNCH,
        "--config_file", str(run_dir / runs.ACCELERATE_CONFIG),
        "--num_processes", str(res.num_nodes * res.processes_per_node),
        "--num_machines", str(res.num_nodes),
        "--main_process_port", str(port),
        *trainer_argv(
            run_dir,
            resume_from_checkpoint,
            trust_remote_code=spec.model.trust_remote_code,
            process_group_timeout=process_group_timeout_seconds(settings, estimate),
        ),
    ]  # fmt: skip


def slurm_node_argv(
    spec: JobSpec,
    *,
    run_dir: Path,
    settings: Settings,
    port: int,
    resume_from_checkpoint: str | None,
    estimate: Estimate | None = None,
) -> list[str]:
    """What job.sbatch runs on every node under srun (a first run; a requeued one adds
    `--resume_from_checkpoint latest`). `$SLURM_NODEID` and `$MASTER_ADDR` are that node's, set by SLURM
    and by the script; the port is the script's MASTER_PORT."""
    res = spec.resources
    return [
        settings.python,
        *ACCELERATE_LAUNCH,
        "--machine_rank", "$SLURM_NODEID",
        "--config_file", str(run_dir / runs.ACCELERATE_CONFIG),
        "--num_processes", str(res.num_nodes * res.processes_per_node),
        "--num_machines", str(res.num_nodes),
        "--main_process_ip", "$MASTER_ADDR",
        "--main_process_port", str(port),
        "--rdzv_backend", "static",
        "--same_network",
        *trainer_argv(
            run_dir,
            resume_from_checkpoint,
            trust_remote_code=spec.model.trust_remote_code,
            process_group_timeout=process_group_timeout_seconds(settings, estimate),
        ),
    ]  # fmt: skip


# launch.sh ----------------------------------------------------------------------------------------------


def _q(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _argv_lines(argv: list[str], head: int, indent: str = "  ") -> str:
    """argv as one shell command: the first `head` words, then one `--flag value` per line; all quoted."""
    groups: list[list[str]] = [argv[:head]]
    for word in argv[head:]:
        if word.startswith("-"):
            groups.append([word])
        else:
            groups[-1].append(word)
    return (" \\\n" + indent).join(_q(g) for g in groups)


def _pairs(words: list[str]) -> list[list[str]]:
    return [words[i : i + 2] for i in range(0, len(words), 2)]


FETCH_MODULE = "trainer.fetch"


def fetch_lines(spec: JobSpec, python: str) -> str:
    """launch.sh's fetch step when the spec names a hub model or dataset: `python -m trainer.fetch` once,
    before the ranks start (into the launcher's HF_HUB_CACHE, with its HF_TOKEN: neither is written here),
    its failure the run's exit status; then HF_HUB_OFFLINE=1, so the ranks load from that cache alone.
    Empty when every model and the dataset are local paths."""
    if not needs_fetch(spec):
        return ""
    status = runs.EXIT_STATUS
    return "\n".join(
        [
            "# The fetch step: hub models and datasets downloaded once, before the ranks start (train.log)",
            f"{_q([python, '-m', FETCH_MODULE, '--spec', runs.SPEC])} >> {runs.TRAIN_LOG} 2>&1",
            "status=$?",
            'if [ "$status" -ne 0 ]; then',
            f"  printf '%s\\n' \"$status\" > .{status}.tmp && mv -f -- .{status}.tmp {status}",
            '  exit "$status"',
            "fi",
            "export HF_HUB_OFFLINE=1",
        ]
    )


def sbatch_fetch_lines(spec: JobSpec, python: str, run_dir: Path) -> str:
    """job.sbatch's fetch step: on the batch script's node, once, into the shared HF_HUB_CACHE, before srun
    starts a rank (under `set -e` its failure is the job's exit status); then HF_HUB_OFFLINE=1 for every
    node's ranks. Empty when every model and the dataset are local paths."""
    if not needs_fetch(spec):
        return ""
    return "\n".join(
        [
            "# The fetch step: hub models and datasets downloaded once, here, before srun starts any rank;",
            "# the ranks of every node then load from the shared cache (HF_HUB_CACHE) offline.",
            _q([python, "-m", FETCH_MODULE, "--spec", str(run_dir / runs.SPEC)]),
            "export HF_HUB_OFFLINE=1\n",
        ]
    )


def plan_env_lines(spec: JobSpec, parallelism: Parallelism | None, *, slurm_python: str | None = None) -> str:
    """`export` lines for what the plan decided and only the trainer can apply (no accelerate config key
    carries them): FTQ_SYNC_EACH_BATCH=1 (FSDP full fine-tuning with gradient accumulation: accelerate's
    GradientAccumulationPlugin sync_each_batch, so FSDP2 does not keep full-size gradients between
    micro-batches) and FTQ_ZERO_HPZ_PARTITION_SIZE (ZeRO++ hpZ, the DeepSpeed config's
    zero_hpz_partition_size). On SLURM (whole nodes), ACCELERATE_CPU_AFFINITY binds each rank to the CPUs
    of its GPU's NUMA node where nvidia-ml-py is there to say which those are. Empty when none apply."""
    lines = []
    if parallelism is not None and parallelism.sync_each_batch:
        lines += [
            "# Gradients reduce-scattered at every micro-batch (accelerate's sync_each_batch): under no_sync",
            "# FSDP2 would keep full-size gradients on every GPU until the last one",
            "export FTQ_SYNC_EACH_BATCH=1",
        ]
    if parallelism is not None and parallelism.zero_hpz_partition_size:
        lines += [
            "# ZeRO++ hpZ: a 16-bit copy of the weights sharded within each node (gathers stay on NVLink)",
            f"export FTQ_ZERO_HPZ_PARTITION_SIZE={parallelism.zero_hpz_partition_size}",
        ]
    if slurm_python is not None and spec.resources.device == "cuda":
        py = shlex.quote(slurm_python)
        lines += [
            "# Each rank on the CPUs of its GPU's NUMA node (accelerate asks nvidia-ml-py which)",
            f"if {py} -c 'import pynvml' > /dev/null 2>&1; then",
            "  export ACCELERATE_CPU_AFFINITY=1",
            "else",
            '  echo "ftq: nvidia-ml-py is not installed: ranks are not bound to their GPU\'s CPUs" >&2',
            "fi",
        ]
    return "\n".join(lines)


VLLM_CHECK = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
NCCL_CHECK_MODULE = "ftq.planning.nccl_check"
# A fabric measured below this share of FTQ_INTER_NODE_GBPS is reported (a job.warning): NCCL fell
# back to sockets, or the job got the wrong NICs.
NCCL_WARN_FRACTION = 0.25


def _uses_vllm(spec: JobSpec) -> bool:
    grpo = spec.training.grpo
    return spec.training.method == "grpo" and grpo is not None and grpo.use_vllm


def local_check_lines(spec: JobSpec, python: str) -> str:
    """launch.sh's checks on the host that runs the job: vllm importable where training.grpo.use_vllm
    asks for it (it is the node's Python that must have it, not the API's), failing with a clear error
    as the run's exit status. Empty when none apply."""
    if not _uses_vllm(spec):
        return ""
    status = runs.EXIT_STATUS
    message = f"ftq: training.grpo.use_vllm needs vllm in {python} on this host, and it is not installed"
    return "\n".join(
        [
            f"if ! {_q([python, '-c', VLLM_CHECK])}; then",
            f"  echo {shlex.quote(message)} >> {runs.TRAIN_LOG}",
            f"  printf '%s\\n' 3 > .{status}.tmp && mv -f -- .{status}.tmp {status}",
            "  exit 3",
            "fi",
        ]
    )


def node_check_lines(spec: JobSpec, settings: Settings, run_dir: Path, cpus_per_task: int) -> str:
    """job.sbatch's checks on every node before the launch: vllm importable where the job uses it (the
    nodes' Python, not the API's: a clear error, and the job's exit status), and for a multi-node cuda
    job a short NCCL all-reduce across all its GPUs (ftq.planning.nccl_check) that logs the measured bus
    bandwidth and reports a job.warning when it is under NCCL_WARN_FRACTION of FTQ_INTER_NODE_GBPS (a
    socket fallback makes a job 10-50x slower and says nothing). Empty when none apply."""
    res = spec.resources
    py = shlex.quote(settings.python)
    srun = f"srun --nodes={res.num_nodes} --ntasks-per-node=1 --cpus-per-task={cpus_per_task}"
    lines: list[str] = []
    if _uses_vllm(spec):
        message = (
            f"ftq: training.grpo.use_vllm needs vllm in {settings.python} on every node; a node lacks it"
        )
        lines += [
            "# vllm on every node (training.grpo.use_vllm): the nodes' Python, not the API's",
            f"if ! {srun} {py} -c {shlex.quote(VLLM_CHECK)}; then",
            f"  echo {shlex.quote(message)} >&2",
            "  exit 3",
            "fi",
        ]
    if res.device == "cuda" and res.num_nodes > 1:
        expect = settings.inter_node_gbps
        warnings = shlex.quote(str(run_dir / runs.WARNINGS))
        lines += [
            "# NCCL's bus bandwidth across the nodes, measured before hours of collectives depend on it;",
            f"# under {NCCL_WARN_FRACTION:g} x {expect:g} GB/s (FTQ_INTER_NODE_GBPS): a job.warning only.",
            f"{srun} timeout 300 bash -c \\",
            '  \'exec "$0" -m torch.distributed.run --nnodes "$SLURM_NNODES" \\',
            f'  --node-rank "$SLURM_NODEID" --nproc-per-node {res.processes_per_node} \\',
            '  --master-addr "$MASTER_ADDR" \\',
            f'  --master-port "$((MASTER_PORT + 1))" -m {NCCL_CHECK_MODULE} "$@"\' \\',
            f"  {py} --expect-gbps {expect:g} --warn-below {NCCL_WARN_FRACTION * expect:g} \\",
            f"  --warnings {warnings} \\",
            '  || echo "ftq: the NCCL bandwidth check did not complete" >&2',
        ]
    return "\n".join(lines)


def _block(text: str) -> str:
    """A block of script lines followed by a blank line; empty stays empty (its line is left out)."""
    return text + "\n" if text else ""


def launch_script(
    run_dir: Path,
    argv: list[str],
    cuda_env: str = "",
    fetch: str = "",
    plan_env: str = "",
    checks: str = "",
) -> str:
    """`launch.sh` (templates/launch.sh): run the launch, log to train.log, then record its exit status."""
    return _fill(
        "launch.sh",
        run_dir=shlex.quote(str(run_dir)),
        fetch=fetch,
        cuda_env=cuda_env,
        plan_env=plan_env,
        checks=checks,
        exit_status=runs.EXIT_STATUS,
        train_log=runs.TRAIN_LOG,
        command=_argv_lines(argv, 1 + len(ACCELERATE_LAUNCH)),
    )


# job.sbatch -------------------------------------------------------------------------------------------------

_SBATCH_BARE = re.compile(r"^[A-Za-z0-9_.:/=,+@%-]+$")


def _sbatch_value(value: str) -> str:
    """A value as sbatch reads `#SBATCH` lines: blanks split, `"` quotes, `\\` escapes, `#` comments."""
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ValueError(f"#SBATCH value {value!r} contains a line break")
    if _SBATCH_BARE.match(value):
        return value
    escaped = re.sub(r'([\\"#])', r"\\\1", value)
    return f'"{escaped}"'


def _sbatch_path(path: Path) -> str:
    # `%` starts a filename pattern (%j, %N) in --output; `%%` is a literal percent sign.
    return _sbatch_value(str(path).replace("%", "%%"))


def _extra_sbatch_args(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("--") or "\x00" in line:
            raise ValueError(f"FTQ_SLURM_EXTRA_ARGS lines must be sbatch options (`--...`): {line!r}")
        out.append(line)
    return out


def _priority_args(spec: JobSpec, settings: Settings) -> list[str]:
    """The job's priority in SLURM's terms (SLURM schedules; ftq only says how much the job matters):
    low is a positive --nice (FTQ_SLURM_NICE_LOW), high the operator's QOS (FTQ_SLURM_QOS_HIGH)."""
    out = []
    if spec.priority == "low" and settings.slurm_nice_low:
        out.append(f"--nice={settings.slurm_nice_low}")
    qos = {
        "high": settings.slurm_qos_high or settings.slurm_qos,
        "low": settings.slurm_qos_low or settings.slurm_qos,
    }.get(spec.priority, settings.slurm_qos)
    if qos:
        out.append(f"--qos={_sbatch_value(qos)}")
    return out


def sbatch_script(
    spec: JobSpec,
    *,
    job_id: str,
    run_dir: Path,
    settings: Settings,
    port: int,
    resume_from_checkpoint: str | None,
    estimate: Estimate | None = None,
) -> str:
    """`job.sbatch` (templates/job.sbatch): one `accelerate launch` per node under srun."""
    res = spec.resources
    cpus_per_task = settings.slurm_cpus_per_task or (
        res.processes_per_node * (settings.slurm_cpus_per_gpu if res.device == "cuda" else 1)
    )
    resume = "()"
    if resume_from_checkpoint:
        resume = f"(--resume_from_checkpoint {shlex.quote(resume_from_checkpoint)})"
    trainer_args = _pairs(
        trainer_argv(
            run_dir,
            None,
            trust_remote_code=spec.model.trust_remote_code,
            process_group_timeout=process_group_timeout_seconds(settings, estimate),
        )
    )
    lead = signal_lead_seconds(settings, estimate)
    parallelism = estimate.parallelism if estimate is not None else None
    return _fill(
        "job.sbatch",
        plan_env=_block(plan_env_lines(spec, parallelism, slurm_python=settings.python)),
        node_checks=_block(node_check_lines(spec, settings, run_dir, cpus_per_task)),
        sbatch_header=_sbatch_header(_job_sbatch_args(spec, job_id, run_dir, settings, cpus_per_task, lead)),
        run_dir=shlex.quote(str(run_dir)),
        exit_status=runs.EXIT_STATUS,
        site_setup=_site_setup(settings),
        nccl_env=_nccl_env(settings),
        cuda_env=(cuda_env_line(spec, settings) + "\n") if res.device == "cuda" else "",
        fetch=sbatch_fetch_lines(spec, settings.python, run_dir),
        port=str(port),
        elastic_signals=ELASTIC_SIGNALS,
        shutdown_timeout=str(max(lead, 30)),
        resume_args=resume,
        checkpoints=runs.CHECKPOINTS,
        checkpoint_prefix=runs.CHECKPOINT_PREFIX,
        num_nodes=str(res.num_nodes),
        cpus_per_task=str(cpus_per_task),
        python=shlex.quote(settings.python),
        accelerate_config=shlex.quote(str(run_dir / runs.ACCELERATE_CONFIG)),
        world_size=str(res.num_nodes * res.processes_per_node),
        trainer_args=" \\\n  ".join(_q(pair) for pair in trainer_args),
    )


def _job_sbatch_args(
    spec: JobSpec, job_id: str, run_dir: Path, settings: Settings, cpus_per_task: int, signal_lead: int
) -> list[str]:
    """A job's `#SBATCH` options: its nodes and devices, where it runs, its priority, its requeue and
    time-limit warning, then the operator's extra options."""
    res = spec.resources
    args = [f"--job-name={_sbatch_value('ftq-' + job_id)}", f"--nodes={res.num_nodes}", "--ntasks-per-node=1"]
    if res.device == "cuda":
        args.append(f"--gres=gpu:{res.processes_per_node}")
    args.append(f"--cpus-per-task={cpus_per_task}")
    if settings.slurm_mem:
        args.append(f"--mem={_sbatch_value(settings.slurm_mem)}")
    if settings.slurm_exclusive or (res.device == "cuda" and res.num_nodes > 1):
        # Whole nodes for a multi-node GPU job: its ranks need every NIC, the NUMA-local CPUs of their
        # GPUs and no neighbour's traffic on the fabric (FTQ_SLURM_EXCLUSIVE for every job).
        args.append("--exclusive")
    args += _placement_args(spec, settings)
    args += _priority_args(spec, settings)
    args += _output_args(run_dir)
    # Preempted or failed-node jobs go back in the queue and resume from their newest checkpoint.
    args.append("--requeue")
    if signal_lead:
        # A warning before the time limit, to this script only (B:): it asks the trainer to checkpoint,
        # early enough to write the estimated checkpoint (signal_lead_seconds).
        args.append(f"--signal=B:USR1@{signal_lead}")
    return args + _extra_sbatch_args(settings.slurm_extra_args)


def _placement_args(spec: JobSpec, settings: Settings) -> list[str]:
    """The time limit, partition and account: the spec's, else the operator's defaults."""
    slurm = spec.resources.slurm
    partition = slurm.partition or settings.slurm_partition
    account = slurm.account or settings.slurm_account
    args = []
    if slurm.time_limit:
        args.append(f"--time={_sbatch_value(slurm.time_limit)}")
    if partition:
        args.append(f"--partition={_sbatch_value(partition)}")
    if account:
        args.append(f"--account={_sbatch_value(account)}")
    return args


def _output_args(run_dir: Path) -> list[str]:
    """The script runs in its folder and appends its output to the train.log there."""
    return [
        f"--chdir={_sbatch_value(str(run_dir))}",
        f"--output={_sbatch_path(run_dir / runs.TRAIN_LOG)}",
        "--open-mode=append",
    ]


def _sbatch_header(args: list[str]) -> str:
    return "\n".join(f"#SBATCH {a}" for a in args)


def _site_setup(settings: Settings) -> str:
    """The operator's FTQ_SLURM_SETUP under its heading, then a blank line; empty without one."""
    setup = settings.slurm_setup.strip("\n")
    return f"# Site setup (FTQ_SLURM_SETUP)\n{setup}\n" if setup else ""


def _nccl_env(settings: Settings) -> str:
    """FTQ_SLURM_NCCL_ENV as quoted exports under their heading, then a blank line; empty without it."""
    nccl = slurm_env_lines(settings.slurm_nccl_env)
    if not nccl:
        return ""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in nccl)
    return "# Network settings for NCCL (FTQ_SLURM_NCCL_ENV); srun hands them to every node\n" + exports


# Templates ----------------------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@functools.cache
def _template(name: str) -> str:
    """templates/<name> without its `##` notes for the reader."""
    text = (resources.files(__package__) / "templates" / name).read_text(encoding="utf-8")
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("##"))


def _fill(name: str, **values: str) -> str:
    """templates/<name> with each {{name}} replaced by its value, once (a value is never read as a
    template). A line that is only a placeholder whose value is empty is left out. Every placeholder
    needs a value and every value a placeholder, so a renamed one cannot go unnoticed."""
    text = _template(name)
    names = set(_PLACEHOLDER.findall(text))
    if names != set(values):
        raise KeyError(f"templates/{name} has {sorted(names)}, given {sorted(values)}")
    lines = [
        line
        for line in text.splitlines(keepends=True)
        if not ((m := _PLACEHOLDER.fullmatch(line.rstrip("\n"))) and values[m[1]] == "")
    ]
    return _PLACEHOLDER.sub(lambda m: values[m[1]], "".join(lines))


# Plan ---------------------------------------------------------------------------------------------------


def render_plan(
    spec: JobSpec,
    *,
    job_id: str,
    run_dir: Path,
    settings: Settings,
    estimate: Estimate | None = None,
    main_process_port: int | None = None,
    resume_from_checkpoint: str | None = None,
    dataset: DatasetPreflight | None = None,
) -> Plan:
    """The whole plan for one job. Dry runs and real runs call this with the same inputs."""
    run_dir = Path(run_dir)
    port = main_process_port if main_process_port is not None else default_port(job_id)
    cfg = accelerate_config(spec, job_id, estimate.parallelism if estimate is not None else None)
    argv = launch_argv(
        spec,
        run_dir=run_dir,
        settings=settings,
        port=port,
        resume_from_checkpoint=resume_from_checkpoint,
        estimate=estimate,
    )
    command = argv
    sbatch = None
    if spec.resources.launcher == "slurm":
        # The plan shows what job.sbatch runs on each node, not a one-host launch that never runs.
        command = slurm_node_argv(
            spec,
            run_dir=run_dir,
            settings=settings,
            port=port,
            resume_from_checkpoint=resume_from_checkpoint,
            estimate=estimate,
        )
        sbatch = sbatch_script(
            spec,
            job_id=job_id,
            run_dir=run_dir,
            settings=settings,
            port=port,
            resume_from_checkpoint=resume_from_checkpoint,
            estimate=estimate,
        )
    te = time_estimate(
        spec,
        settings,
        parameters=estimate.num_parameters if estimate is not None else None,
        run_tokens=dataset.run_tokens if dataset is not None else None,
        trainable=estimate.trainable_parameters if estimate is not None else None,
        estimate=estimate,
    )
    return Plan(
        accelerate_config=cfg,
        accelerate_config_yaml=config_yaml(cfg),
        command=command,
        sbatch_script=sbatch,
        trainer=METHOD_TRAINERS[str(spec.training.method)],
        trainer_args={
            "spec": str(run_dir / runs.SPEC),
            "output_dir": str(run_dir),
            "resume_from_checkpoint": resume_from_checkpoint,
        },
        estimate=estimate,
        time_estimate=te,
        # The dataset section repeats the one estimate next to the token counts it rests on.
        dataset=dataset.model_copy(update={"time_estimate": te}) if dataset is not None else None,
        launch_script=launch_script(
            run_dir,
            argv,
            cuda_env_line(spec, settings),
            fetch_lines(spec, argv[0]),
            plan_env=plan_env_lines(spec, estimate.parallelism if estimate is not None else None),
            checks=local_check_lines(spec, argv[0]),
        ),
    )


# Exports ------------------------------------------------------------------------------------------------

EXPORT_MODULE = "trainer.export"
# launch.sh runs the export under a shell of its own, as a job's runs under accelerate's launcher: a local
# cancel signals the processes below the launch script's child (worker.launchers.local `_signal_ranks`),
# so the export itself gets the SIGTERM. `; exit` keeps bash from exec'ing the command in its place.
EXPORT_LAUNCHER = ["bash", "-c", '"$@"; exit "$?"', "ftq-export"]


def export_argv(
    export_dir: Path, settings: Settings, module: str = EXPORT_MODULE, request: str = runs.EXPORT_REQUEST
) -> list[str]:
    """One process: `python -m trainer.export --request exports/<id>/export.json` (or an evaluation's:
    `trainer.evaluate`, `evaluations/<id>/evaluation.json`)."""
    return [settings.python, "-m", module, "--request", str(export_dir / request)]


def export_sbatch_script(
    spec: JobSpec,
    *,
    export_id: str,
    export_dir: Path,
    settings: Settings,
    argv: list[str] | None = None,
    devices: int = 1,
) -> str:
    """`job.sbatch` of an export (templates/export.sbatch): one task on one node (`devices` GPUs of it for
    a cuda job: one for an export, what the base needs for an evaluation), under the job's partition,
    account and time limit, recording its exit status as a job's does."""
    return _fill(
        "export.sbatch",
        sbatch_header=_sbatch_header(_export_sbatch_args(spec, export_id, export_dir, settings, devices)),
        run_dir=shlex.quote(str(export_dir)),
        exit_status=runs.EXIT_STATUS,
        site_setup=_site_setup(settings),
        command=_argv_lines(argv or export_argv(export_dir, settings), 3),
    )


def _export_sbatch_args(
    spec: JobSpec, export_id: str, export_dir: Path, settings: Settings, devices: int = 1
) -> list[str]:
    args = [f"--job-name={_sbatch_value('ftq-' + export_id)}", "--nodes=1", "--ntasks=1"]
    gpus = max(1, devices)
    if spec.resources.device == "cuda":
        args.append(f"--gres=gpu:{gpus}")
    # As a one-process job of this spec asks: each GPU's share of CPUs on cuda, one CPU on cpu.
    cpus = settings.slurm_cpus_per_task or (
        settings.slurm_cpus_per_gpu * gpus if spec.resources.device == "cuda" else 1
    )
    args.append(f"--cpus-per-task={cpus}")
    if settings.slurm_mem:
        args.append(f"--mem={_sbatch_value(settings.slurm_mem)}")
    args += _placement_args(spec, settings)
    args += _output_args(export_dir)
    return args + _extra_sbatch_args(settings.slurm_extra_args)


def render_export_plan(
    spec: JobSpec,
    *,
    export_id: str,
    export_dir: Path,
    settings: Settings,
    module: str = EXPORT_MODULE,
    request: str = runs.EXPORT_REQUEST,
    devices: int = 1,
) -> Plan:
    """The launch of one export, as a Plan the launchers take (no accelerate config: one process). An
    evaluation is launched the same way (`module` trainer.evaluate, `request` evaluation.json), on the
    `devices` GPUs of one node its base needs (worker.evaluations.evaluation_gpus)."""
    argv = export_argv(export_dir, settings, module, request)
    sbatch = None
    if spec.resources.launcher == "slurm":
        sbatch = export_sbatch_script(
            spec, export_id=export_id, export_dir=export_dir, settings=settings, argv=argv, devices=devices
        )
    return Plan(
        accelerate_config={},
        accelerate_config_yaml="",
        command=argv,
        sbatch_script=sbatch,
        trainer_args={"request": str(export_dir / request)},
        launch_script=launch_script(export_dir, [*EXPORT_LAUNCHER, *argv], cuda_env_line(spec, settings)),
    )


# A deployment (a serving engine, worker.deployments) ------------------------------------------------------

ENGINE_MODULE = "ftq.engine.serve"


def render_engine_plan(
    deployment_id: str, *, folder: Path, settings: Settings, launcher: str, device: str, devices: int
) -> Plan:
    """The launch of one serving engine, as a Plan the launchers take: one process (`python -m
    ftq.engine.serve <folder>`, which becomes vLLM's server) on `devices` GPUs of one node (tensor
    parallel) or one CPU slot; on SLURM, one task on one node with those GPUs, under the operator's
    partition and account."""
    argv = [settings.python, "-m", ENGINE_MODULE, str(folder)]
    sbatch = None
    if launcher == "slurm":
        args = [f"--job-name={_sbatch_value('ftq-' + deployment_id)}", "--nodes=1", "--ntasks=1"]
        if device == "cuda":
            args.append(f"--gres=gpu:{devices}")
        cpus = settings.slurm_cpus_per_task or (
            settings.slurm_cpus_per_gpu * devices if device == "cuda" else 1
        )
        args.append(f"--cpus-per-task={cpus}")
        if settings.slurm_mem:
            args.append(f"--mem={_sbatch_value(settings.slurm_mem)}")
        if settings.slurm_partition:
            args.append(f"--partition={_sbatch_value(settings.slurm_partition)}")
        if settings.slurm_account:
            args.append(f"--account={_sbatch_value(settings.slurm_account)}")
        args += _output_args(folder) + _extra_sbatch_args(settings.slurm_extra_args)
        sbatch = _fill(
            "export.sbatch",
            sbatch_header=_sbatch_header(args),
            run_dir=shlex.quote(str(folder)),
            exit_status=runs.EXIT_STATUS,
            site_setup=_site_setup(settings),
            command=_argv_lines(argv, 3),
        )
    return Plan(
        accelerate_config={},
        accelerate_config_yaml="",
        command=argv,
        sbatch_script=sbatch,
        trainer_args={"engine": str(folder)},
        launch_script=launch_script(folder, [*EXPORT_LAUNCHER, *argv]),
    )
