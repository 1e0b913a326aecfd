"""The HTTP routes every kind of side run has under a job (an export, an evaluation): list, one, cancel.
Each kind's router adds its own create route and then these (`add_side_run_routes`).

This module does not postpone its annotations: FastAPI reads each route's parameters from annotations
that name values made per kind (the id in the path)."""

from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Path

from ftq.store import outbox
from service.deps import OwnerDep, SessionDep
from service.jobs.router import JobId
from service.routes import ID_MAX_LENGTH, Responses
from service.side_runs import SideRuns


def add_side_run_routes(
    router: APIRouter,
    rules: SideRuns[Any, Any],
    *,
    noun: str,
    plural: str,
    id_description: str,
    public: type,
    listing: type,
    errors: Responses,
    list_summary: str,
    cancel_summary: str,
) -> None:
    """`GET /jobs/{job_id}/<plural>`, `GET .../<plural>/{<noun>_id}` and `POST .../{<noun>_id}/cancel`,
    each named (its OpenAPI operation) as a route of this kind's own: `list_exports`, `get_export`."""
    row_id_name = f"{noun}_id"
    RowId = Annotated[
        str, Path(min_length=1, max_length=ID_MAX_LENGTH, description=id_description, alias=row_id_name)
    ]

    def list_rows(job_id: JobId, session: SessionDep, owner: OwnerDep) -> Any:
        return listing(data=rules.list_for(session, owner, job_id))

    def get_row(job_id: JobId, row_id: RowId, session: SessionDep, owner: OwnerDep) -> Any:
        return rules.with_queue(session, owner, [rules.get_or_404(session, owner, job_id, row_id)])[0]

    def cancel_row(
        job_id: JobId, row_id: RowId, session: SessionDep, owner: OwnerDep, background: BackgroundTasks
    ) -> Any:
        row = rules.cancel(session, owner, job_id, row_id)
        background.add_task(outbox.send_for_job, row.job_id)
        return rules.to_public(row, None)

    one = f"/{{job_id}}/{plural}/{{{row_id_name}}}"
    router.add_api_route(
        f"/{{job_id}}/{plural}",
        list_rows,
        methods=["GET"],
        name=f"list_{plural}",
        response_model=listing,
        responses=errors,
        summary=list_summary,
    )
    router.add_api_route(
        one,
        get_row,
        methods=["GET"],
        name=f"get_{noun}",
        response_model=public,
        responses=errors,
        summary=f"One {noun}",
    )
    router.add_api_route(
        f"{one}/cancel",
        cancel_row,
        methods=["POST"],
        name=f"cancel_{noun}",
        status_code=202,
        response_model=public,
        responses=errors,
        summary=cancel_summary,
    )
