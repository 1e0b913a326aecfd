"""ftq.planning.render in process: golden files for the example jobs, every config through accelerate's own
loader
and launch-argument handling, what reaches sbatch. The rendered scripts run for real (and one real
2-process `accelerate launch`) in tests/integration/worker/test_launch_scripts.py and
test_accelerate_launch.py."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig
from pydantic import ValidationError

from ftq.contract.plans import DatasetPreflight, Estimate, Plan
from ftq.contract.spec import JobSpec
from ftq.planning.estimate import estimate_disk, estimate_memory, load_model_config
from ftq.planning.render import default_port, render_plan
from ftq.runtime.settings import Settings
from tests.harness import EXAMPLES as EXAMPLES_DIR
from tests.harness import MODEL_CONFIGS

GOLDEN = Path(__file__).parents[1] / "golden"
EXAMPLES = {
    "llama2-70b-fsdp": EXAMPLES_DIR / "llama2-70b-fsdp.yaml",
    "llama2-70b-fsdp1": EXAMPLES_DIR / "llama2-70b-fsdp1.yaml",
    "falcon-180b-lora-zero3": EXAMPLES_DIR / "falcon-180b-lora-zero3.yaml",
}
# Each example's model config (tests/fixtures), for the estimate its plan is rendered with.
EXAMPLE_MODELS = {
    "llama2-70b-fsdp": "llama-2-70b-hf",
    "llama2-70b-fsdp1": "llama-2-70b-hf",
    "falcon-180b-lora-zero3": "falcon-180B",
}
GOLDEN_JOB = "job_0123456789abcdef"
GOLDEN_RUN_DIR = Path("/shared/ftq/runs") / GOLDEN_JOB

# The accelerate config the Falcon 180B guide launches with, verbatim (single node: 1 machine, 8 processes).
FALCON_GUIDE_CONFIG = yaml.safe_load(
    textwrap.dedent("""\
    compute_environment: LOCAL_MACHINE
    debug: false
    deepspeed_config:
      deepspeed_multinode_launcher: standard
      gradient_accumulation_steps: 1
      offload_optimizer_device: none
      offload_param_device: none
      zero3_init_flag: true
      zero3_save_16bit_model: true
      zero_stage: 3
    distributed_type: DEEPSPEED
    downcast_bf16: 'no'
    machine_rank: 0
    main_training_function: main
    mixed_precision: bf16
    num_machines: 1
    num_processes: 8
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: false
    """)
)


def settings(**over: Any) -> Settings:
    """Settings independent of the caller's FTQ_* environment (init values win over the environment)."""
    base: dict[str, Any] = {
        "python": "/opt/ftq/.venv/bin/python",
        "slurm_partition": "gpu",
        "slurm_account": None,
        "slurm_setup": "module load cuda/12.4",
        "slurm_extra_args": "",
        "slurm_cpus_per_task": None,
        "slurm_cpus_per_gpu": 10,
        "slurm_mem": "0",
        "slurm_exclusive": False,
        "slurm_signal_grace_seconds": 300,
        "slurm_nccl_env": "NCCL_SOCKET_IFNAME=ib0\nNCCL_IB_HCA=mlx5",
    }
    base.update(over)
    return Settings(**base)


def example(name: str) -> JobSpec:
    return JobSpec.model_validate(yaml.safe_load(EXAMPLES[name].read_text()))


def example_estimate(name: str) -> Estimate:
    """The memory and disk estimate a submit computes for the example (its model's config.json)."""
    spec = example(name)
    cfg, reason = load_model_config(str(MODEL_CONFIGS / EXAMPLE_MODELS[name]))
    assert cfg is not None, reason
    est = estimate_memory(spec, cfg, device_memory_bytes=80 * 1024**3)
    est.disk = estimate_disk(spec, cfg)
    return est


def golden_plan(name: str, **over: Any) -> Plan:
    return render_plan(
        example(name),
        job_id=GOLDEN_JOB,
        run_dir=GOLDEN_RUN_DIR,
        settings=settings(**over),
        estimate=example_estimate(name),
    )


def spec_for(**parts: Any) -> JobSpec:
    body: dict[str, Any] = {
        "model": {"name_or_path": "./models/tiny"},
        "dataset": {"name_or_path": "./data/train.jsonl"},
        "training": {"max_steps": 10},
    }
    body.update(parts)
    return JobSpec.model_validate(body)


# Golden files ----------


def _golden_files(name: str) -> dict[str, str]:
    plan = golden_plan(name)
    assert plan.sbatch_script is not None
    return {
        f"{name}.accelerate_config.yaml": plan.accelerate_config_yaml,
        f"{name}.job.sbatch": plan.sbatch_script,
        f"{name}.launch.sh": plan.launch_script,
        f"{name}.argv.json": json.dumps(plan.command, indent=2) + "\n",
    }


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_golden_files(name: str) -> None:
    update = os.environ.get("FTQ_UPDATE_GOLDEN") == "1"
    for fname, text in _golden_files(name).items():
        path = GOLDEN / fname
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"{path} missing: run with FTQ_UPDATE_GOLDEN=1 to write it"
        assert text == path.read_text(), (
            f"{fname} differs from its golden file (FTQ_UPDATE_GOLDEN=1 rewrites)"
        )


def test_the_fetch_step_runs_when_the_spec_names_a_hub_model_or_a_hub_dataset() -> None:
    """Issue 27, item 2: launch.sh and job.sbatch fetch once and then load offline when the spec names a hub
    model or a hub dataset (a local model with a hub dataset too); a spec of local paths has no fetch."""
    slurm = {"launcher": "slurm", "device": "cpu"}
    cases = [
        ({}, False),
        ({"dataset": {"name_or_path": "owner/rows"}}, True),
        ({"model": {"name_or_path": "owner/model"}}, True),
    ]
    for parts, fetched in cases:
        for resources in ({}, {"resources": slurm}):
            plan = render_plan(
                spec_for(**parts, **resources), job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=settings()
            )
            script = plan.sbatch_script if resources else plan.launch_script
            assert script is not None
            assert ("-m trainer.fetch --spec" in script) is fetched, (parts, resources)
            assert ("export HF_HUB_OFFLINE=1" in script) is fetched, (parts, resources)


def test_render_is_deterministic_for_dry_and_real_runs() -> None:
    a = golden_plan("falcon-180b-lora-zero3").model_dump(mode="json")
    b = golden_plan("falcon-180b-lora-zero3").model_dump(mode="json")
    assert a == b
    assert default_port(GOLDEN_JOB) == default_port(GOLDEN_JOB)
    # Below Linux's ephemeral ports (32768-60999), which any outgoing connection may hold.
    ports = {default_port(f"job_{i}") for i in range(2000)}
    assert min(ports) >= 20000 and max(ports) < 32768
    assert 29500 not in ports  # torchrun's default, which another launch on the node may use
    assert default_port("job_a") != default_port("job_b")


# The settings of the 70B and 180B guides' own configs ----------


def test_falcon_config_is_the_guides_with_two_nodes() -> None:
    plan = golden_plan("falcon-180b-lora-zero3")
    expected = {**FALCON_GUIDE_CONFIG, "num_machines": 2, "num_processes": 16, "enable_cpu_affinity": False}
    assert plan.accelerate_config == expected
    assert yaml.safe_load(plan.accelerate_config_yaml) == expected


def test_llama_fsdp1_config_has_every_key_of_the_guides() -> None:
    cfg = golden_plan("llama2-70b-fsdp1").accelerate_config
    assert cfg["distributed_type"] == "FSDP"
    assert cfg["fsdp_config"] == {
        "fsdp_activation_checkpointing": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_forward_prefetch": False,
        "fsdp_offload_params": False,
        "fsdp_sharding_strategy": "FULL_SHARD",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_sync_module_states": True,
        "fsdp_use_orig_params": True,
        "fsdp_version": 1,
    }
    for key, value in {
        "mixed_precision": "bf16",
        "rdzv_backend": "static",
        "same_network": True,
        "machine_rank": 0,
        "num_machines": 2,
        "num_processes": 16,
        "use_cpu": False,
    }.items():
        assert cfg[key] == value, key


def test_llama_fsdp2_config_has_the_fsdp2_keys_and_none_of_the_obsolete_ones() -> None:
    cfg = golden_plan("llama2-70b-fsdp").accelerate_config
    assert cfg["fsdp_config"] == {
        "fsdp_activation_checkpointing": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": False,
        "fsdp_reshard_after_forward": True,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_version": 2,
    }
    assert (cfg["num_machines"], cfg["num_processes"]) == (2, 16)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_slurm_plans_command_is_what_its_sbatch_script_runs_on_each_node(name: str) -> None:
    plan = golden_plan(name)
    script = plan.sbatch_script or ""
    # The launch is the last srun (the NCCL check before it is one too).
    srun = script[script.rindex("\nsrun ") + 1 :].split("\nLAUNCH_PID=")[0].replace(" \\\n  ", " ")
    words = shlex.split(srun)
    after_c = words[words.index("-c") + 1 :]
    per_node, python, args = after_c[0], after_c[1], after_c[2:]
    # The resume words (empty on a first run) and the `&` that backgrounds srun.
    assert args[-1] == "&" and "RESUME_ARGS" in args[-2]
    node = shlex.split(per_node)
    node = node[node.index("exec") + 1 :]
    assert node[0] == "$0" and node[-1] == "$@"
    port = re.search(r"^export MASTER_PORT=(\d+)$", script, re.M)
    assert port
    ran = [python, *node[1:-1], *args[:-2]]
    ran = [port.group(1) if w == "$MASTER_PORT" else w for w in ran]
    assert ran == plan.command


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_two_node_argv_and_sbatch(name: str) -> None:
    plan = golden_plan(name)
    argv = plan.command
    assert argv[:3] == ["/opt/ftq/.venv/bin/python", "-m", "accelerate.commands.launch"]
    assert argv[argv.index("--num_processes") + 1] == "16"
    assert argv[argv.index("--num_machines") + 1] == "2"
    assert argv[argv.index("--config_file") + 1] == str(GOLDEN_RUN_DIR / "accelerate_config.yaml")
    # The process group's timeout follows the model's 16-bit bytes at FTQ_LOAD_BANDWIDTH_GBPS (0.05):
    # 138 GB for Llama 2 70B is 2760 s, 357 GB for Falcon 180B 7200 s (whole minutes, at least 1800).
    timeout = {"falcon-180b-lora-zero3": "7200"}.get(name, "2760")
    assert argv[-8:] == [
        "-m",
        "trainer",
        "--spec",
        str(GOLDEN_RUN_DIR / "spec.json"),
        "--output_dir",
        str(GOLDEN_RUN_DIR),
        "--process_group_timeout",
        timeout,
    ]
    assert f"  --process_group_timeout {timeout} \\\n" in (plan.sbatch_script or "")
    assert plan.trainer_args == {
        "spec": str(GOLDEN_RUN_DIR / "spec.json"),
        "output_dir": str(GOLDEN_RUN_DIR),
        "resume_from_checkpoint": None,
    }
    sb = plan.sbatch_script
    assert sb is not None
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:8",
        f"#SBATCH --job-name=ftq-{GOLDEN_JOB}",
        "#SBATCH --partition=gpu",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={GOLDEN_RUN_DIR}/train.log",
        "module load cuda/12.4",
    ):
        assert line in sb.splitlines(), line
    assert "--num_processes 16" in sb and "--num_machines 2" in sb
    assert '--machine_rank "$SLURM_NODEID"' in sb
    # The user's job name never reaches SLURM's job name (only the server's job id does).
    name_in_spec = example(name).name
    assert name_in_spec is not None and name_in_spec not in sb.split("\n", 5)[1]


def test_falcon_time_limit_and_llama_partition_come_from_spec_and_settings() -> None:
    falcon = golden_plan("falcon-180b-lora-zero3").sbatch_script or ""
    assert "#SBATCH --time=36:00:00" in falcon.splitlines()
    spec = example("falcon-180b-lora-zero3")
    spec.resources.slurm.partition = "a100-long"
    spec.resources.slurm.account = "proj.ml-7"
    sb = render_plan(spec, job_id="j1", run_dir=Path("/r/j1"), settings=settings()).sbatch_script or ""
    assert "#SBATCH --partition=a100-long" in sb.splitlines()
    assert "#SBATCH --account=proj.ml-7" in sb.splitlines()
    no_partition = render_plan(
        example("llama2-70b-fsdp"),
        job_id="j1",
        run_dir=Path("/r/j1"),
        settings=settings(slurm_partition=None),
    ).sbatch_script
    assert no_partition is not None and "--partition" not in no_partition


def test_local_jobs_have_no_sbatch_and_resume_goes_to_the_trainer() -> None:
    spec = spec_for(resources={"device": "cpu", "processes_per_node": 2}, distributed={"strategy": "ddp"})
    plan = render_plan(
        spec,
        job_id="j2",
        run_dir=Path("/d/runs/j2"),
        settings=settings(),
        main_process_port=31234,
        resume_from_checkpoint="/d/runs/j1/checkpoints/checkpoint-5",
    )
    assert plan.sbatch_script is None
    assert plan.command[plan.command.index("--main_process_port") + 1] == "31234"
    assert plan.command[-2:] == ["--resume_from_checkpoint", "/d/runs/j1/checkpoints/checkpoint-5"]
    assert plan.trainer_args["resume_from_checkpoint"] == "/d/runs/j1/checkpoints/checkpoint-5"
    # DDP on CPU goes through torchrun (MULTI_GPU + use_cpu): MULTI_CPU would start only one process.
    assert plan.accelerate_config["distributed_type"] == "MULTI_GPU"
    assert plan.accelerate_config["use_cpu"] is True


def test_estimate_is_carried_into_the_plan() -> None:
    est = Estimate.model_validate(
        {"per_device_bytes": 5, "device_memory_bytes": 10, "fits": True, "breakdown": {"params": 5}}
    )
    plan = render_plan(spec_for(), job_id="j", run_dir=Path("/r/j"), settings=settings(), estimate=est)
    assert (
        plan.estimate is not None and plan.estimate.fits is True and plan.estimate.breakdown == {"params": 5}
    )
    skipped = Estimate.model_validate(
        {
            "per_device_bytes": None,
            "device_memory_bytes": 10,
            "fits": None,
            "breakdown": {},
            "reason": "config for x/y is not on this machine; estimate skipped",
        }
    )
    plan = render_plan(spec_for(), job_id="j", run_dir=Path("/r/j"), settings=settings(), estimate=skipped)
    assert plan.estimate is not None and plan.estimate.reason == skipped.reason
    assert render_plan(spec_for(), job_id="j", run_dir=Path("/r/j"), settings=settings()).estimate is None


# Every combination through accelerate ----------


def _all_specs() -> list[tuple[str, JobSpec]]:
    """Every strategy variant x device x world shape; precision and LoRA vary along the list."""
    variants: list[dict[str, Any]] = [{"strategy": "none"}, {"strategy": "ddp"}]
    for version, reshard, offload, sd in itertools.product(
        (1, 2), (True, False), (True, False), ("sharded", "full")
    ):
        variants.append(
            {
                "strategy": "fsdp",
                "fsdp": {
                    "version": version,
                    "reshard_after_forward": reshard,
                    "offload_params": offload,
                    "state_dict_type": sd,
                    "cpu_ram_efficient_loading": not offload,
                },
            }
        )
    for version in (1, 2):
        variants.append({"strategy": "fsdp", "fsdp": {"version": version, "activation_checkpointing": True}})
    for stage, opt, par in itertools.product(range(4), ("none", "cpu", "nvme"), ("none", "cpu", "nvme")):
        variants.append(
            {
                "strategy": "deepspeed",
                "deepspeed": {"zero_stage": stage, "offload_optimizer": opt, "offload_params": par},
            }
        )
    variants.append({"strategy": "deepspeed", "deepspeed": {"zero3_init": False, "save_16bit_model": False}})
    out = []
    for i, (dist, device, (nodes, ppn)) in enumerate(
        itertools.product(variants, ("cuda", "cpu"), ((1, 1), (1, 2), (2, 8)))
    ):
        precisions = ("bf16", "fp16", "no") if device == "cuda" else ("bf16", "no")
        body = {
            "distributed": dist,
            "training": {
                "max_steps": 10,
                "mixed_precision": precisions[i % len(precisions)],
                "gradient_accumulation_steps": 4,
            },
            "resources": {
                "device": device,
                "num_nodes": nodes,
                "processes_per_node": ppn,
                "launcher": "slurm" if nodes > 1 else "local",
            },
            "lora": {"r": 8} if i % 2 else None,
        }
        try:
            spec = spec_for(**body)
        except ValidationError:
            continue  # a combination the spec refuses never reaches the renderer
        out.append((f"{json.dumps(dist, sort_keys=True)}-{device}-{nodes}x{ppn}", spec))
    return out


ALL_SPECS = _all_specs()


def test_combination_matrix_is_wide() -> None:
    kinds = {(s.distributed.strategy, s.resources.device) for _, s in ALL_SPECS}
    assert kinds == {(a, b) for a in ("none", "ddp", "fsdp", "deepspeed") for b in ("cuda", "cpu")}
    stages = {
        s.distributed.deepspeed.zero_stage for _, s in ALL_SPECS if s.distributed.strategy == "deepspeed"
    }
    assert stages == {0, 1, 2, 3}
    assert len(ALL_SPECS) > 150


def test_every_rendered_config_loads_with_accelerates_loader(tmp_path: Path) -> None:
    """ClusterConfig.from_yaml_file refuses unknown keys; every config the renderer makes must pass."""
    seen_types = set()
    for i, (label, spec) in enumerate(ALL_SPECS):
        plan = render_plan(spec, job_id=f"j{i}", run_dir=tmp_path, settings=settings())
        path = tmp_path / f"c{i}.yaml"
        path.write_text(plan.accelerate_config_yaml)
        cfg = ClusterConfig.from_yaml_file(str(path))
        world = spec.resources.num_nodes * spec.resources.processes_per_node
        assert cfg.num_processes == world, label
        assert cfg.num_machines == spec.resources.num_nodes, label
        assert cfg.use_cpu == (spec.resources.device == "cpu"), label
        assert cfg.mixed_precision == spec.training.mixed_precision, label
        assert cfg.rdzv_backend == "static" and cfg.same_network is True, label
        seen_types.add(str(cfg.distributed_type.value))
    assert seen_types == {"NO", "MULTI_GPU", "FSDP", "DEEPSPEED"}


def test_every_rendered_launch_passes_accelerates_launch_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The argv through `accelerate launch`'s parser and validation, and the env it builds through the FSDP
    and DeepSpeed plugins: what a real launch does before it starts processes."""
    import torch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    has_gpu = torch.cuda.is_available()
    parser = launch_command_parser()
    checked = 0
    # Every variant on both devices, as a 2-process single-node launch (the shape a launch can check here).
    sample = [(label, s) for label, s in ALL_SPECS if s.resources.processes_per_node == 2]
    saved_env = dict(os.environ)
    for i, (label, spec) in enumerate(sample):
        run_dir = tmp_path / f"r{i}"
        run_dir.mkdir()
        plan = render_plan(spec, job_id=f"j{i}", run_dir=run_dir, settings=settings())
        (run_dir / "accelerate_config.yaml").write_text(plan.accelerate_config_yaml)
        args = parser.parse_args(plan.command[3:])
        assert args.module and args.training_script == "trainer", label
        args, defaults, mp_from_config = _validate_launch_command(args)
        strategy = spec.distributed.strategy
        if strategy == "fsdp":
            env = prepare_multi_gpu_env(args)
            fsdp_env = {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))}
            fsdp = spec.distributed.fsdp
            sync = spec.resources.device == "cuda" or fsdp.cpu_ram_efficient_loading
            if fsdp.version == 1 and sync and not has_gpu:
                # FSDP1's sync_module_states plugin check wants a GPU in this process (the trainer sets
                # it up itself on a CPU launch); check the env only.
                assert fsdp_env["FSDP_SYNC_MODULE_STATES"] == "true", label
                loading = str(fsdp.cpu_ram_efficient_loading).lower()
                assert fsdp_env.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false") == loading, label
                assert fsdp_env["FSDP_SHARDING_STRATEGY"] in ("FULL_SHARD", "SHARD_GRAD_OP"), label
                checked += 1
                continue
            with monkeypatch.context() as m:
                for k, v in fsdp_env.items():
                    m.setenv(k, v)
                plugin = FullyShardedDataParallelPlugin()
            assert plugin.fsdp_version == spec.distributed.fsdp.version, label
            assert plugin.cpu_ram_efficient_loading == fsdp.cpu_ram_efficient_loading, label
        elif strategy == "deepspeed":
            # As launch_command does before it calls the DeepSpeed launcher.
            fields = [*defaults.deepspeed_config.keys(), *(["mixed_precision"] if mp_from_config else [])]
            args.deepspeed_fields_from_accelerate_config = ",".join(fields)
            _cmd, env = prepare_deepspeed_cmd_env(args)
            ds_env = {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}
            with monkeypatch.context() as m:
                for k, v in ds_env.items():
                    m.setenv(k, v)
                plugin = DeepSpeedPlugin()
            assert plugin.zero_stage == spec.distributed.deepspeed.zero_stage, label
            offload = (
                plugin.deepspeed_config["zero_optimization"]
                .get("offload_optimizer", {})
                .get("device", "none")
            )
            assert offload == spec.distributed.deepspeed.offload_optimizer, label
        elif strategy == "ddp":
            assert args.multi_gpu, label
        checked += 1
    # The plugins write some settings back into os.environ for transformers: leave none behind.
    os.environ.clear()
    os.environ.update(saved_env)
    assert checked > 50


# What reaches sbatch ----------


def test_spec_allowlists_what_reaches_sbatch() -> None:
    for field, evil in (("partition", "gpu;rm"), ("account", "a b"), ("time_limit", "1:00:00\n#SBATCH --x")):
        with pytest.raises(ValidationError):
            spec_for(resources={"launcher": "slurm", "slurm": {field: evil}})


def test_line_breaks_are_refused_in_sbatch_values_and_extra_args() -> None:
    spec = example("falcon-180b-lora-zero3")
    spec.resources.slurm.partition = "gpu\n#SBATCH --uid=0"
    with pytest.raises(ValueError, match="line break"):
        render_plan(spec, job_id="j", run_dir=Path("/r/j"), settings=settings())
    ok = render_plan(
        example("falcon-180b-lora-zero3"),
        job_id="j",
        run_dir=Path("/r/j"),
        settings=settings(slurm_extra_args="--qos=high\n\n  --exclusive  "),
    ).sbatch_script
    assert ok is not None and "#SBATCH --qos=high\n#SBATCH --exclusive\n" in ok
    with pytest.raises(ValueError, match="FTQ_SLURM_EXTRA_ARGS"):
        render_plan(
            example("falcon-180b-lora-zero3"),
            job_id="j",
            run_dir=Path("/r/j"),
            settings=settings(slurm_extra_args="--qos=high\nrm -rf /"),
        )


def test_sbatch_lines_are_the_expected_options() -> None:
    sb = golden_plan("falcon-180b-lora-zero3").sbatch_script or ""
    assert re.findall(r"^#SBATCH (--[a-z-]+)", sb, flags=re.M) == [
        "--job-name",
        "--nodes",
        "--ntasks-per-node",
        "--gres",
        "--cpus-per-task",
        "--mem",
        "--exclusive",
        "--time",
        "--partition",
        "--chdir",
        "--output",
        "--open-mode",
        "--requeue",
        "--signal",
    ]


def test_gpu_nodes_get_cpus_and_memory_derived_from_their_gpus() -> None:
    sb = golden_plan("falcon-180b-lora-zero3").sbatch_script or ""
    # 8 GPUs per node x 10 CPUs per GPU; srun asks for the same (it does not inherit it from sbatch).
    assert "#SBATCH --cpus-per-task=80\n" in sb and "--kill-on-bad-exit=1 --cpus-per-task=80 " in sb
    assert "#SBATCH --mem=0\n" in sb  # all of each node's memory: loading and the final gather use it
    # A multi-node GPU job takes whole nodes (their NICs, its GPUs' NUMA-local CPUs) without being told;
    # a one-node job only with FTQ_SLURM_EXCLUSIVE.
    assert "#SBATCH --exclusive\n" in sb
    one_node = render_plan(
        example("falcon-180b-lora-zero3").model_copy(
            update={
                "resources": example("falcon-180b-lora-zero3").resources.model_copy(update={"num_nodes": 1})
            }
        ),
        job_id=GOLDEN_JOB,
        run_dir=GOLDEN_RUN_DIR,
        settings=settings(),
    )
    assert "--exclusive" not in (one_node.sbatch_script or "")
    plan = render_plan(
        example("falcon-180b-lora-zero3"),
        job_id=GOLDEN_JOB,
        run_dir=GOLDEN_RUN_DIR,
        settings=settings(slurm_cpus_per_gpu=12, slurm_mem="900G", slurm_exclusive=True),
    )
    sb = plan.sbatch_script or ""
    assert "#SBATCH --cpus-per-task=96\n" in sb and "#SBATCH --mem=900G\n" in sb
    assert "#SBATCH --exclusive\n" in sb
    pinned = settings(slurm_cpus_per_task=64, slurm_mem="", slurm_signal_grace_seconds=0)
    sb = (
        render_plan(
            example("falcon-180b-lora-zero3"), job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=pinned
        ).sbatch_script
        or ""
    )
    assert "#SBATCH --cpus-per-task=64\n" in sb and "--mem" not in sb and "#SBATCH --signal" not in sb
    # A cpu job (a rehearsal on CPU nodes) asks for one CPU per process.
    cpu = spec_for(
        distributed={"strategy": "ddp"},
        resources={"launcher": "slurm", "device": "cpu", "num_nodes": 2, "processes_per_node": 3},
    )
    sb = render_plan(cpu, job_id="j", run_dir=Path("/r/j"), settings=settings()).sbatch_script or ""
    assert "#SBATCH --cpus-per-task=3\n" in sb and "--gres" not in sb


def test_the_time_limit_warning_reaches_the_trainer_and_nccl_lines_are_quoted() -> None:
    sb = golden_plan("llama2-70b-fsdp").sbatch_script or ""
    assert "#SBATCH --signal=B:USR1@960\n" in sb
    assert "trap stop_with_checkpoint USR1" in sb and 'kill -USR1 "$LAUNCH_PID"' in sb
    assert "export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1\n" in sb
    assert "export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=960\n" in sb
    assert "export NCCL_SOCKET_IFNAME=ib0\nexport NCCL_IB_HCA=mlx5\n" in sb
    odd = settings(slurm_nccl_env="NCCL_DEBUG_SUBSYS=INIT,NET $(touch /tmp/x)")
    plan = render_plan(example("llama2-70b-fsdp"), job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=odd)
    assert "export NCCL_DEBUG_SUBSYS='INIT,NET $(touch /tmp/x)'\n" in (plan.sbatch_script or "")
    for bad in ("NCCL_DEBUG", "1NCCL=x", "NCCL DEBUG=INFO", "export NCCL_DEBUG=INFO"):
        with pytest.raises(ValidationError, match="FTQ_SLURM_NCCL_ENV"):
            settings(slurm_nccl_env=bad)
    for bad_mem in ("lots", "0 --exclusive", "10GB", "-1"):
        with pytest.raises(ValidationError, match="FTQ_SLURM_MEM"):
            settings(slurm_mem=bad_mem)
    with pytest.raises(ValidationError):
        settings(slurm_signal_grace_seconds=-1)
    with pytest.raises(ValidationError):
        settings(slurm_cpus_per_gpu=0)


def test_an_empty_resume_list_expands_safely_on_old_bash() -> None:
    # bash < 4.4 calls "${A[@]}" of an empty array unbound under `set -u`, and the script ends there.
    sb = golden_plan("falcon-180b-lora-zero3").sbatch_script or ""
    assert '${RESUME_ARGS[@]+"${RESUME_ARGS[@]}"}' in sb
    assert re.search(r'(?<!\+)"\$\{RESUME_ARGS\[@\]\}"(?!\})', sb) is None


def test_nvme_offload_goes_to_a_node_local_folder_per_job() -> None:
    spec = spec_for(
        distributed={
            "strategy": "deepspeed",
            "deepspeed": {"offload_optimizer": "nvme", "offload_params": "nvme"},
        }
    )
    ds = render_plan(
        spec, job_id="job_9", run_dir=Path("/shared/runs/job_9"), settings=settings()
    ).accelerate_config
    assert ds["deepspeed_config"]["offload_optimizer_nvme_path"] == "/tmp/ftq-offload/job_9"
    assert ds["deepspeed_config"]["offload_param_nvme_path"] == "/tmp/ftq-offload/job_9"


@pytest.mark.parametrize("path", sorted(EXAMPLES_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_example_validates_renders_and_loads_with_accelerates_loader(
    path: Path, tmp_path: Path
) -> None:
    """Each examples/*.yaml as shipped: a valid spec, a plan naming its method's trainer, a config accelerate
    loads."""
    from ftq.contract.spec import METHOD_TRAINERS

    spec = JobSpec.model_validate(yaml.safe_load(path.read_text()))
    plan = render_plan(spec, job_id="example", run_dir=tmp_path, settings=settings())
    assert plan.trainer == METHOD_TRAINERS[str(spec.training.method)]
    (tmp_path / "accelerate_config.yaml").write_text(plan.accelerate_config_yaml)
    cfg = ClusterConfig.from_yaml_file(str(tmp_path / "accelerate_config.yaml"))
    assert cfg.num_processes == spec.resources.world_size


def test_the_examples_cover_a_preference_method() -> None:
    methods = {
        yaml.safe_load(p.read_text())["training"].get("method", "sft") for p in EXAMPLES_DIR.glob("*.yaml")
    }
    assert {"sft", "dpo"} <= methods


def test_priority_becomes_nice_and_qos_on_slurm() -> None:
    """SLURM schedules; the job's priority only says how much it matters there: low is a positive --nice,
    high the operator's QOS (none configured: as normal)."""

    def header(priority: str, **over: Any) -> list[str]:
        spec = example("falcon-180b-lora-zero3")
        spec.priority = priority  # type: ignore[assignment]
        plan = render_plan(spec, job_id="j", run_dir=Path("/runs/j"), settings=settings(**over))
        assert plan.sbatch_script is not None
        return [
            line
            for line in plan.sbatch_script.splitlines()
            if line.startswith(("#SBATCH --nice", "#SBATCH --qos"))
        ]

    assert header("normal") == [] and header("high") == []
    assert header("low") == ["#SBATCH --nice=100"]
    assert header("high", slurm_qos_high="urgent", slurm_qos="standard") == ["#SBATCH --qos=urgent"]
    assert header("normal", slurm_qos_high="urgent", slurm_qos="standard") == ["#SBATCH --qos=standard"]
    assert header("low", slurm_nice_low=0, slurm_qos_low="scavenger") == ["#SBATCH --qos=scavenger"]
    with pytest.raises(ValidationError):
        settings(slurm_qos_high="x; rm -rf /")


def test_every_plan_has_a_time_estimate() -> None:
    for name in EXAMPLES:
        plan = golden_plan(name)
        assert plan.time_estimate is not None and plan.time_estimate.tokens and plan.time_estimate.assumptions


def test_a_plan_has_one_time_estimate_which_its_dataset_section_repeats() -> None:
    spec = spec_for()
    data = DatasetPreflight(source="x", max_seq_len=512, effective_batch_size=1, run_tokens=4321)
    plan = render_plan(spec, job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=settings(), dataset=data)
    assert plan.time_estimate is not None and plan.time_estimate.tokens == 4321
    assert plan.dataset is not None and plan.dataset.time_estimate == plan.time_estimate
    assert data.time_estimate is None  # rendering does not write into its inputs


def test_a_value_written_like_a_template_placeholder_is_filled_in_as_written() -> None:
    # The scripts are templates (ftq/planning/templates); what fills them is never read as one.
    spec = spec_for(resources={"launcher": "slurm"})
    settings_ = settings(slurm_setup="echo {{run_dir}}")
    plan = render_plan(spec, job_id="j{{port}}", run_dir=Path("/r/{{port}}"), settings=settings_)
    sb = plan.sbatch_script or ""
    assert "RUN_DIR='/r/{{port}}'\n" in sb and "cd -- '/r/{{port}}' ||" in plan.launch_script
    assert '#SBATCH --job-name="ftq-j{{port}}"\n' in sb and "\necho {{run_dir}}\n" in sb


# Issue 27: expandable segments and the time-limit warning sized from the checkpoint ----------


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_cuda_jobs_launch_with_expandable_segments_unless_the_run_sets_its_own(name: str) -> None:
    line = 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"'
    plan = golden_plan(name)
    assert line in plan.launch_script
    assert line in (plan.sbatch_script or "")
    # The export comes before the launch it is for.
    sb = plan.sbatch_script or ""
    assert sb.index(line) < sb.index("srun --nodes")
    # The operator turns it off (or sets another value) with FTQ_CUDA_ALLOC_CONF.
    off = golden_plan(name, cuda_alloc_conf="")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in off.launch_script + (off.sbatch_script or "")
    other = golden_plan(name, cuda_alloc_conf="max_split_size_mb:512")
    assert "${PYTORCH_CUDA_ALLOC_CONF:-max_split_size_mb:512}" in other.launch_script


def test_cpu_jobs_do_not_set_the_cuda_allocator() -> None:
    spec = spec_for(resources={"device": "cpu"})
    plan = render_plan(spec, job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=settings())
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plan.launch_script


def test_the_time_limit_warning_leaves_time_to_write_the_checkpoint() -> None:
    # Llama 2 70B full fine-tune: 69e9 parameters x (4 + 8) bytes = 0.83 TB a checkpoint; at the default
    # 1 GB/s that is 828 s, plus a step's 120 s, in whole minutes: 960 s, not the fixed 300 s.
    est = example_estimate("llama2-70b-fsdp")
    assert est.disk is not None and est.disk.checkpoint_bytes == pytest.approx(0.83e12, rel=0.01)
    sb = golden_plan("llama2-70b-fsdp").sbatch_script or ""
    assert "#SBATCH --signal=B:USR1@960\n" in sb
    assert "export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=960\n" in sb
    # A faster filesystem shortens it, never under FTQ_SLURM_SIGNAL_GRACE_SECONDS.
    fast = golden_plan("llama2-70b-fsdp", checkpoint_write_gbps=4.0).sbatch_script or ""
    assert "#SBATCH --signal=B:USR1@360\n" in fast
    floor = golden_plan("llama2-70b-fsdp", checkpoint_write_gbps=100.0).sbatch_script or ""
    assert "#SBATCH --signal=B:USR1@300\n" in floor
    # The Falcon LoRA checkpoint is the adapter (a few GB): the floor.
    assert "#SBATCH --signal=B:USR1@300\n" in (golden_plan("falcon-180b-lora-zero3").sbatch_script or "")
    # 0 still means no warning at all.
    none = golden_plan("llama2-70b-fsdp", slurm_signal_grace_seconds=0).sbatch_script or ""
    assert "#SBATCH --signal" not in none
    # Without an estimate (model config unreadable), the floor.
    bare = render_plan(
        example("llama2-70b-fsdp"), job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=settings()
    )
    assert "#SBATCH --signal=B:USR1@300\n" in (bare.sbatch_script or "")


def test_the_process_group_timeout_follows_the_load_never_under_30_minutes() -> None:
    fast = golden_plan("llama2-70b-fsdp", load_bandwidth_gbps=1.0)
    assert fast.command[-2:] == ["--process_group_timeout", "1800"]
    slow = golden_plan("llama2-70b-fsdp", load_bandwidth_gbps=0.01)
    assert slow.command[-2:] == ["--process_group_timeout", str(13_800)]  # 138 GB at 10 MB/s, in minutes
    # Without a parameter count (model config unreadable), the trainer's own 30 min: no flag.
    bare = render_plan(
        example("llama2-70b-fsdp"), job_id=GOLDEN_JOB, run_dir=GOLDEN_RUN_DIR, settings=settings()
    )
    assert "--process_group_timeout" not in bare.command


def test_the_allocator_export_keeps_a_value_the_run_already_has() -> None:
    import subprocess

    line = next(
        ln
        for ln in golden_plan("llama2-70b-fsdp").launch_script.splitlines()
        if "PYTORCH_CUDA_ALLOC_CONF=" in ln
    )
    script = f'{line}\nprintf %s "$PYTORCH_CUDA_ALLOC_CONF"'
    unset = subprocess.run(
        ["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert unset.stdout == "expandable_segments:True"
    env = {"PATH": "/usr/bin:/bin", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    kept = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert kept.stdout == "max_split_size_mb:512"
