"""The evaluation controller: the third kind of run the one scheduler places (after jobs and exports).
An evaluation is `python -m trainer.evaluate` launched into `<run dir>/evaluations/<evaluation id>/`
(launch.sh locally, job.sbatch on SLURM) through the job's launcher, one process on as many GPUs of one node
as its base needs (`evaluation_gpus`; one CPU slot for a CPU job), and
driven through `worker.lifecycle` as an export is (`worker.exports`): same quotas, fair share,
reservations, queue reasons and compare-and-set transitions (`ftq.store.evaluations.EVALUATIONS`).

What is an evaluation's own:
- `queue_due`: each sweep queues the evaluations the spec's `eval.on` asks for: one per complete checkpoint
  (`on: checkpoint`), and one of final/ once the job succeeded (either `on`);
- `before_end`: its results.json becomes the row's metrics before its end is recorded (the end is a
  job.evaluation event, with the job's best checkpoint then);
- `rotate`: with evaluated checkpoints the trainer does not rotate (trainer.train leaves
  save_total_limit to the worker); here a checkpoint is removed only once it is scored, it is not the best
  one, and `save_total_limit` newer ones are kept.
"""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.evaluation import EVALUATION_REQUEST, EVALUATIONS, RESULTS
from ftq.contract.spec import JobSpec
from ftq.contract.status import LAUNCHED, TERMINAL, JobStatus
from ftq.planning.estimate import (
    QLORA_DOUBLE_QUANT_SCALE_BYTES,
    QLORA_SCALE_BYTES,
    QLORA_WEIGHT_BYTES,
    load_model_config,
    parse_arch,
)
from ftq.planning.serving import TooLarge, engine_size
from ftq.runtime.settings import Settings, get_settings
from ftq.store import evaluations as store
from ftq.store import repository, side_runs
from ftq.store.db import session_scope
from ftq.store.models import Evaluation, Job
from worker import scheduling
from worker.lifecycle import LauncherFor
from worker.side_runs import SideRunKind, SideRunView

log = logging.getLogger(__name__)
# A succeeded job is looked at for its final evaluation and its checkpoints this long after it ended.
DUE_WINDOW = timedelta(days=1)


def evaluation_dir(run_dir: Path, evaluation_id: str) -> Path:
    return run_dir / EVALUATIONS / evaluation_id


# How many GPUs an evaluation takes ----------------------------------------------------------------------
#
# trainer.evaluate loads the base in bfloat16 on GPUs (a QLoRA job's in 4 bits, as it trained) and spreads
# it over the GPUs it is given (accelerate's device_map="auto"): as many of one node as hold the weights,
# counted as a serving engine counts them (ftq.planning.serving.engine_size, from the estimate's count).
# The dtype trainer.evaluate loads a base in on a GPU.
EVAL_DTYPE = "bfloat16"
_EVAL_DTYPE_BYTES = 2


def quantized_weights_bytes(model_config: dict[str, Any], spec: JobSpec) -> float | None:
    """A QLoRA base's weights as bitsandbytes holds them: the decoder layers' Linear weights in 4 bits
    with their scales (ftq.planning.estimate's figures), the rest (embeddings, head, norms) in bfloat16.
    None without quantization or where the config is not a model the estimate counts."""
    quant = spec.lora.quantization if spec.lora is not None else None
    arch = parse_arch(model_config)
    if quant is None or arch is None:
        return None
    linear = arch.layers * sum(lin.d_in * lin.d_out for lin in arch.linears)
    per = QLORA_WEIGHT_BYTES + (QLORA_DOUBLE_QUANT_SCALE_BYTES if quant.double_quant else QLORA_SCALE_BYTES)
    return linear * per + (arch.num_params - linear) * _EVAL_DTYPE_BYTES


def evaluation_gpus(
    spec: JobSpec, model_config: dict[str, Any] | None, *, gpu_memory_bytes: int, gpus_per_node: int
) -> int:
    """The GPUs (of one node) an evaluation of this job asks for: engine_size's count for the base's
    weights in the evaluation's dtype (a QLoRA base's in 4 bits). One for a CPU job (one slot), and where
    the model's config is not on this machine (a hub id not in the cache); the whole node where even that
    cannot hold it (accelerate then keeps what does not fit in the host's RAM)."""
    if spec.resources.device != "cuda" or model_config is None:
        return 1
    config = {**model_config, "torch_dtype": EVAL_DTYPE}
    memory = gpu_memory_bytes
    arch = parse_arch(model_config)
    four_bit = quantized_weights_bytes(model_config, spec)
    if four_bit and arch is not None:
        # engine_size counts every weight at 2 bytes: a 4-bit base fits where 2-byte weights would on a
        # GPU larger by their ratio (engine_size's test is weights / GPUs <= a share of one GPU's memory).
        memory = int(gpu_memory_bytes * arch.num_params * _EVAL_DTYPE_BYTES / four_bit)
    per_node = max(1, gpus_per_node)
    try:
        size = engine_size(config, device="cuda", gpu_memory_bytes=memory, gpus_per_node=per_node)
    except TooLarge:
        return per_node
    return min(size.devices, per_node)


def gpus_per_node(settings: Settings, launcher: str) -> int:
    """The GPUs an evaluation may span: a node's (FTQ_SERVE_GPUS_PER_NODE, as an engine's), and locally at
    most the pool's."""
    pool = len(settings.gpu_indices) if launcher == "local" else 0
    return min(settings.serve_gpus_per_node, pool) if pool else settings.serve_gpus_per_node


def evaluation_gpus_of(spec: JobSpec, settings: Settings) -> int:
    """evaluation_gpus for a job's spec, its model's config read from its folder or the hub cache."""
    if spec.resources.device != "cuda":
        return 1
    config, _why = load_model_config(spec.model.name_or_path, spec.model.revision, settings.max_config_bytes)
    partition = spec.resources.slurm.partition or settings.slurm_partition
    return evaluation_gpus(
        spec,
        config,
        gpu_memory_bytes=settings.gpu_memory_bytes_for(partition),
        gpus_per_node=gpus_per_node(settings, spec.resources.launcher),
    )


# What the spec's eval.on asks for ---------------------------------------------------------------------


def _wants(spec: dict[str, Any] | None) -> tuple[bool, bool]:
    """(evaluate checkpoints, evaluate final/) for a job's spec."""
    ev = (spec or {}).get("eval") or {}
    if not ev.get("suites"):
        return False, False
    return ev.get("on") == "checkpoint", True


def queue_due(now: datetime | None = None) -> int:
    """Queue the evaluations the jobs' specs ask for and that are not queued yet; rotate what may go.
    Returns how many were queued."""
    now = now or datetime.now(UTC)
    runs_dir = get_settings().runs_dir
    queued = 0
    with session_scope() as session:
        stmt = select(Job).where(
            (Job.status.in_([str(s) for s in LAUNCHED]))
            | ((Job.status == JobStatus.succeeded) & (Job.finished_at >= now - DUE_WINDOW))
        )
        for job in session.scalars(stmt):
            checkpoints, final = _wants(job.spec)
            if not (checkpoints or final):
                continue
            have = store.of_job(session, job.id)
            auto = {(e.trigger, e.step) for e in have if e.trigger != store.TRIGGER_REQUEST}
            run_dir = runs.run_dir(runs_dir, job.id)
            if checkpoints:
                for c in runs.list_checkpoints(run_dir):
                    if c.resumable and (store.TRIGGER_CHECKPOINT, c.step) not in auto:
                        store.add_evaluation(
                            session, job.id, step=c.step, suites=None, trigger=store.TRIGGER_CHECKPOINT
                        )
                        queued += 1
            final_due = final and job.status == JobStatus.succeeded
            if final_due and (store.TRIGGER_FINAL, None) not in auto and (run_dir / runs.FINAL).is_dir():
                store.add_evaluation(session, job.id, step=None, suites=None, trigger=store.TRIGGER_FINAL)
                queued += 1
            if checkpoints:
                rotate(job, run_dir, store.of_job(session, job.id))
        session.commit()
    return queued


def keep(spec: dict[str, Any] | None, steps: list[int], evaluations: list[Evaluation]) -> set[int]:
    """The checkpoints rotation keeps: the newest `save_total_limit`, the best one, and every one not
    scored yet (an evaluation of it queued or running, or none yet). All of them without a limit."""
    limit = ((spec or {}).get("training") or {}).get("save_total_limit")
    if not limit:
        return set(steps)
    kept = set(sorted(steps)[-int(limit) :])
    done = {e.step for e in evaluations if e.status in TERMINAL and e.trigger == store.TRIGGER_CHECKPOINT}
    kept |= {s for s in steps if s not in done}
    best = store.best_checkpoint(spec, evaluations)
    if best is not None:
        kept.add(best.step)
    return kept


def rotate(job: Job, run_dir: Path, evaluations: list[Evaluation]) -> list[int]:
    """Remove the checkpoints `keep` lets go; returns their steps."""
    found = {c.step: c.path for c in runs.list_checkpoints(run_dir) if c.resumable}
    kept = keep(job.spec, list(found), evaluations)
    removed = []
    for step, path in found.items():
        if step not in kept and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(step)
            log.info("job %s: checkpoint-%s removed (scored, not the best, past the limit)", job.id, step)
    return removed


def read_results(folder: Path) -> dict[str, float] | None:
    try:
        data = json.loads(runs.read_run_file(folder / RESULTS, 16 * 1024 * 1024))
    except (OSError, ValueError):
        return None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict):
        return None
    return {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class EvaluationKind(SideRunKind):
    """An evaluation as `worker.lifecycle` drives it (as `worker.exports.ExportKind` an export), with what
    is its own: the due ones queued after each sweep, its results stored before its end is recorded."""

    name = scheduling.EVALUATION
    run_noun = "evaluation"
    transitions = store.EVALUATIONS
    table = Evaluation
    folder = EVALUATIONS
    module = "trainer.evaluate"
    request_file = EVALUATION_REQUEST

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}  # job id -> its evaluations' GPUs (its base does not change)

    def request_of(self, ev: Evaluation, job: Job, run_dir: Path) -> dict[str, Any]:
        """evaluation.json: everything `trainer.evaluate` needs (paths the server chose, never a client)."""
        plan_command = (job.plan or {}).get("command") or []
        return {
            "evaluation_id": ev.id,
            "job_id": job.id,
            "run_dir": str(run_dir),
            "out_dir": str(evaluation_dir(run_dir, ev.id)),
            "step": ev.step,
            "suites": ev.suites or [],
            "trust_remote_code": "--trust_remote_code" in plan_command,
        }

    def devices_of(self, session: Session, row: Any) -> int:
        """A queued evaluation's GPUs: what its job's base needs (evaluation_gpus), counted once a job."""
        ev = side_runs.get_row(session, Evaluation, row.id)
        # By its id (the table's primary key is its seq): session.get would be None on SQLite, an error on
        # PostgreSQL.
        job = repository.get_job(session, ev.job_id) if ev is not None else None
        if job is None:
            return 1
        cached = self._sizes.get(job.id)
        if cached is None:
            try:
                spec = JobSpec.model_validate(job.spec)
            except ValidationError:
                return 1
            if len(self._sizes) > 4096:
                self._sizes.clear()
            cached = self._sizes[job.id] = self.devices_for(job, spec)
        return cached

    def devices_for(self, job: Job, spec: JobSpec) -> int:
        return evaluation_gpus_of(spec, get_settings())

    def sweep(self, launcher_for: LauncherFor) -> None:
        """Settle launched evaluations, then queue the due ones and rotate scored checkpoints. The caller
        holds the reconcile singleton (`worker.controller.reconcile`)."""
        super().sweep(launcher_for)
        queue_due()

    def before_end(self, v: SideRunView) -> None:
        metrics = read_results(v.run_dir)
        if metrics is None:
            return
        with session_scope() as session:
            store.store_metrics(session, v.id, metrics)
            session.commit()


EVALUATIONS_KIND = EvaluationKind()
sweep = EVALUATIONS_KIND.sweep
cancel_requested = EVALUATIONS_KIND.cancel_requested
