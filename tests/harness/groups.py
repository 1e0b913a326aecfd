"""Which tests run on the same pytest-xdist worker (`make test` runs `-n 2 --dist loadgroup`).

Each worker is a test session of its own, so a fixture above function scope is made once per worker that
runs a test asking for it. A module's tests stay together (its module fixtures are made once), and so do
all the modules that share a fixture of package or session scope that starts something (the e2e session's
`ftq up` and its finished job, a folder's server, a shared training run): each is then made once, as
without xdist. Fixtures that cost nothing to make twice (CHEAP_SHARED) do not tie modules together.

Modules marked `xdist_group("train")` are tied together as well: each trains on both cores (two-process
launches, several runs at once), so two of them at a time would only take turns on the CPU, slower and
nearer their timeouts than one after the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

# Package- and session-scoped fixtures that are cheap to make once per worker (no process, no training):
# a path, stub scripts, an empty PostgreSQL database of the worker's own. (slurm_cluster is not one: the
# SLURM tests all share a worker, so that they do not queue behind one another on the two test nodes.)
CHEAP_SHARED = frozenset({"tiny_dir", "tiny", "stubs", "pg_database"})


class _Sets:
    """Union-find over group keys (module node ids, fixture ids, named groups)."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # The smallest key names the set, so that every worker (each collects alone) names it alike.
            self.parent[max(ra, rb)] = min(ra, rb)


def _shared_fixtures(item: pytest.Item) -> Iterable[str]:
    """Ids of the package- and session-scoped fixtures `item` uses that start something."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return
    for name, defs in info.name2fixturedefs.items():
        if not defs or name in CHEAP_SHARED:
            continue
        fixturedef = defs[-1]
        # pytest's own (tmp_path_factory, ...) have no baseid: none of them starts anything.
        if fixturedef.baseid and fixturedef.scope in ("package", "session"):
            yield f"fixture:{fixturedef.baseid}::{name}"


def group_items(items: list[pytest.Item]) -> dict[str, int]:
    """Mark every item with the xdist_group of its module's set; returns each group's number of tests."""
    sets = _Sets()
    modules = [item.nodeid.split("::", 1)[0] for item in items]
    for item, module in zip(items, modules, strict=True):
        sets.find(module)
        for fixture in _shared_fixtures(item):
            sets.union(module, fixture)
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            sets.union(module, f"group:{mark.args[0] if mark.args else mark.kwargs.get('name')}")
    sizes: dict[str, int] = {}
    for item, module in zip(items, modules, strict=True):
        group = sets.find(module)
        item.add_marker(pytest.mark.xdist_group(group), append=False)
        sizes[group] = sizes.get(group, 0) + 1
    return sizes


# What a test costs, roughly, for ordering the groups: one in tests/unit runs in process in well under a
# second; one elsewhere starts processes, a server or a training run.
UNIT_WEIGHT, PROCESS_WEIGHT = 1, 20


def weight(nodeids: Iterable[str]) -> int:
    return sum(UNIT_WEIGHT if n.startswith("tests/unit/") else PROCESS_WEIGHT for n in nodeids)


def heaviest_first_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadgroup scheduling, handing out the heaviest group left first instead of the next in
    collection order: the big groups (the e2e session, the training group) start at once, and the many
    small unit modules fill in at the end, so neither worker is left with a long group at the end."""
    from xdist.scheduler import LoadGroupScheduling

    class HeaviestFirst(LoadGroupScheduling):
        def _assign_work_unit(self, node: Any) -> None:
            heaviest = max(self.workqueue, key=lambda scope: weight(self.workqueue[scope]))
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return HeaviestFirst(config, log)
