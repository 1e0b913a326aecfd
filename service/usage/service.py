"""Usage accounting for the API: device-seconds of ended runs per owner, or per owner and UTC day."""

from __future__ import annotations

from datetime import datetime

from ftq.contract.schemas import UsagePage, UsageRow
from ftq.store.deployments import DeploymentRepository
from ftq.store.evaluations import EvaluationRepository
from ftq.store.exports import ExportRepository
from ftq.store.repository import JobRepository
from ftq.store.training_clients import TinkerRepository


def usage(repo: JobRepository, since: datetime | None, until: datetime | None, group_by: str) -> UsagePage:
    """Runs that ended in [since, until), jobs', exports', evaluations', serving engines' (with their
    tokens in and out) and Tinker training clients', summed per owner (group_by=owner) or per owner and
    day (the UTC day each run ended). Read through the owner filter: an owner sees their own usage."""
    sums: dict[tuple[str, str | None], list[float]] = {}
    serving = DeploymentRepository(repo.session, repo.owner).usage_rows(since, until)
    runs = [(row, 2) for row in repo.usage_rows(since, until)]
    runs += [(row, 3) for row in ExportRepository(repo.session, repo.owner).usage_rows(since, until)]
    runs += [(row, 4) for row in EvaluationRepository(repo.session, repo.owner).usage_rows(since, until)]
    runs += [(row, 8) for row in TinkerRepository(repo.session, repo.owner).usage_rows(since, until)]
    runs += [(row[:4], 5) for row in serving]
    tokens = [(0, 0)] * (len(runs) - len(serving)) + [(row[4], row[5]) for row in serving]
    for ((owner, finished, device_seconds, device), counter), (tokens_in, tokens_out) in zip(
        runs, tokens, strict=True
    ):
        day = finished.date().isoformat() if group_by == "day" else None
        row = sums.setdefault((owner, day), [0.0, 0.0, 0, 0, 0, 0, 0, 0, 0])
        row[0] += device_seconds
        row[1] += device_seconds / 3600 if device == "cuda" else 0.0
        row[counter] += 1
        row[6] += tokens_in
        row[7] += tokens_out
    return UsagePage(
        data=[
            UsageRow(
                owner=o,
                day=d,
                device_seconds=round(v[0], 3),
                gpu_hours=round(v[1], 6),
                jobs=int(v[2]),
                exports=int(v[3]),
                evaluations=int(v[4]),
                deployments=int(v[5]),
                training_clients=int(v[8]),
                prompt_tokens=int(v[6]),
                completion_tokens=int(v[7]),
            )
            for (o, d), v in sorted(sums.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
        ]
    )
