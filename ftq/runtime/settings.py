"""All of ftq's settings, from environment variables with the `FTQ_` prefix.

One `Settings` object serves the API, the worker and the CLI's server commands. The defaults are the
embedded ones (`ftq up` on a bare machine): a SQLite file and a broker needing no server, both inside
the data directory. Unsafe combinations are refused at start-up, not discovered later.
"""

from __future__ import annotations

import hmac
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO_ROOT / "examples"
# What useradd accepts (a name, not a uid): a run user is looked up by name when a run starts.
_USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$")


# Everything ftq keeps at the top of its data dir. ftq makes a file or folder there only through
# `Settings.state_path`, which takes these names alone, so the rule of what a spec may name
# (service/paths.py) knows every one of them, today's and any added later. Anything else there is the
# operator's (models, datasets placed beside ftq's state).
DATA_DIR_STATE = frozenset(
    {
        "runs",
        "files",
        "artifact-hashes",
        "locks",
        "broker",
        "ftq.db",
        "celerybeat-schedule",
        "hub",
        "engines",
        "tinker",
    }
)


class Settings(BaseSettings):
    # populate_by_name: a field with an alias (hub_token: FTQ_HF_TOKEN) is still set by name.
    model_config = SettingsConfigDict(env_prefix="FTQ_", extra="ignore", populate_by_name=True)

    env: str = Field("development", description="development | production")
    data_dir: Path = Field(
        Path(".ftq"), description="Run directories, the SQLite store, the embedded broker."
    )
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite in data_dir.")
    broker_url: str | None = Field(
        None, description="Celery broker; default a filesystem broker in data_dir."
    )
    api_tokens: str = Field(
        "", description="`token1:alice,token2:bob`; empty turns auth off (loopback only)."
    )
    local_roots: str | None = Field(
        None, description="Colon-separated folders specs may read local paths from."
    )
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = Field(
        "INFO", description="Log level of the API and the worker: DEBUG, INFO, WARNING, ERROR."
    )

    # Local launcher
    gpu_pool: str = Field("", description="GPU indices jobs may use, e.g. `0,1,2,3`; empty: none.")
    cpu_slots: int = Field(4, ge=1, description="CPU worker processes that local CPU jobs may use at once.")
    cancel_grace_seconds: float = Field(20.0, ge=0)
    python: str = Field(sys.executable, description="Interpreter that runs `accelerate launch` for jobs.")

    # SLURM launcher (operator settings; never from a job spec)
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_setup: str = Field("", description="Lines run before srun in every batch script (module load ...).")
    slurm_extra_args: str = Field("", description="Extra `#SBATCH` options, one per line, e.g. `--qos=high`.")
    slurm_cpus_per_task: int | None = Field(
        None, ge=1, description="--cpus-per-task of every job; unset: derived (FTQ_SLURM_CPUS_PER_GPU)."
    )
    slurm_cpus_per_gpu: int = Field(
        10,
        ge=1,
        le=1024,
        description="GPU jobs ask for this many CPUs per GPU of a node (data loading, the launcher); cpu "
        "jobs for one per process.",
    )
    slurm_mem: str = Field(
        "0",
        description="--mem of every job: `0` (all of each node's memory: loading and the final gather "
        "happen in host RAM), a size such as `500G`, or empty to leave it to the cluster's default.",
    )
    slurm_exclusive: bool = Field(False, description="Ask for whole nodes (--exclusive).")
    slurm_signal_grace_seconds: int = Field(
        300,
        ge=0,
        le=65535,
        description="SLURM warns a job this long before its time limit (--signal=B:USR1@N); the trainer "
        "checkpoints and stops. 0: no warning.",
    )
    checkpoint_write_gbps: float = Field(
        1.0,
        gt=0,
        description="GB/s at which a job's ranks together write a checkpoint to the run directory's "
        "filesystem; SLURM's warning before the time limit comes early enough to write the estimated "
        "checkpoint at this rate (never under FTQ_SLURM_SIGNAL_GRACE_SECONDS).",
    )
    load_bandwidth_gbps: float = Field(
        0.05,
        gt=0,
        description="GB/s at which rank 0 reads and prepares the model's 16-bit weights at start (a "
        "conservative 50 MB/s: a longer timeout only delays the report of a stuck start); the first "
        "collective's timeout is sized to load the model at this rate (never under 30 minutes).",
    )
    cuda_alloc_conf: str = Field(
        "expandable_segments:True",
        description="PYTORCH_CUDA_ALLOC_CONF of cuda jobs, where the run's environment does not already "
        "set one (less fragmentation when a job plans for most of the GPU's memory); empty: not set.",
    )
    slurm_nccl_env: str = Field(
        "",
        description="`NAME=value` lines exported before the launch (NCCL_SOCKET_IFNAME=ib0, "
        "NCCL_IB_HCA=mlx5, ...); each value is quoted.",
    )
    slurm_bin_dir: str = ""

    # Preflight
    gpu_memory_gb: float = Field(80.0, gt=0)
    gpu_memory_gb_by_partition: str = Field("", description="`part1:40,part2:80`")
    node_memory_gb: float = Field(
        0.0,
        ge=0,
        description="Host RAM of one GPU node, which a cuda job's host estimate (loading, final gather, "
        "CPU offload) must fit; 0: reported in the plan, not checked.",
    )

    # Secrets passed to launches via the environment (names of operator env vars, e.g. `HF_TOKEN`)
    pass_env: str = Field("HF_TOKEN,WANDB_API_KEY", description="Env vars handed to launches, never stored.")
    # Experiment trackers (spec `integrations`): the where and the credentials are the operator's.
    wandb_mode: Literal["online", "offline", "disabled", ""] = Field(
        "",
        description="WANDB_MODE of runs that log to W&B: `online`, `offline` (files in the run's `wandb/`, "
        "nothing sent), `disabled`. Empty: W&B's default (online). The key is WANDB_API_KEY, handed to "
        "runs through FTQ_PASS_ENV.",
    )
    mlflow_tracking_uri: str = Field(
        "",
        description="The MLflow tracking server runs with `integrations.mlflow` log to (MLFLOW_TRACKING_URI "
        "in their environment). Empty: a spec that asks for MLflow is a 422. Credentials written in it "
        "(`http://user:password@host`) reach a run only as MLFLOW_TRACKING_USERNAME/PASSWORD in its "
        "environment: the URL a job, a log or an event shows has none, and the password is masked.",
    )
    tracker_failure: Literal["continue", "fail"] = Field(
        "continue",
        description="A tracker (W&B online, MLflow) unreachable when a run starts (checked in seconds, "
        "before the model loads): `continue` trains on without it (a job.warning; every metric stays in "
        "ftq), `fail` ends the job with error code `tracker_error`.",
    )
    tracker_check_seconds: float = Field(
        5.0, gt=0, le=120, description="How long the check that a tracker is reachable may take."
    )
    # Run isolation (local launcher): who a run's processes are, so they cannot read the service's
    # environment, the store or another owner's run directory.
    run_as_user: str = Field(
        "",
        description="Unprivileged user local runs start as: one name for every owner, or "
        "`owner:user` pairs (`alice:ftq-alice,bob:ftq-bob,*:ftq-run`; `*` for the rest). Empty: runs are "
        "the worker's own user. Needs a worker running as root.",
    )

    # The sandbox every piece of tenant code runs in (python graders, an evaluation task's own code).
    sandbox_bwrap: str = Field(
        "bwrap",
        description="The bubblewrap binary tenant code runs under (python graders, lm_eval task folders): "
        "a name on PATH or an absolute path. Where it cannot start, such code is refused, never run "
        "without it.",
    )

    # Graders (POST /graders/run, training.grader): the python grader's sandbox, and the score models.
    grader_cpu_seconds: int = Field(
        10, ge=1, le=3600, description="CPU seconds a python grader's batch may use (RLIMIT_CPU)."
    )
    grader_memory_mb: int = Field(
        1024, ge=64, le=65536, description="Address space a python grader's process may map (RLIMIT_AS), MB."
    )
    grader_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Wall-clock seconds a python grader's batch may take; then it is killed.",
    )
    grader_processes: int = Field(
        64,
        ge=1,
        le=4096,
        description="Processes the run user may have while a python grader runs (RLIMIT_NPROC).",
    )
    grader_python: str = Field(
        "",
        description="Interpreter python graders run in (the standard library is all they get); empty: "
        "FTQ_PYTHON. With FTQ_RUN_AS_USER, the run user must be able to execute it.",
    )
    grader_score_models: str = Field(
        "",
        description="Comma-separated models a score_model grader may name (local paths or names the "
        "server has). Empty: score_model graders are refused.",
    )
    # How POST /graders/run shares one API process among owners (service.graders.service): two lanes,
    # one for graders that start a python process or run a score model, one for the rest.
    grader_slots: int = Field(
        4,
        ge=1,
        le=64,
        description="Graders one API process scores at once in each lane (python and score_model graders; "
        "string_check and text_similarity ones).",
    )
    grader_slots_per_owner: int = Field(
        2,
        ge=1,
        le=64,
        description="Of those, how many one owner's requests may hold (even while others are free): the "
        "rest wait in the owner's own queue, and a freed slot goes to the waiting owner holding the fewest.",
    )
    grader_queue_per_owner: int = Field(
        8,
        ge=0,
        le=1024,
        description="Requests of one owner that may wait for a slot in each lane; one more is a 429 with "
        "Retry-After.",
    )

    # Limits
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_header_bytes: int = Field(
        16_384, ge=1024, description="Request line plus headers, in bytes; more is a 431."
    )
    max_header_count: int = Field(100, ge=8, description="Request headers; more is a 431.")
    max_active_jobs_per_owner: int = Field(100, ge=1)
    post_rate_per_minute: int = Field(120, ge=1)
    max_log_streams_per_owner: int = Field(
        8, ge=1, description="Open `GET /jobs/{id}/logs/stream` per owner and API process; more is a 429."
    )
    log_stream_heartbeat_seconds: float = Field(
        15.0, gt=0, description="A log stream with nothing new sends an SSE comment (`: ping`) this often."
    )
    preflight_timeout_seconds: float = Field(
        10.0, gt=0, description="Time for the checks of a spec's local files at POST; longer is a 422."
    )
    max_file_bytes: int = Field(
        2 * 1024**3,
        ge=1024,
        description="Largest file `POST /files` takes, in bytes; a larger upload is stopped and refused "
        "(413).",
    )
    file_quota_bytes: int = Field(
        20 * 1024**3,
        ge=1024,
        description="Bytes of uploaded files one owner may keep; an upload past it is stopped and refused "
        "(429).",
    )
    max_queued_exports_per_owner: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Exports one owner may have waiting for a device (queued) at once, over all its jobs; "
        "one more is a 429 `quota_exceeded`.",
    )
    max_queued_evaluations_per_owner: int = Field(
        32,
        ge=1,
        le=10_000,
        description="Evaluations one owner may ask for (POST /jobs/{id}/evaluations) that wait for a device "
        "(queued) at once, over all its jobs; one more is a 429 `quota_exceeded`. Those a spec's eval.on "
        "queues are not refused.",
    )
    upload_deadline_seconds: float = Field(
        3600.0,
        gt=0,
        description="Longest time an upload (`POST /files`, `POST /v1/files`, a part of a `/v1/uploads` "
        "upload) takes to send its body; a slower one is stopped (408), its partial file removed and the "
        "room it reserved in the owner's quota freed.",
    )
    preflight_sample_rows: int = Field(
        2000,
        ge=1,
        le=1_000_000,
        description="Rows of a .jsonl dataset the dataset preflight tokenizes; a longer file is extrapolated "
        "from them (`plan.dataset.sampled`).",
    )
    tokens_per_second_per_device: float = Field(
        0.0,
        ge=0,
        description="Training throughput of one device (GPU, or CPU process) on this hardware, measured: "
        "where set, every plan's time estimate is tokens / (this x devices); 0: unknown, the estimate "
        "uses FLOPs at FTQ_ASSUMED_MFU of the peak instead.",
    )
    max_config_bytes: int = Field(
        1_048_576, ge=1024, description="Largest model config.json preflight reads; larger is a 422."
    )

    # Operator caps on one job (a 422 naming the cap beyond them)
    max_nodes_per_job: int = Field(16, ge=1, description="resources.num_nodes at most.")
    max_gpus_per_job: int = Field(128, ge=1, description="GPUs of a cuda job (nodes x processes) at most.")
    max_processes_per_job: int = Field(
        128, ge=1, description="Processes of a job (nodes x processes per node) at most, cpu or cuda."
    )
    max_time_limit_hours: float = Field(
        168.0,
        gt=0,
        description="resources.slurm.time_limit at most; also how long a local job may run (the worker "
        "stops it then, and it fails with time_limit).",
    )
    host_memory_gb: float = Field(
        0.0, ge=0, description="Host RAM cpu jobs are checked against; 0: this machine's MemTotal."
    )
    allow_oversubscribe: str = Field(
        "false",
        description="Whose `allow_oversubscribe: true` also skips the disk and host-memory checks: "
        "`false` (nobody: it skips only the GPU estimate), `true` (every owner), or comma-separated owners.",
    )
    idempotency_ttl_hours: float = Field(24.0, gt=0)
    openai_models: str = Field(
        "",
        description="The OpenAI-compatible API's model catalog (`GET /v1/models`): a YAML or JSON file "
        "mapping each alias to a spec template (model, lora, distributed, resources, training's base "
        "learning_rate and max_seq_len). Empty: the built-in catalog, the tiny example model as `ftq-tiny`.",
    )
    openai_file_wait_seconds: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="How long `POST /v1/fine_tuning/jobs` waits for its files to finish validating (OpenAI "
        "clients create the job right after the upload); longer is a 400 naming the file.",
    )
    # Serving (service.serving, worker.deployments): the generation engines for /v1/chat/completions and
    # /v1/completions, one per owner and base model, each a run the scheduler places.
    serve_idle_seconds: float = Field(
        600.0,
        gt=0,
        description="An engine no request has used for this long is stopped (scale to zero); the next call "
        "starts it again.",
    )
    serve_device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="What engines run on: `cpu` (one CPU slot each), or `cuda` (GPUs, tensor parallel "
        "over as many of one node's as the base needs).",
    )
    serve_launcher: Literal["local", "slurm"] = Field(
        "local",
        description="Where engines run: `local` (this host's FTQ_GPU_POOL or CPU slots, placed by ftq's "
        "scheduler with the jobs) or `slurm` (a batch job each, on a node SLURM picks).",
    )
    serve_gpus_per_node: int = Field(
        8,
        ge=1,
        le=64,
        description="The GPUs of one node an engine may span with tensor parallel (SLURM nodes; locally, at "
        "most FTQ_GPU_POOL's).",
    )
    serve_max_engines: int = Field(
        4,
        ge=1,
        le=256,
        description="Engines one API process runs at once; a new one stops the least recently used idle "
        "engine, and with none idle the call is a 503 with Retry-After.",
    )
    serve_engines_per_owner: int = Field(
        2,
        ge=1,
        le=256,
        description="Of those, how many one owner's calls may hold (one per base model); one more stops the "
        "owner's least recently used idle engine, or is a 429 with Retry-After.",
    )
    serve_start_seconds: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="How long a call waits for a cold engine to start before it is a 503 (the openai SDK's "
        "default client waits 600 s).",
    )
    serve_max_lora_rank: int = Field(
        64,
        ge=1,
        le=512,
        description="The highest LoRA rank an engine holds (vLLM's --max-lora-rank); a model with a higher "
        "rank is a 400 naming it.",
    )
    serve_max_model_len: int = Field(
        2048,
        ge=16,
        description="The longest prompt + completion an engine takes, in tokens (at most the base's own "
        "max_position_embeddings).",
    )
    # Tinker (service.tinker, worker.training_clients): training clients, each a run the scheduler places.
    tinker_idle_seconds: float = Field(
        1800.0,
        gt=0,
        description="A Tinker training client no call has used for this long has its state (weights, "
        "optimizer, pending gradients) saved and its run stopped (its devices freed); its next call brings "
        "it back from that state in a new run, and waits for it.",
    )

    # Operator policy on what a job may do and who may reach the API
    allow_remote_code: str = Field(
        "false",
        description="Who may submit `model.trust_remote_code: true` (code from the model repo runs in "
        "the launch): `false` (nobody), `true` (every owner), or comma-separated owners.",
    )
    allowed_hosts: str = Field(
        "",
        description="Comma-separated names the Host header may carry (`*`: any). Empty: with auth off, "
        "the loopback names and FTQ_HOST; with auth on, any.",
    )
    metrics_token: str = Field("", description="Bearer token `GET /metrics` requires; empty: none.")
    hub_token: str = Field(
        "",
        # FTQ_HF_TOKEN is the same setting (issue 27): the name the fetch step's docs use.
        validation_alias=AliasChoices("FTQ_HF_TOKEN", "FTQ_HUB_TOKEN"),
        description="The operator's Hugging Face token (FTQ_HF_TOKEN or FTQ_HUB_TOKEN): the fetch step "
        "downloads gated hub models and datasets with it, runs get it as HF_TOKEN in their environment, "
        "and exports push with it (`push_to_hub`); never stored or shown. Empty: anonymous downloads, "
        "pushing refused.",
    )
    hub_cache: Path | None = Field(
        None,
        description="Where the fetch step downloads hub models and datasets before a run's processes start "
        "(HF_HUB_CACHE of the fetch and the ranks): a folder every node sees. Default: data_dir/hub.",
    )

    # Retries (operator policy, never from a job spec)
    retry_preempted: int = Field(
        0,
        ge=0,
        le=100,
        description="Times a job that ended preempted or by a node failure is queued again, continuing "
        "from its newest checkpoint; 0: never.",
    )

    # Scheduling of local jobs (worker/scheduling.py), quotas and accounting
    max_priority: str = Field(
        "",
        description="The highest `priority` each owner may ask for: `alice:high,bob:normal,*:low` (`*`: "
        "every owner not named). Empty, or an owner matched by neither: high. Above the cap is a 422 "
        "naming `priority`.",
    )
    fair_share_half_life_hours: float = Field(
        24.0,
        gt=0,
        description="Among jobs of equal priority the owner using the fewest devices goes first, plus "
        "their recent usage: device-seconds of finished runs, halved every this many hours.",
    )
    quota_gpus: str = Field(
        "", description="GPUs an owner's local jobs may hold at once: `alice:4,*:2`; empty: no quota."
    )
    quota_cpu_slots: str = Field(
        "", description="CPU slots an owner's local jobs may hold at once: `alice:2,*:1`; empty: no quota."
    )
    quota_gpu_hours: str = Field(
        "",
        description="GPU hours an owner's cuda jobs may use per period (FTQ_QUOTA_PERIOD_HOURS): "
        "`alice:100,*:20`; empty: no quota. A queued job of an owner past it fails with quota_exceeded.",
    )
    quota_period_hours: float = Field(
        720.0, gt=0, description="The period FTQ_QUOTA_GPU_HOURS counts over (fixed windows from the epoch)."
    )
    slurm_nice_low: int = Field(
        100, ge=0, le=2147483645, description="--nice of a SLURM job with priority low (0: none)."
    )
    slurm_qos: str = Field("", description="--qos of every SLURM job of priority normal (empty: none).")
    slurm_qos_high: str = Field(
        "",
        description="--qos of SLURM jobs with priority high; empty: high is the same as normal on SLURM "
        "(raising a job's priority there needs a QOS the site grants).",
    )
    slurm_qos_low: str = Field(
        "", description="--qos of SLURM jobs with priority low (empty: FTQ_SLURM_QOS)."
    )

    # Time and cost estimate of every plan (ftq/planning/timecost.py)
    # H100 SXM nodes are what fine-tuning clusters are built from now (the articles' A100s are the
    # previous generation): FTQ_GPU_TYPE=A100 gives their figures back.
    gpu_type: str = Field(
        "H100", description="What the GPUs are: a key of FTQ_GPU_PEAK_TFLOPS and FTQ_GPU_MEMORY_GBPS."
    )
    gpu_peak_tflops: str = Field(
        "H200:989,H100:989,A100:312,L40S:362,A10G:125,L4:121,V100:125,T4:65",
        description="Dense bf16/fp16 peak TFLOP/s per GPU by type (`name:tflops,...`).",
    )
    # HBM bandwidth from NVIDIA's data sheets (H100 SXM 3.35 TB/s, H200 4.8 TB/s, A100 80GB SXM 2.04 TB/s,
    # L40S 864 GB/s, A10G 600, L4 300, V100 900, T4 320): generation reads every weight once per token step.
    gpu_memory_gbps: str = Field(
        "H200:4800,H100:3350,A100:2039,L40S:864,A10G:600,L4:300,V100:900,T4:320",
        description="GB/s of device memory bandwidth per GPU by type (`name:gbps,...`): the floor of GRPO's "
        "generation, which reads the weights and the KV cache once per token step.",
    )
    cpu_peak_gflops: float = Field(
        50.0, gt=0, description="Peak GFLOP/s of one CPU training process (one CPU slot)."
    )
    assumed_mfu: float = Field(
        0.35,
        gt=0,
        le=1,
        description="The share of peak FLOP/s a training run achieves (model FLOPs utilisation) that the "
        "time estimate assumes; calibrate it from the jobs' estimate_vs_actual.",
    )
    # H100 SXM: NVLink 4 gives each GPU 900 GB/s (both directions) through the NVSwitches; nccl-tests'
    # all_gather_perf and reduce_scatter_perf reach about 360 GB/s of bus bandwidth on 8 of them at the
    # message sizes of a decoder layer (A100's NVLink 3: about 150, the previous default).
    intra_node_gbps: float = Field(
        360.0,
        gt=0,
        description="GB/s of a collective's bus bandwidth between the GPUs of one node (NVLink); the "
        "time estimate's communication term for FSDP and ZeRO-3 within a node.",
    )
    # Rail-optimised H100 nodes (NVIDIA's DGX H100 / HGX reference design) give every GPU its own
    # 400 Gb/s NDR InfiniBand NIC (ConnectX-7): 50 GB/s of line rate, of which NCCL's ring reaches about
    # 90 %. (The articles' A100 nodes on AWS had 400 Gb/s of EFA for the whole node.)
    inter_node_gbps: float = Field(
        45.0,
        gt=0,
        description="GB/s each GPU moves to the other nodes (its 400 Gb/s NIC: 45 after NCCL's overheads); "
        "the communication term of jobs over several nodes, and what job.sbatch's NCCL check expects.",
    )
    hub_download_gbps: float = Field(
        0.25,
        gt=0,
        description="GB/s of the fetch step's download from the Hugging Face Hub (inside the job's "
        "allocation, while its GPUs wait); counted in the time estimate of a job that names a hub model.",
    )
    comm_overlap: float = Field(
        0.5,
        ge=0,
        le=1,
        description="The share of the per-step collectives hidden behind compute (FSDP and ZeRO-3 "
        "prefetch the next layer); the rest adds to the time estimate.",
    )
    price_per_device_hour: float | None = Field(
        None, ge=0, description="Price of one device (GPU, or CPU slot) hour; set: every plan shows a cost."
    )

    # Periodic work
    reconcile_interval_seconds: float = Field(2.0, gt=0)
    ingest_interval_seconds: float = Field(1.0, gt=0)

    # Webhooks (worker.webhooks sends; ftq.contract.events checks the receiver's address)
    webhook_interval_seconds: float = Field(
        1.0, gt=0, description="How often the worker looks for webhook deliveries that are due."
    )
    webhook_timeout_seconds: float = Field(
        5.0,
        gt=0,
        le=60,
        description="One delivery attempt's total deadline: connect, send and the answer's headers together "
        "(a receiver that trickles its answer is cut off at it).",
    )
    webhook_slots: int = Field(
        8, ge=1, le=64, description="Webhook endpoints the sender drains at once (one request each)."
    )
    webhook_slots_per_owner: int = Field(
        2,
        ge=1,
        le=64,
        description="Of those, how many one owner's endpoints may take: one tenant's slow receivers "
        "delay only that tenant's deliveries.",
    )
    webhook_retry_base_seconds: float = Field(
        5.0, gt=0, description="Delay before the first retry; each further retry waits twice as long."
    )
    webhook_retry_max_delay_seconds: float = Field(
        3600.0, gt=0, description="The longest wait between two tries of one delivery."
    )
    webhook_retry_total_seconds: float = Field(
        86400.0,
        gt=0,
        description="How long a delivery is retried after its first try before it fails (24 h).",
    )
    webhook_disable_after_failures: int = Field(
        5,
        ge=1,
        description="An endpoint whose deliveries failed (retries exhausted) this many times in a row is "
        "disabled until its owner enables it again.",
    )
    webhook_allowed_networks: str = Field(
        "",
        description="Comma-separated networks (e.g. `10.1.0.0/16,127.0.0.1/32`) webhooks may be sent to "
        "although private or loopback; outside FTQ_ENV=development such addresses are refused otherwise.",
    )
    max_webhooks_per_owner: int = Field(20, ge=1, description="Webhooks one owner may register.")

    @field_validator("env")
    @classmethod
    def _env(cls, v: str) -> str:
        if v not in ("development", "production", "test"):
            raise ValueError("FTQ_ENV must be development, production or test")
        return v

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        level = v.strip().upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("FTQ_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return level

    @field_validator("run_as_user")
    @classmethod
    def _run_as_user(cls, v: str) -> str:
        value = v.strip()
        items = [] if not value else [value] if ":" not in value else value.split(",")
        for item in items:
            owner, sep, user = item.strip().partition(":")
            if sep and not owner.strip():
                raise ValueError("FTQ_RUN_AS_USER items are `owner:user` (`*:user` for every other owner)")
            if not _USER_NAME.match((user if sep else owner).strip()):
                raise ValueError(f"FTQ_RUN_AS_USER: {item.strip()!r} does not name a user")
        return value

    @field_validator("max_priority")
    @classmethod
    def _max_priority(cls, v: str) -> str:
        for name, level in owner_map(v).items():
            if level not in ("low", "normal", "high"):
                raise ValueError(f"FTQ_MAX_PRIORITY: {name}:{level}: the level is low, normal or high")
        return v

    @field_validator("quota_gpus", "quota_cpu_slots", "quota_gpu_hours", "gpu_peak_tflops", "gpu_memory_gbps")
    @classmethod
    def _numbers(cls, v: str) -> str:
        for name, value in owner_map(v).items():
            try:
                if float(value) < 0:
                    raise ValueError
            except ValueError:
                raise ValueError(f"{name}:{value}: not a non-negative number") from None
        return v

    @field_validator("slurm_qos", "slurm_qos_high", "slurm_qos_low")
    @classmethod
    def _qos(cls, v: str) -> str:
        if v and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$", v):
            raise ValueError(f"not a QOS name: {v!r}")
        return v

    @field_validator("slurm_mem")
    @classmethod
    def _slurm_mem(cls, v: str) -> str:
        value = v.strip()
        if value and not _SLURM_SIZE.match(value):
            raise ValueError(f"FTQ_SLURM_MEM must be a SLURM size such as 0, 512000 or 500G, not {value!r}")
        return value

    @field_validator("slurm_nccl_env")
    @classmethod
    def _slurm_nccl_env(cls, v: str) -> str:
        slurm_env_lines(v)  # raises on a line that is not NAME=value
        return v

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.env == "production" and not self.tokens:
            raise ValueError("FTQ_ENV=production needs FTQ_API_TOKENS")
        if self.env == "production" and self.sqlalchemy_url.startswith("sqlite"):
            raise ValueError("FTQ_ENV=production needs FTQ_DATABASE_URL (PostgreSQL)")
        return self

    # Derived values -------------------------------------------------------------------------------
    @property
    def data_path(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def development(self) -> bool:
        """FTQ_ENV=development (the default): webhooks may go to loopback receivers."""
        return self.env == "development"

    def state_path(self, name: str) -> Path:
        """Where ftq's own `name` (one of DATA_DIR_STATE) lies in the data dir."""
        if name not in DATA_DIR_STATE:
            raise ValueError(f"{name} is not one of ftq's data dir names (DATA_DIR_STATE)")
        return self.data_path / name

    @property
    def runs_dir(self) -> Path:
        return self.state_path("runs")

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            url = self.database_url
            # Accept the URL forms operators paste (postgres://, postgresql://) and use psycopg 3.
            for prefix in ("postgres://", "postgresql://"):
                if url.startswith(prefix):
                    return "postgresql+psycopg://" + url[len(prefix) :]
            return url
        return f"sqlite:///{self.state_path('ftq.db')}"

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def uses_embedded_broker(self) -> bool:
        return self.celery_broker_url.startswith("filesystem://")

    @property
    def tokens(self) -> dict[str, str]:
        """token -> owner."""
        out: dict[str, str] = {}
        for item in self.api_tokens.split(","):
            item = item.strip()
            if not item:
                continue
            token, _, owner = item.partition(":")
            if not token or not owner:
                raise ValueError("FTQ_API_TOKENS items are `token:owner`")
            out[token] = owner
        return out

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens)

    def owner_for_token(self, token: str) -> str | None:
        # Compare against every token in constant time so timing says nothing about near misses.
        found = None
        for known, owner in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = owner
        return found

    @property
    def allowed_roots(self) -> list[Path]:
        if self.local_roots:
            roots = [Path(p) for p in self.local_roots.split(":") if p]
        else:
            roots = [self.data_path, EXAMPLES_DIR]
        return [p.expanduser().resolve() for p in roots]

    def max_priority_for(self, owner: str) -> str:
        """The highest priority this owner may ask for (FTQ_MAX_PRIORITY)."""
        caps = owner_map(self.max_priority)
        return caps.get(owner) or caps.get("*") or "high"

    def quota_for(self, pool: str, owner: str) -> int | None:
        """Devices of `pool` (gpus | cpu_slots) this owner may hold at once; None: no quota."""
        text = self.quota_gpus if pool == "gpus" else self.quota_cpu_slots
        caps = owner_map(text)
        value = caps.get(owner) or caps.get("*")
        return int(value) if value else None

    def gpu_hours_quota_for(self, owner: str) -> float | None:
        caps = owner_map(self.quota_gpu_hours)
        value = caps.get(owner) or caps.get("*")
        return float(value) if value else None

    @property
    def peak_tflops_by_gpu(self) -> dict[str, float]:
        return {k.upper(): float(v) for k, v in owner_map(self.gpu_peak_tflops).items()}

    @property
    def memory_gbps_by_gpu(self) -> dict[str, float]:
        return {k.upper(): float(v) for k, v in owner_map(self.gpu_memory_gbps).items()}

    def remote_code_allowed(self, owner: str) -> bool:
        """Whether this owner's jobs may set `model.trust_remote_code` (FTQ_ALLOW_REMOTE_CODE)."""
        return _owners_allowed(self.allow_remote_code, owner)

    def oversubscribe_host_allowed(self, owner: str) -> bool:
        """Whether this owner's `allow_oversubscribe` also skips the disk and host-memory checks."""
        return _owners_allowed(self.allow_oversubscribe, owner)

    @property
    def host_memory_bytes(self) -> int:
        if self.host_memory_gb:
            return int(self.host_memory_gb * 1024**3)
        return host_mem_total()

    @property
    def allowed_host_names(self) -> frozenset[str] | None:
        """Lower-case names the Host header may carry (no port); None: any."""
        names = {h.strip().lower().strip("[]") for h in self.allowed_hosts.split(",") if h.strip()}
        if "*" in names:
            return None
        if not names:
            if self.auth_enabled:
                return None
            names = {"localhost", "127.0.0.1", "::1", self.host.strip().lower().strip("[]")}
        return frozenset(names)

    @property
    def gpu_indices(self) -> list[int]:
        return [int(x) for x in self.gpu_pool.split(",") if x.strip()]

    @property
    def pass_env_names(self) -> list[str]:
        return [x.strip() for x in self.pass_env.split(",") if x.strip()]

    @property
    def grader_score_model_names(self) -> list[str]:
        return [x.strip() for x in self.grader_score_models.split(",") if x.strip()]

    @property
    def run_users(self) -> dict[str, str]:
        """owner -> run user from FTQ_RUN_AS_USER (`*`: every owner not named); empty: no switch."""
        value = self.run_as_user.strip()
        if not value:
            return {}
        if ":" not in value:
            return {"*": value}
        out: dict[str, str] = {}
        for item in value.split(","):
            owner, _, user = item.strip().partition(":")
            if item.strip():
                out[owner.strip()] = user.strip()
        return out

    def run_user_for(self, owner: str | None) -> str | None:
        """The user this owner's local runs start as; None: the worker's own (FTQ_RUN_AS_USER unset).
        A mapping that names neither this owner nor `*` is a LookupError: such a run is not started
        rather than started unconfined."""
        users = self.run_users
        if not users:
            return None
        user = users.get(owner or "") or users.get("*")
        if not user:
            raise LookupError(f"FTQ_RUN_AS_USER names no run user for owner {owner!r} (and no `*`)")
        return user

    def gpu_memory_bytes_for(self, partition: str | None) -> int:
        gb = self.gpu_memory_gb
        for item in self.gpu_memory_gb_by_partition.split(","):
            name, _, value = item.partition(":")
            if partition and name.strip() == partition and value:
                gb = float(value)
        return int(gb * 1024**3)

    @property
    def hub_cache_dir(self) -> Path:
        """The fetch step's Hugging Face cache (FTQ_HUB_CACHE, else data_dir/hub), absolute."""
        return (self.hub_cache or self.state_path("hub")).expanduser().resolve()

    def secret_values(self) -> list[str]:
        """What is masked wherever the service stores or serves text: the pass-through secrets, the
        operator's Hub token (an export that pushes has it in its environment) and the tracker
        credentials."""
        values = [os.environ[n] for n in self.pass_env_names if os.environ.get(n)]
        if self.hub_token:
            values.append(self.hub_token)
        _, user, password = split_userinfo(self.mlflow_tracking_uri)
        if password:
            values += [password, quote(password, safe="")]
            if user:
                values.append(f"{quote(user, safe='')}:{quote(password, safe='')}")
        return [v for v in dict.fromkeys(values) if v]

    @property
    def mlflow_url(self) -> str:
        """FTQ_MLFLOW_TRACKING_URI as shown and handed to runs: without credentials."""
        return split_userinfo(self.mlflow_tracking_uri)[0]

    def mlflow_credentials(self) -> dict[str, str]:
        """The credentials of FTQ_MLFLOW_TRACKING_URI as MLflow's own environment variables."""
        _, user, password = split_userinfo(self.mlflow_tracking_uri)
        env = {}
        if user:
            env["MLFLOW_TRACKING_USERNAME"] = user
        if password:
            env["MLFLOW_TRACKING_PASSWORD"] = password
        return env


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(url without `user:password@`, user, password), the two URL-decoded; a URL without them as is."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    return (
        urlunsplit(parts._replace(netloc=hostport)),
        unquote(user) or None,
        unquote(password) if sep else None,
    )


def owner_map(value: str) -> dict[str, str]:
    """`name:value,name:value` (FTQ_MAX_PRIORITY, FTQ_QUOTA_*) as a dict; blanks ignored."""
    out: dict[str, str] = {}
    for item in value.split(","):
        name, sep, v = item.strip().rpartition(":")
        if sep and name.strip() and v.strip():
            out[name.strip()] = v.strip()
    return out


def _owners_allowed(value: str, owner: str) -> bool:
    """An operator policy written `false`, `true` or `owner1,owner2`."""
    value = value.strip()
    if value.lower() in ("", "false", "0", "no", "off"):
        return False
    if value.lower() in ("true", "1", "yes", "on", "*"):
        return True
    return owner in {o.strip() for o in value.split(",") if o.strip()}


def host_mem_total() -> int:
    """This machine's RAM in bytes (MemTotal); the page count when /proc/meminfo is not there."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_SLURM_SIZE = re.compile(r"^[0-9]+[KMGT]?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def slurm_env_lines(text: str) -> list[tuple[str, str]]:
    """FTQ_SLURM_NCCL_ENV as (name, value) pairs; a line that is not `NAME=value` is a ValueError."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not _ENV_NAME.match(name.strip()) or "\x00" in value:
            raise ValueError(f"FTQ_SLURM_NCCL_ENV lines are NAME=value: {line!r}")
        out.append((name.strip(), value.strip()))
    return out


@lru_cache
def get_settings() -> Settings:
    return Settings()
