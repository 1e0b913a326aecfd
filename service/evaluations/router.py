"""HTTP routes for a job's evaluations: the routes of every side run (`service.side_run_routes`), with an
evaluation's models and answers (a new evaluation is never an existing one: no 200)."""

from __future__ import annotations

from ftq.contract.schemas import EvaluationCreate, EvaluationList, EvaluationPublic
from service.evaluations import service as evaluations
from service.routes import error
from service.side_run_routes import side_run_router

router = side_run_router(
    evaluations.RULES,
    evaluations.create,
    (EvaluationCreate, EvaluationPublic, EvaluationList),
    "eval_",
    {
        409: error("The job has no eval.suites, no final/ yet (final), or no best checkpoint yet (best)"),
        429: error("FTQ_MAX_QUEUED_EVALUATIONS_PER_OWNER of yours already wait for a device"),
        400: {"description": "A body that does not parse"},
        422: {"description": "A bad field (checkpoint, suites), named in the error"},
    },
    (
        "Evaluate a checkpoint (final, best or a step) with the spec's suites",
        "List a job's evaluations, newest first",
        "Cancel an evaluation; idempotent, and a finished one is returned unchanged",
    ),
)
