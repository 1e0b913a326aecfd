"""`POST /graders/run` and `POST /graders/validate` (HTTP only; the rules are in service.graders.service).
The `/v1/fine_tuning/alpha/graders/...` twins are in service.openai.router."""

from __future__ import annotations

from fastapi import APIRouter

from ftq.contract.graders import (
    GraderRunRequest,
    GraderRunResponse,
    GraderValidateRequest,
    GraderValidateResponse,
)
from ftq.runtime.settings import get_settings
from service.deps import OwnerDep
from service.graders import service
from service.routes import UNAUTHORIZED, Responses, error

router = APIRouter(prefix="/graders", tags=["graders"])

_ERRORS: Responses = {
    400: {"description": "A body that does not parse"},
    401: UNAUTHORIZED,
    422: {"description": "An invalid grader: `detail[].loc` names the field"},
}
_RUN_ERRORS: Responses = {
    **_ERRORS,
    429: error(
        "FTQ_GRADER_SLOTS_PER_OWNER of yours are being scored and FTQ_GRADER_QUEUE_PER_OWNER more wait; "
        "`Retry-After` says when to try again"
    ),
}


@router.post(
    "/run", response_model=GraderRunResponse, responses=_RUN_ERRORS, summary="Score one sample with a grader"
)
async def run_grader(body: GraderRunRequest, owner: OwnerDep) -> GraderRunResponse:
    """The grader's reward for `model_sample` and `item`. A grader that raises, hangs or exceeds a sandbox
    limit answers reward 0.0 with `metadata.errors.code` `grader_error` and the grader's traceback. Each
    owner has FTQ_GRADER_SLOTS_PER_OWNER slots and a queue of FTQ_GRADER_QUEUE_PER_OWNER; past them, a
    429 with `Retry-After`."""
    return await service.run(body, get_settings(), owner)


@router.post("/validate", response_model=GraderValidateResponse, responses=_ERRORS, summary="Check a grader")
async def validate_grader(body: GraderValidateRequest, owner: OwnerDep) -> GraderValidateResponse:
    """The grader as the server reads it, or a 422 naming the field."""
    service.check_allowed(body.grader, get_settings())
    return GraderValidateResponse(grader=body.grader)
