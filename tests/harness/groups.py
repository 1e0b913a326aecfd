"""Which tests run on the same pytest-xdist worker (`--dist loadgroup`: `make test` on three workers,
`make test-fast` on three; `make test XDIST=` runs one process).

xdist's own loadgroup tags node ids with their `xdist_group`, which pytest 9's structured node ids ignore;
so each worker writes the groups it computed (GROUPS_DIR, a folder the controller made) and the
controller's scheduler (`scheduler()`) reads them.

Each worker is a test session of its own, so a fixture above function scope is made once per worker that
runs a test asking for it. A module's tests stay together (its module fixtures are made once), and so do
all the modules that share a fixture of package or session scope that starts something (the e2e session's
`ftq up` and its finished job, a folder's server, a shared training run): each is then made once, as
without xdist. Fixtures that cost nothing to make twice (CHEAP_SHARED) do not tie modules together.

The real `accelerate launch` tests (TRAIN_FOLDERS) are two groups as well, and a module may name a
group of its own with `@pytest.mark.xdist_group(name)`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
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


# The real `accelerate launch` tests, in two groups of about the same CPU time: within a group they run
# one after another (a two-process launch trains on both cores), and the two groups on two workers. One
# group was the suite's longest chain (about 730 of its 890 s on three workers); two launches at once
# only take turns on the CPU, with each one's ranks waiting on the other's in their collectives, but
# the rest of the suite is as CPU-bound, so the chain no longer outlasts it.
TRAIN_FOLDERS = ("tests/integration/trainer/",)
TRAIN_GROUP = "group:train"
# The second group's modules (CPU seconds of each, measured with the suite on three workers: 271 of 533).
SECOND_TRAIN_GROUP = "group:train-2"
SECOND_TRAIN_MODULES = frozenset(
    {
        "test_methods.py",  # 131
        "test_samples.py",  # 51, with test_checkpointing.py (19) through their shared ZeRO-3 launch
        "test_checkpointing.py",
        "test_grpo.py",  # 25
        "test_final_save_wait.py",  # 18
        "test_callbacks.py",  # 14
        "test_trainer_cli.py",  # 11
    }
)


# The unit tests of the trainer import the training stack in the test process (TRL, transformers' Trainer,
# PEFT, and with them every optional package installed: DeepSpeed, bitsandbytes, the trackers), about 14
# CPU-s the first time in a process: test_chat_tokens.py alone 16.2 CPU-s, test_methods.py alone 17.0,
# the two in one process 17.6. In one group, one worker pays it instead of each worker that gets one.
UNIT_TRAINER_FOLDERS = ("tests/unit/trainer/",)
UNIT_TRAINER_GROUP = "group:unit-trainer"


def train_group(module: str) -> str:
    """The training group of a module under TRAIN_FOLDERS."""
    return SECOND_TRAIN_GROUP if module.rpartition("/")[2] in SECOND_TRAIN_MODULES else TRAIN_GROUP


# What a test costs, for the order groups go out in. A module's measured seconds (WEIGHTS_FILE: the sum
# of its tests' times, setup and teardown included, on three workers; `make test-weights` rewrites it
# from the last `make test`'s build/test-results.xml) where it was measured; else a guess by kind: a unit
# test runs in process in well under a second, another starts processes or a server, a `slow` one
# trains. The group's total is in its name (`<key>#<weight>`, made alike on every worker), since xdist's
# controller sees node ids only. The heaviest group left goes to the next free worker, so the weights
# must be right for the workers to end together: by the guesses, one worker ran 210 s past the others.
UNIT_WEIGHT, PROCESS_WEIGHT, SLOW_WEIGHT = 0.2, 3, 15
WEIGHTS_FILE = Path(__file__).with_name("module_seconds.json")


def module_seconds() -> dict[str, float]:
    """The measured seconds by module node id (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(WEIGHTS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def item_weight(item: pytest.Item) -> float:
    """The guess for a test of a module that was not measured."""
    if item.get_closest_marker("slow") is not None:
        return SLOW_WEIGHT
    return UNIT_WEIGHT if item.nodeid.startswith("tests/unit/") else PROCESS_WEIGHT


def group_items(items: list[pytest.Item]) -> dict[str, str]:
    """Each item's group (`<key>#<weight>`) by node id."""
    sets = _Sets()
    modules = [item.nodeid.split("::", 1)[0] for item in items]
    for item, module in zip(items, modules, strict=True):
        sets.find(module)
        for fixture in _shared_fixtures(item):
            sets.union(module, fixture)
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            sets.union(module, f"group:{mark.args[0] if mark.args else mark.kwargs.get('name')}")
        if module.startswith(TRAIN_FOLDERS):
            sets.union(module, train_group(module))
        elif module.startswith(UNIT_TRAINER_FOLDERS):
            sets.union(module, UNIT_TRAINER_GROUP)
    measured = module_seconds()
    weights: dict[str, float] = {}
    for module in set(modules) & set(measured):
        key = sets.find(module)
        weights[key] = weights.get(key, 0) + measured[module]
    for item, module in zip(items, modules, strict=True):
        if module not in measured:
            key = sets.find(module)
            weights[key] = weights.get(key, 0) + item_weight(item)
    return {
        item.nodeid: f"{sets.find(module)}#{round(weights[sets.find(module)])}"
        for item, module in zip(items, modules, strict=True)
    }


# The folder the controller made for the workers' groups (the workers inherit the environment).
GROUPS_DIR = "FTQ_TEST_XDIST_GROUPS"


def write_groups(items: list[pytest.Item]) -> None:
    """On a worker: its items' groups, to GROUPS_DIR/<worker>.json (every worker collects the same)."""
    folder = os.environ.get(GROUPS_DIR)
    if not folder:
        return
    path = Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'gw')}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(group_items(items)))
    partial.replace(path)


def read_groups() -> dict[str, str]:
    """On the controller, once every worker has collected: the groups one of them wrote."""
    folder = os.environ.get(GROUPS_DIR)
    for path in sorted(Path(folder).glob("*.json")) if folder else []:
        return dict(json.loads(path.read_text()))
    return {}


def group_weight(scope: str) -> int:
    """The weight in a group's name (0 for a scope without one)."""
    _, _, weight = scope.rpartition("#")
    return int(weight) if weight.isdigit() else 0


def scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling over the groups the workers wrote, handing out the heaviest group left
    first instead of the next in collection order: the big groups (the e2e session, the training group)
    start at once and the many small unit modules fill in at the end, so neither worker is left with a
    long group at the end. A test without a group is a scope of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class HeaviestGroupFirst(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = read_groups()
            return self.groups.get(nodeid, nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            heaviest = max(self.workqueue, key=group_weight)
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return HeaviestGroupFirst(config, log)
