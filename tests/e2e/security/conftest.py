"""Security tests against real processes: shared `ftq api` servers (and one `ftq up` that really launches),
each test with owners of its own; server start-ups dominate this folder's time on a small machine."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.security.common import (
    LIMIT_TOKENS,
    LIMITS,
    OPERATOR_ENV,
    STUB_PYTHON,
    STUB_SCONTROL,
    STUB_SRUN,
    TOKENS,
    ServerFactory,
)
from tests.harness import Deployment, config_only_model, text_dataset


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local root holding a config-only model and a dataset (what FTQ_LOCAL_ROOTS points at)."""
    root = tmp_path_factory.mktemp("assets").resolve()
    config_only_model(root / "model")
    text_dataset(root / "data" / "train.jsonl")
    return root


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Start servers for this module (FTQ_ settings by name); all are stopped at its end."""
    started: list[Deployment] = []

    def make(command: str = "api", *, data_name: str = "data", **settings: str) -> Deployment:
        root = tmp_path_factory.mktemp(f"ftq-{command}")
        database_url = settings.pop("database_url", None)
        dep = Deployment(
            root,
            mode="up" if command == "up" else "api",
            store="postgres" if database_url else "sqlite",
            database_url=database_url,
            data_dir=root / data_name,
            settings=settings,
        )
        started.append(dep)
        return dep.start()

    yield make
    for dep in started:
        dep.close()


@pytest.fixture(scope="package")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stubs")
    for name, text in (
        ("python", STUB_PYTHON.format(python=sys.executable)),
        ("srun", STUB_SRUN),
        ("scontrol", STUB_SCONTROL),
    ):
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    return d


@pytest.fixture(scope="package")
def shared(tmp_path_factory: pytest.TempPathFactory, stubs: Path) -> Iterator[Deployment]:
    """One `ftq api` on the default roots (its data dir and examples/), holding the tiny model and data
    the operator put there, with a data dir whose path needs quoting (a space and a quote)."""
    root = tmp_path_factory.mktemp("shared")
    data = root / "data dir's"
    config_only_model(data / "model")
    text_dataset(data / "data" / "train.jsonl")
    dep = Deployment(
        root,
        mode="api",
        data_dir=data,
        tokens=TOKENS,
        env=OPERATOR_ENV,
        settings={
            "pass_env": "HF_TOKEN,WANDB_API_KEY",
            "python": stubs / "python",
            "post_rate_per_minute": 100000,
            "max_active_jobs_per_owner": 100000,
        },
    )
    with dep:
        yield dep


@pytest.fixture(scope="package")
def shared_up(
    tmp_path_factory: pytest.TempPathFactory, stubs: Path, shared: Deployment
) -> Iterator[Deployment]:
    """One `ftq up` (API, worker, scheduler) that really launches; it reads the shared server's files."""
    root = tmp_path_factory.mktemp("shared-up")
    dep = Deployment(
        root,
        data_dir=root / "up data's dir",
        tokens=TOKENS,
        env=OPERATOR_ENV,
        settings={
            "pass_env": "HF_TOKEN",
            "python": stubs / "python",
            "local_roots": shared.data_dir,
            "cpu_slots": 4,
        },
    )
    with dep:
        yield dep


@pytest.fixture(scope="package")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """An `ftq api` with small limits: body size, active jobs and submissions per owner, key lifetime."""
    root = tmp_path_factory.mktemp("limited")
    config_only_model(root / "data" / "model")
    text_dataset(root / "data" / "data" / "train.jsonl")
    dep = Deployment(
        root,
        mode="api",
        tokens=LIMIT_TOKENS,
        settings={
            "max_body_bytes": LIMITS["max_body_bytes"],
            "max_active_jobs_per_owner": LIMITS["max_active"],
            "post_rate_per_minute": LIMITS["rate"],
            "idempotency_ttl_hours": LIMITS["ttl_hours"],
        },
    )
    with dep:
        yield dep
