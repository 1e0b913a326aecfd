"""A job's statuses and transitions (ftq.contract.status), and the store's compare-and-set transitions that
follow them (ftq/store/transitions.py, for jobs and exports alike): every edge a transition uses is
allowed, nothing leaves a terminal status."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import pytest

from ftq.contract.status import ACTIVE, LAUNCHED, TERMINAL, TRANSITIONS, JobStatus, can_move, sources_of
from ftq.store import exports, repository, transitions
from ftq.store.transitions import RunTable

ALL = set(JobStatus)


def test_every_status_is_active_or_terminal_and_has_its_edges() -> None:
    assert set(TRANSITIONS) == ALL
    assert ACTIVE | TERMINAL == ALL and not ACTIVE & TERMINAL
    assert set(LAUNCHED) <= ACTIVE and JobStatus.queued not in LAUNCHED
    for targets in TRANSITIONS.values():
        assert targets <= ALL


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_terminal_statuses_have_no_way_out(status: JobStatus) -> None:
    assert TRANSITIONS[status] == frozenset()
    assert not any(can_move(status, other) for other in JobStatus)


def test_no_status_moves_to_itself_and_queued_never_succeeds() -> None:
    assert not any(can_move(s, s) for s in JobStatus)
    assert not can_move(JobStatus.queued, JobStatus.succeeded)
    assert not can_move(JobStatus.cancelling, JobStatus.running)


def test_every_active_status_can_end() -> None:
    for status in ACTIVE:
        assert TRANSITIONS[status] & TERMINAL, status


def test_sources_of_is_the_reverse_of_the_table() -> None:
    for dst in JobStatus:
        assert set(sources_of(dst)) == {s for s in JobStatus if can_move(s, dst)}
    assert can_move("running", "cancelling") and not can_move("cancelled", "queued")


# The store's compare-and-set transitions ------------------------------------------------------------------
# Jobs (`repository.JOBS`) and exports (`exports.EXPORTS`) move along the same edges, through the one
# `RunTable` of ftq/store/transitions.py, whose `move` alone writes a status.


class Recorder:
    """Stands in for transitions._update: records each (table, from, to) and answers that no row
    changed."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str, str]] = []

    def __call__(
        self, session: Any, table: Any, row_id: str, from_: Iterable[str], to: str, values: dict[str, Any]
    ) -> bool:
        self.edges += [(table.__tablename__, str(s), str(to)) for s in from_]
        return False


TABLES = {repository.JOBS: "jobs", exports.EXPORTS: "exports"}
CALLS: dict[str, Callable[[RunTable], Any]] = {
    "mark_starting": lambda t: t.mark_starting(None, "j", resources=None),  # type: ignore[arg-type]
    "mark_running": lambda t: t.mark_running(
        None,  # type: ignore[arg-type]
        "j",
        external_id=None,
        pid=None,
        pid_start_ticks=None,
    ),
    "requeue": lambda t: t.requeue(None, "j", reason="again"),  # type: ignore[arg-type]
    "mark_finished": lambda t: [
        t.mark_finished(None, "j", status)  # type: ignore[arg-type]
        for status in sorted(TERMINAL)
    ],
    "request_cancel": lambda t: t.request_cancel(None, "j"),  # type: ignore[arg-type]
    "hold": lambda t: t.hold(None, "j"),  # type: ignore[arg-type]
    "mark_paused": lambda t: t.mark_paused(None, "j"),  # type: ignore[arg-type]
    "resume": lambda t: t.resume(None, "j"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("table", list(TABLES), ids=lambda t: TABLES[t])
def test_every_edge_the_store_moves_a_row_along_is_allowed(
    table: RunTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(transitions, "_update", recorder)
    used: dict[str, list[tuple[str, str]]] = {}
    for name, call in CALLS.items():
        before = len(recorder.edges)
        call(table)
        moved = recorder.edges[before:]
        assert moved, f"{name} moved no row"
        assert {t for t, _, _ in moved} == {TABLES[table]}, name
        used[name] = [(src, dst) for _, src, dst in moved]
    illegal = [(name, e) for name, edges in used.items() for e in edges if not can_move(*e)]
    assert not illegal
    # What each is for, as its docstring says.
    assert used["mark_starting"] == [("queued", "starting")]
    assert used["mark_running"] == [("starting", "running")]
    assert ("starting", "queued") in used["requeue"]
    assert ("queued", "succeeded") not in used["mark_finished"]
    assert ("cancelling", "cancelled") in used["mark_finished"]
    assert ("queued", "cancelled") in used["request_cancel"]
    assert ("paused", "cancelled") in used["request_cancel"]
    assert used["hold"] == [("queued", "paused")]
    assert used["mark_paused"] == [("starting", "paused"), ("running", "paused")]
    assert used["resume"] == [("paused", "queued")]


def _functions_naming(module: ModuleType, name: str) -> set[str]:
    """The functions of `module` that call or pass on `name`, other than `name` itself."""
    found = set()
    for fn in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(fn, ast.FunctionDef) and fn.name != name:
            for node in ast.walk(fn):
                named = (isinstance(node, ast.Name) and node.id == name) or (
                    isinstance(node, ast.Attribute) and node.attr == name
                )
                if named:
                    found.add(fn.name)
    return found


def test_the_test_above_calls_every_compare_and_set_of_the_store() -> None:
    """A new transition must be added to CALLS (and so be checked); only `move` writes a status, and no
    table's module moves a row around it."""
    assert _functions_naming(transitions, "move") == set(CALLS)
    assert _functions_naming(transitions, "_update") == {"move"}
    for module in (repository, exports):
        assert not _functions_naming(module, "move") and not _functions_naming(module, "_update")


@pytest.mark.parametrize("table", list(TABLES), ids=lambda t: TABLES[t])
def test_the_compare_and_set_refuses_an_edge_the_table_does_not_have(table: RunTable) -> None:
    for src, dst in (("succeeded", "running"), ("queued", "succeeded"), ("cancelled", "queued")):
        with pytest.raises(ValueError, match="no transition"):
            table.move(None, "j", [src], dst)  # type: ignore[arg-type]


@pytest.mark.parametrize("table", list(TABLES), ids=lambda t: TABLES[t])
@pytest.mark.parametrize("status", sorted(ACTIVE))
def test_mark_finished_refuses_a_status_that_is_not_terminal(table: RunTable, status: JobStatus) -> None:
    with pytest.raises(ValueError, match="terminal"):
        table.mark_finished(None, "j", status)  # type: ignore[arg-type]
