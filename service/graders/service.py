"""The rules of the grader routes: which score models a grader may name, who a python grader runs as,
and a grader's reward with what went wrong, in OpenAI's `{reward, metadata}`."""

from __future__ import annotations

import pwd
import time
from typing import Any

import anyio

from ftq.contract.graders import (
    Grader,
    GraderRunMetadata,
    GraderRunRequest,
    GraderRunResponse,
    score_models,
)
from ftq.grading import model as score_model
from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits
from ftq.grading.score import sample_dict, score
from ftq.runtime.settings import Settings
from service.errors import SpecError

# Graders scored at once by this process: each python grader is a child process, so a burst of
# requests waits here rather than starting one process per request.
_SLOTS = anyio.CapacityLimiter(4)


def check_allowed(grader: Grader, settings: Settings) -> None:
    """A 422 naming each score_model grader's `model` that the operator does not allow."""
    allowed = set(settings.grader_score_model_names)
    errors = [
        {
            "loc": ["body", *loc],
            "msg": f"model {model!r} is not one this server allows for score_model graders "
            f"(FTQ_GRADER_SCORE_MODELS: {', '.join(sorted(allowed)) or 'none'})",
            "type": "value_error",
        }
        for loc, model in score_models(grader)
        if model not in allowed
    ]
    if errors:
        raise SpecError(errors)


def limits_for(settings: Settings, owner: str) -> Limits:
    """The sandbox's limits, and the owner's run user (FTQ_RUN_AS_USER) that python graders run as."""
    uid = gid = None
    try:
        name = settings.run_user_for(owner)
    except LookupError as e:
        raise SpecError([{"loc": ["body", "grader"], "msg": str(e), "type": "value_error"}]) from None
    if name is not None:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise SpecError(
                [
                    {
                        "loc": ["body", "grader"],
                        "msg": f"run user {name!r} does not exist",
                        "type": "value_error",
                    }
                ]
            ) from None
        if pw.pw_uid == 0 or pw.pw_gid == 0:
            raise SpecError(
                [
                    {
                        "loc": ["body", "grader"],
                        "msg": f"run user {name!r} is privileged",
                        "type": "value_error",
                    }
                ]
            )
        uid, gid = pw.pw_uid, pw.pw_gid
    return Limits(
        cpu_seconds=settings.grader_cpu_seconds,
        memory_mb=settings.grader_memory_mb,
        timeout_seconds=settings.grader_timeout_seconds,
        processes=settings.grader_processes,
        python=settings.grader_python or settings.python,
        uid=uid,
        gid=gid,
    )


def _errors_of(grader: Grader, err: GraderError) -> dict[str, Any]:
    errors: dict[str, Any] = {
        "code": str(err.code),
        "message": err.message,
        "grader": err.grader,
        "limit": err.limit,
    }
    if grader.type == "python" or err.limit is not None:
        # OpenAI's names for a python grader's failure, so its clients read them as they do there.
        errors["python_grader_runtime_error"] = err.limit is None
        errors["python_grader_runtime_error_details"] = err.message
        errors["timeout"] = err.limit == "wall_clock"
    else:
        errors["other_error"] = True
    return errors


def run_blocking(body: GraderRunRequest, limits: Limits) -> GraderRunResponse:
    started = time.monotonic()
    sub: dict[str, float] = {}
    errors: dict[str, Any] = {}
    try:
        result = score(body.grader, sample_dict(body.model_sample), body.item, limits, score_model.generate)
        reward, sub = result.reward, result.sub_rewards
    except GraderError as e:
        reward, errors = 0.0, _errors_of(body.grader, e)
    metadata = GraderRunMetadata(
        errors=errors,
        execution_time=time.monotonic() - started,
        name=body.grader.name,
        type=body.grader.type,
        sub_rewards=sub,
    )
    return GraderRunResponse(reward=reward, metadata=metadata, sub_rewards=sub)


async def run(body: GraderRunRequest, settings: Settings, owner: str) -> GraderRunResponse:
    """The grader's reward, scored in a worker thread (a python grader waits on its child process there,
    not on the event loop)."""
    check_allowed(body.grader, settings)
    limits = limits_for(settings, owner)
    return await anyio.to_thread.run_sync(lambda: run_blocking(body, limits), limiter=_SLOTS)
