"""The export controller: drives each export through a job's states (queued -> starting -> running ->
succeeded | failed | cancelled) through `worker.lifecycle`, as `worker.controller` drives jobs: the one
scheduler (`worker.controller.schedule`, `worker.scheduling.decide`) places the one slot an export takes of
the local pool with the jobs, under the same quotas, fair share and reservation; the job's launcher, and
`worker.recovery.why_it_failed` for why it failed. What every side run shares (what it asks of the
scheduler, its folder, its lifecycle steps) is `worker.side_runs.SideRunKind`; what is an export's own is
`ExportKind` here: its row in `ftq.store.exports` (its transitions `EXPORTS`), its request file
(export.json) and the operator's Hub token. An export never runs in the worker: it is
`python -m trainer.export` launched into `<run dir>/exports/<export id>/` (launch.sh locally, job.sbatch
on SLURM).

Every function is safe to run twice or concurrently, for the same reasons as the controller's:
compare-and-set transitions in the store (`ftq.store.transitions`), and a launch adopted from the export
directory's records when its worker died before storing the handle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.planning.render import EXPORT_MODULE
from ftq.runtime.settings import get_settings
from ftq.store import evaluations
from ftq.store import exports as store
from ftq.store.db import session_scope
from ftq.store.models import Export, Job
from worker import scheduling
from worker.side_runs import SideRunKind

# The operator's Hub token reaches the export's process under this name (huggingface_hub reads it).
HUB_TOKEN_ENV = "HF_TOKEN"  # noqa: S105 (a variable name, not a secret)


class ExportKind(SideRunKind):
    """An export as `worker.lifecycle` drives it: its row in `ftq.store.exports`, its folder and its
    request (export.json and the operator's Hub token); nothing more of its own."""

    name = scheduling.EXPORT
    run_noun = "export"
    transitions = store.EXPORTS
    table = Export
    folder = runs.EXPORTS
    module = EXPORT_MODULE
    request_file = runs.EXPORT_REQUEST

    def request_of(self, export: Export, job: Job, run_dir: Path) -> dict[str, Any]:
        """export.json: everything `trainer.export` needs (paths the server chose, never a client)."""
        plan_command = (job.plan or {}).get("command") or []
        checkpoint: dict[str, Any] = {}
        if export.step is not None:
            # A checkpoint's export, with what its evaluations scored for the model card.
            with session_scope() as session:
                rows = evaluations.of_job(session, job.id)
                best = evaluations.best_checkpoint(job.spec, rows)
                checkpoint = {
                    "source": str(run_dir / runs.CHECKPOINTS / f"{runs.CHECKPOINT_PREFIX}{export.step}"),
                    "checkpoint": str(export.step),
                    "evaluation": evaluations.checkpoint_metrics(rows).get(export.step, {}),
                    "best_by": best.metric if best is not None and best.step == export.step else None,
                }
        return {
            **checkpoint,
            "export_id": export.id,
            "job_id": job.id,
            "kind": export.kind,
            "dtype": export.dtype,
            "max_shard_size": export.max_shard_size,
            "push_to_hub": export.push_to_hub,
            "run_dir": str(run_dir),
            "out_dir": str(runs.export_dir(run_dir, export.id)),
            # Remote code only where the operator's policy let the job itself run it (its rendered plan).
            "trust_remote_code": "--trust_remote_code" in plan_command,
        }

    def env_of(self, export: Export) -> dict[str, str]:
        hub_token = get_settings().hub_token
        return {HUB_TOKEN_ENV: hub_token} if export.push_to_hub and hub_token else {}


EXPORTS = ExportKind()
sweep = EXPORTS.sweep
cancel_requested = EXPORTS.cancel_requested
