"""The blocking client is generated from the async one (bin/unasync_sdk.py): the checked-in
ftq/client/_sync.py is what the generator makes of today's _async.py, and the generator refuses an
async name it has no blocking twin for instead of writing a client that fails at run time."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from ftq.client import AsyncClient, AsyncFiles, AsyncJobs, Client, Files, Jobs
from tests.harness.env import load_script

ROOT = Path(__file__).resolve().parents[4]


def generator() -> ModuleType:
    return load_script("bin/unasync_sdk.py")


def test_sync_client_is_what_the_generator_makes_of_the_async_one(tmp_path: Path) -> None:
    assert generator().main(["--out", str(tmp_path)]) == 0
    generated = (tmp_path / "_sync.py").read_text()
    checked_in = (ROOT / "ftq" / "client" / "_sync.py").read_text()
    assert generated == checked_in, "ftq/client/_sync.py is stale: run 'make unasync'"
    assert generated.startswith("# Generated from ftq/client/_async.py by bin/unasync_sdk.py")


def test_an_async_name_without_a_blocking_twin_is_refused() -> None:
    code = "async def f(c):\n    return await c.aclose_all(SyncStack())\n"
    found = generator().unmapped(code)
    assert found == ["SyncStack", "async", "await"]


@pytest.mark.parametrize(("sync", "async_"), [(Client, AsyncClient), (Jobs, AsyncJobs), (Files, AsyncFiles)])
def test_both_clients_have_the_same_public_methods(sync: type, async_: type) -> None:
    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")} - {"aclose"}

    assert public(sync) == public(async_)
    assert "aclose" in vars(AsyncClient) and "aclose" not in vars(Client)
