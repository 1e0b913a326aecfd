"""A submitted spec's way to its plan, in one pipeline (`plan_submission`), which the real submit and the
dry run both call once: the operator's policy, the local paths resolved, the uploads and the checkpoint it
names, the memory and disk estimate, the dataset preflight, and the render (with its time estimate).

It lives in the service, not in `ftq.planning`, because its steps need what the service owns: the store
(whether a run directory is the caller's, the job `resume_from` names, the owner's uploads), the 422 that
names a field (`service.errors.SpecError`), and the request's `Deadline` with the thread pool it runs file
work in. `ftq.planning` stays what its steps compute with, pure functions of the spec, the settings and
the files the spec names.

A step that finds something the user must fix before anything else can be checked raises the 422 itself
(policy, paths, uploads, resume_from, the deadline); the ones that still leave a plan to show (the pool,
the model and dataset files, what fits) are collected as `Planned.refusals`: submit refuses with them,
a dry run shows them as the plan's warnings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.graders import score_models
from ftq.contract.plans import Plan
from ftq.contract.spec import PRIORITY_RANK, JobSpec, Priority
from ftq.planning.render import render_plan
from ftq.runtime import files, limits
from ftq.runtime.settings import Settings
from ftq.store.files_repository import FileRepository
from ftq.store.repository import JobRepository
from service.errors import SpecError, spec_field_error
from service.files import service as file_service
from service.jobs import checkpoints, preflight


@dataclass
class Planned:
    """What planning made of a spec: the spec with its local paths resolved (the one stored), its plan,
    and the problems a submit refuses it for (each a 422 error: loc, msg, type)."""

    spec: JobSpec
    plan: Plan
    refusals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """The refusals as a dry run shows them: `field.path: why`."""
        return [".".join(str(p) for p in r["loc"][1:]) + f": {r['msg']}" for r in self.refusals]


def plan_submission(spec: JobSpec, repo: JobRepository, settings: Settings, *, job_id: str) -> Planned:
    """The pipeline: each step in the order a user meets its 422 (the cheap, field-level ones first)."""
    check_policy(spec, settings, repo.owner)
    deadline = preflight.Deadline(settings.preflight_timeout_seconds)
    spec = preflight.resolve_paths(spec, settings, repo, deadline)
    upload = _training_upload(spec, repo, settings)
    resume = checkpoints.resume_checkpoint(spec, repo, settings)
    estimate, refusals = preflight.preflight(spec, settings, repo.owner, deadline)
    data = preflight.dataset_preflight(spec, settings, deadline, upload)
    plan = render_plan(
        spec,
        job_id=job_id,
        run_dir=runs.run_dir(settings.runs_dir, job_id),
        settings=settings,
        estimate=estimate,
        resume_from_checkpoint=resume,
        dataset=data,
    )
    return Planned(spec=spec, plan=plan, refusals=refusals)


def _training_upload(
    spec: JobSpec, repo: JobRepository, settings: Settings
) -> tuple[Path, int | None] | None:
    """(path, rows) of the upload `dataset.file_id` names, for the dataset preflight. Every file the spec
    names must be the owner's and ready, or a 422 names its field (the same for a file that is another
    owner's as for one that does not exist)."""
    uploads = file_service.files_of_spec(spec, FileRepository(repo.session, repo.owner))
    train = uploads.get("file_id")
    if train is None:
        return None
    return files.file_path(settings.data_path, repo.owner, train.id), train.rows


# Policy -------------------------------------------------------------------------------------------------


def check_policy(spec: JobSpec, settings: Settings, owner: str) -> None:
    """What the operator allows one owner's job to do, beyond what the schema allows anyone."""
    if spec.model.trust_remote_code and not settings.remote_code_allowed(owner):
        # Code from a model repo runs inside the launch, with everything the launch can read.
        raise spec_field_error(
            ["model", "trust_remote_code"],
            "running code from the model repo is not allowed on this server; use a model that "
            "transformers supports natively, or ask the operator (FTQ_ALLOW_REMOTE_CODE)",
            "not_allowed",
        )
    if spec.integrations.mlflow is not None and not settings.mlflow_tracking_uri:
        # MLflow's default is a folder next to the process: the run would log where nobody looks.
        raise spec_field_error(
            ["integrations", "mlflow"],
            "this server has no MLflow tracking server to log to; ask the operator to set "
            "FTQ_MLFLOW_TRACKING_URI, or leave integrations.mlflow out",
            "not_configured",
        )
    if spec.integrations.wandb is not None and not _wandb_usable(settings):
        raise spec_field_error(
            ["integrations", "wandb"],
            "this server has no W&B key for runs (WANDB_API_KEY through FTQ_PASS_ENV) and does not log W&B "
            "offline (FTQ_WANDB_MODE); ask the operator, or leave integrations.wandb out",
            "not_configured",
        )
    cap = settings.max_priority_for(owner)
    if PRIORITY_RANK[Priority(spec.priority)] > PRIORITY_RANK[Priority(cap)]:
        raise spec_field_error(
            ["priority"],
            f"{owner} may ask for priority {cap} at most on this server (FTQ_MAX_PRIORITY); "
            f"use priority: {cap}",
            "operator_cap",
        )
    errors = [
        {"loc": ["body", "resources", *loc], "msg": msg, "type": "operator_cap"}
        for loc, msg in _over_caps(spec, settings)
    ]
    if errors:
        raise SpecError(errors)
    check_grpo_policy(spec, settings)


def check_grpo_policy(spec: JobSpec, settings: Settings) -> None:
    """A GRPO job's score models must be ones the operator allows (FTQ_GRADER_SCORE_MODELS)."""
    grader = spec.training.grader
    if grader is None:
        return
    allowed = set(settings.grader_score_model_names)
    errors = [
        {
            "loc": ["body", "training", *loc],
            "msg": f"model {model!r} is not one this server allows for score_model graders "
            f"(FTQ_GRADER_SCORE_MODELS: {', '.join(sorted(allowed)) or 'none'})",
            "type": "not_allowed",
        }
        for loc, model in score_models(grader)
        if model not in allowed
    ]
    if errors:
        raise SpecError(errors)
    # Whether vllm is installed (training.grpo.use_vllm) is checked where the job runs, not here: the
    # API's environment says nothing of the nodes' (launch.sh and job.sbatch fail with a clear error).


def _wandb_usable(settings: Settings) -> bool:
    """Whether a W&B run can start: offline or disabled needs no key; online needs the operator's."""
    if settings.wandb_mode in ("offline", "disabled"):
        return True
    return "WANDB_API_KEY" in settings.pass_env_names and bool(os.environ.get("WANDB_API_KEY"))


def _over_caps(spec: JobSpec, settings: Settings) -> list[tuple[list[str], str]]:
    """The operator's caps on one job (FTQ_MAX_*) this spec goes beyond: (field under resources, why)."""
    res = spec.resources
    over: list[tuple[list[str], str]] = []
    if res.num_nodes > settings.max_nodes_per_job:
        over.append(
            (
                ["num_nodes"],
                f"{res.num_nodes} nodes exceeds the operator's cap "
                f"FTQ_MAX_NODES_PER_JOB={settings.max_nodes_per_job}",
            )
        )
    world = f"{res.num_nodes} node(s) x {res.processes_per_node} = {res.world_size}"
    if res.device == "cuda" and res.world_size > settings.max_gpus_per_job:
        over.append(
            (
                ["processes_per_node"],
                f"{world} GPUs exceeds the operator's cap FTQ_MAX_GPUS_PER_JOB={settings.max_gpus_per_job}",
            )
        )
    if res.world_size > settings.max_processes_per_job:
        over.append(
            (
                ["processes_per_node"],
                f"{world} processes exceeds the operator's cap "
                f"FTQ_MAX_PROCESSES_PER_JOB={settings.max_processes_per_job}",
            )
        )
    asked = res.slurm.time_limit
    if asked and limits.slurm_time_seconds(asked) > limits.max_seconds(settings):
        over.append(
            (
                ["slurm", "time_limit"],
                f"{asked} exceeds the operator's cap "
                f"FTQ_MAX_TIME_LIMIT_HOURS={settings.max_time_limit_hours:g}; ask for less and resume "
                "from a checkpoint with resume_from",
            )
        )
    return over
