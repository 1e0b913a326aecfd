"""A job's statuses and transitions (ftq.status), and the store's compare-and-set functions that follow
them (ftq/store/repository.py): every edge a function uses is allowed, nothing leaves a terminal status."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from ftq.status import ACTIVE, LAUNCHED, TERMINAL, TRANSITIONS, JobStatus, can_move, sources_of
from ftq.store import repository

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


# The store's compare-and-set functions --------------------------------------------------------------------


class Recorder:
    """Stands in for repository._cas: records each (from, to) and answers that no row changed."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str]] = []

    def __call__(self, session: Any, job_id: str, from_: Iterable[str], to: str, **values: Any) -> bool:
        self.edges += [(str(s), str(to)) for s in from_]
        return False


CAS_CALLS: dict[str, Callable[[], Any]] = {
    "mark_starting": lambda: repository.mark_starting(None, "j", resources=None),  # type: ignore[arg-type]
    "mark_running": lambda: repository.mark_running(
        None,  # type: ignore[arg-type]
        "j",
        external_id=None,
        pid=None,
        pid_start_ticks=None,
    ),
    "requeue": lambda: repository.requeue(None, "j", attempt_increment=1),  # type: ignore[arg-type]
    "mark_finished": lambda: [
        repository.mark_finished(None, "j", status)  # type: ignore[arg-type]
        for status in sorted(TERMINAL)
    ],
    "request_cancel": lambda: repository.request_cancel(None, "j"),  # type: ignore[arg-type]
}


def test_every_edge_the_store_moves_a_job_along_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    monkeypatch.setattr(repository, "_cas", recorder)
    used: dict[str, list[tuple[str, str]]] = {}
    for name, call in CAS_CALLS.items():
        before = len(recorder.edges)
        call()
        used[name] = recorder.edges[before:]
        assert used[name], f"{name} moved no job"
    illegal = [(name, e) for name, edges in used.items() for e in edges if not can_move(*e)]
    assert not illegal
    # What each is for, as its docstring says.
    assert used["mark_starting"] == [("queued", "starting")]
    assert used["mark_running"] == [("starting", "running")]
    assert set(used["requeue"]) == {("starting", "queued"), ("running", "queued")}
    assert ("queued", "succeeded") not in used["mark_finished"]
    assert ("cancelling", "cancelled") in used["mark_finished"]


def test_the_test_above_calls_every_compare_and_set_of_the_store() -> None:
    """A new function that moves jobs must be added to CAS_CALLS (and so be checked)."""
    tree = ast.parse(inspect.getsource(repository))
    callers = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name != "_cas":
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_cas":
                    callers.add(fn.name)
    assert callers == set(CAS_CALLS)


def test_the_compare_and_set_refuses_an_edge_the_table_does_not_have() -> None:
    for src, dst in (("succeeded", "running"), ("queued", "succeeded"), ("cancelled", "queued")):
        with pytest.raises(ValueError, match="no transition"):
            repository._cas(None, "j", [src], dst)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", sorted(ACTIVE))
def test_mark_finished_refuses_a_status_that_is_not_terminal(status: JobStatus) -> None:
    with pytest.raises(ValueError, match="terminal"):
        repository.mark_finished(None, "j", status)  # type: ignore[arg-type]
