"""End-to-end: ftq as a user runs it. One real `ftq up` on its embedded defaults and one finished tiny job
serve the whole session (the CLI, dashboard and perf tests read them); an `ftq api` with a token serves
the 401 paths; the bank (tests/e2e/bank.py) holds a richly configured finished job with two owners and
trackers, for every module that reads such a job. Teardown cancels what is still active, then stops the
processes."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.e2e.bank import Bank, BankedRun, finished, open_bank
from tests.e2e.session import AUTH_OWNER, AUTH_TOKEN, TINY_SPEC, FinishedJob, Walkthrough, session_dpo_spec
from tests.harness import Deployment, run_ftq, tiny_assets


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """`ftq up` (API, worker, scheduler) on its embedded defaults (roots: the data dir and examples/)."""
    tiny_assets()
    dep = Deployment(tmp_path_factory.mktemp("e2e") / "main")
    dep.start()
    yield dep
    dep.close(cancel_active=True)


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """`ftq api` (no worker) with FTQ_API_TOKENS set; `token` is AUTH_TOKEN (owner erin)."""
    root = tmp_path_factory.mktemp("e2e") / "auth"
    with Deployment(root, mode="api", tokens={AUTH_OWNER: AUTH_TOKEN}) as dep:
        yield dep


@pytest.fixture(scope="session")
def walkthrough(server: Deployment) -> Iterator[Walkthrough]:
    w = Walkthrough(server)
    yield w
    w.kill()


@pytest.fixture(scope="session")
def finished_job(server: Deployment, walkthrough: Walkthrough) -> FinishedJob:
    """The session's tiny job, followed to its end by the CLI (the curl walkthrough runs meanwhile)."""
    result = run_ftq("submit", str(TINY_SPEC), "--follow", url=server.url, timeout=600)
    match = re.search(r"submitted (job_[0-9a-f]+)", result.stdout)
    assert match, f"no job id in the output of ftq submit:\n{result.stdout}\n{result.stderr}"
    return FinishedJob(result=result, job_id=match.group(1))


@pytest.fixture(scope="session")
def dpo_job(server: Deployment) -> str:
    """The session's DPO job (session.session_dpo_spec()), posted on `server` and not waited for: the
    methods test reads its reward metrics through the API, the dashboard test its method charts."""
    return str(server.post_job(session_dpo_spec())["id"])


# The bank of shared trained runs (tests/e2e/bank.py): built by the first test that asks for it.


@pytest.fixture(scope="session")
def bank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bank]:
    """The bank's `ftq up` (owners alice and bob, trackers, a Hub token), with its runs posted."""
    yield from open_bank(tmp_path_factory.mktemp("e2e") / "bank")


@pytest.fixture(scope="session")
def bank_dep(bank: Bank) -> Deployment:
    """The bank's deployment (its `token` is alice's)."""
    return bank.dep


@pytest.fixture(scope="session")
def rich_job(bank: Bank) -> BankedRun:
    """alice's rich job (bank.rich_spec()), succeeded: eval split, checkpoints, samples, trackers."""
    return finished(bank, bank.rich_id)


@pytest.fixture(scope="session")
def bank_full_job(bank: Bank) -> BankedRun:
    """alice's full fine-tune (bank.full_spec()), succeeded."""
    return finished(bank, bank.full_id)
