"""Every repository the API reads one owner's rows through is an OwnedRepository: one owner filter
(`_readable`), which no repository overrides (issue 50: six ad-hoc filters became this one)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import ftq.store
from ftq.store.owned import OwnedRepository


def _repositories() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(ftq.store.__path__):
        module = importlib.import_module(f"ftq.store.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            try:
                params = list(inspect.signature(cls).parameters)
            except (TypeError, ValueError):
                continue
            if params[:2] == ["session", "owner"]:
                found.append(cls)
    return found


def test_every_owner_repository_reads_through_the_one_filter() -> None:
    repos = _repositories()
    assert len(repos) >= 7, repos
    for cls in repos:
        if cls is OwnedRepository:
            continue
        if cls.__name__ in ("UploadRepository", "TinkerRepository"):
            # Their reads and writes are compare-and-set statements that each carry the owner in
            # their own condition (`_owned(...)`); moving them onto the base is left for a later round.
            continue
        assert issubclass(cls, OwnedRepository), cls
        assert "_readable" not in cls.__dict__, f"{cls.__name__} overrides the owner filter"
