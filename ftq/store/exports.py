"""Every SQL statement about exports that is an export's own (what every side run shares is
`ftq.store.side_runs`).

`ExportRepository(session, owner)` is what the API uses, its reads filtered on the owner by
`SideRunRepository._readable`. The module-level functions are the worker's; an export's transitions are
`EXPORTS`, the one compare-and-set mechanism of every kind of run (`ftq.store.transitions.RunTable`) on
this table.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract.status import JobStatus
from ftq.store.models import Export, ExportQueue
from ftq.store.side_runs import SideRunRepository, account_side_run, add_queued, get_row
from ftq.store.transitions import RunTable

# The outbox's dispatch kind that wakes the worker's export sweep (`ftq.runtime.queue.TASK_EXPORTS`).
DISPATCH_KIND = "export"
# An export that is one of these is what a second identical request gets back instead of a new one.
REUSABLE = (JobStatus.queued, JobStatus.starting, JobStatus.running, JobStatus.succeeded)


def new_export_id() -> str:
    return "exp_" + secrets.token_hex(8)


# System operations (the worker, for every owner) -----------------------------------------------------


def get_export(session: Session, export_id: str) -> Export | None:
    export: Export | None = get_row(session, Export, export_id)
    return export


# An export's transitions (no events of its own; its cancel's dispatch wakes the export sweep); its end
# is accounted in its owner's usage.
EXPORTS = RunTable(Export, cancel_dispatch=DISPATCH_KIND, on_ended=account_side_run)


class ExportRepository(
    SideRunRepository[Export, ExportQueue], queue=ExportQueue, noun="export", transitions=EXPORTS
):
    def find_same(
        self,
        job_id: str,
        *,
        kind: str,
        dtype: str,
        max_shard_size: str,
        push_to_hub: dict[str, Any] | None,
        step: int | None = None,
    ) -> Export | None:
        """The newest export of this job with the same request that is under way or has succeeded."""
        stmt = self._readable().where(
            Export.job_id == job_id,
            Export.step.is_(None) if step is None else Export.step == step,
            Export.kind == kind,
            Export.dtype == dtype,
            Export.max_shard_size == max_shard_size,
            Export.status.in_([str(s) for s in REUSABLE]),
        )
        found: list[Export] = list(self.session.scalars(stmt.order_by(Export.seq.desc())))
        return next((e for e in found if (e.push_to_hub or None) == (push_to_hub or None)), None)

    def add(self, job_id: str, **fields: Any) -> Export:
        """A queued export and the dispatch that wakes the worker, in the caller's transaction."""
        export: Export = add_queued(self.session, Export, new_export_id(), job_id, DISPATCH_KIND, **fields)
        return export
