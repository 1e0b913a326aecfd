"""The HTTP routes every kind of side run has under a job (an export, an evaluation): create, list, one,
cancel, each named (its OpenAPI operation) as a route of that kind's own (`create_export`,
`list_evaluations`). A kind's router module says only what differs: its rules, its request and response
models, its id's prefix, its create route's answers and the summaries.

This module does not postpone its annotations: FastAPI reads each route's parameters from annotations
that name values given per kind (the request body's model, the id in the path)."""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Path, Response
from sqlalchemy.orm import Session

from ftq.runtime.settings import Settings
from ftq.store import outbox
from service.deps import OwnerDep, SessionDep, SettingsDep
from service.jobs.router import JobId, JobLogRoute
from service.routes import ID_MAX_LENGTH, Responses, owner_errors
from service.side_runs import SideRuns

# A kind's create: (the row, True when an identical one already existed and is answered instead).
Create = Callable[[Session, str, Settings, str, Any], tuple[Any, bool]]


def side_run_router(
    rules: SideRuns[Any, Any],
    create: Create,
    models: tuple[type, type, type],
    id_prefix: str,
    create_responses: Responses,
    summaries: tuple[str, str, str],
) -> APIRouter:
    """The routes of one kind of side run (`rules.noun`): `models` its (create body, one, list) models;
    `summaries` its (create, list, cancel) routes' summaries."""
    noun, (body_model, public, listing) = rules.noun, models
    plural, row_id_name = f"{noun}s", f"{noun}_id"
    router = APIRouter(prefix="/jobs", tags=[plural], route_class=JobLogRoute)
    errors = owner_errors(f"No such job (or {noun}) for this owner")
    description = f"{noun.capitalize()} id, e.g. {id_prefix}0123456789abcdef"
    RowId = Annotated[
        str, Path(min_length=1, max_length=ID_MAX_LENGTH, description=description, alias=row_id_name)
    ]

    def create_row(
        job_id: JobId,
        body: body_model,  # type: ignore[valid-type]
        response: Response,
        background: BackgroundTasks,
        session: SessionDep,
        owner: OwnerDep,
        settings: SettingsDep,
    ) -> Any:
        row, existing = create(session, owner, settings, job_id, body)
        if existing:
            response.status_code = 200
        else:
            background.add_task(outbox.send_for_job, row.job_id)
        response.headers["Location"] = f"/jobs/{row.job_id}/{plural}/{row.id}"
        return rules.to_public(row, None)

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

    many, one = f"/{{job_id}}/{plural}", f"/{{job_id}}/{plural}/{{{row_id_name}}}"
    create_summary, list_summary, cancel_summary = summaries
    routes: list[tuple[str, Callable[..., Any], str, str, int, type, Responses, str]] = [
        (
            many,
            create_row,
            "POST",
            f"create_{noun}",
            202,
            public,
            {**create_responses, **errors},
            create_summary,
        ),
        (many, list_rows, "GET", f"list_{plural}", 200, listing, errors, list_summary),
        (one, get_row, "GET", f"get_{noun}", 200, public, errors, f"One {noun}"),
        (f"{one}/cancel", cancel_row, "POST", f"cancel_{noun}", 202, public, errors, cancel_summary),
    ]
    for path, endpoint, method, name, status, model, responses, summary in routes:
        router.add_api_route(
            path,
            endpoint,
            methods=[method],
            name=name,
            status_code=status,
            response_model=model,
            responses=responses,
            summary=summary,
        )
    return router
