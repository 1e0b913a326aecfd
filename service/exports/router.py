"""HTTP routes for a job's exports: the routes of every side run (`service.side_run_routes`), with an
export's models and answers."""

from __future__ import annotations

from ftq.contract.schemas import ExportCreate, ExportList, ExportPublic
from service.exports import service as exports
from service.routes import error
from service.side_run_routes import side_run_router

router = side_run_router(
    exports.RULES,
    exports.create,
    (ExportCreate, ExportPublic, ExportList),
    "exp_",
    {
        200: {"model": ExportPublic, "description": "An identical export is under way or done: that one"},
        400: {"description": "A body that does not parse"},
        409: error("The job has not succeeded, or `adapter` was asked of a full fine-tune"),
        422: {"description": "A bad field (kind, dtype, max_shard_size, push_to_hub), named in the error"},
    },
    (
        "Export a succeeded job's model (merged weights or the adapter)",
        "List a job's exports",
        "Cancel an export; idempotent, and a finished export is returned unchanged",
    ),
)
