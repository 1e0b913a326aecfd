"""The client distribution (client/pyproject.toml) installed alone: `pip install ./client` into a fresh
venv brings none of the server's packages and ships none of its modules, importing the SDK loads no
server module, the venv's `ftq` has the client commands and not the server's, and its SDK and its CLI
each run a job to the end against a live `ftq up` of the full install (the e2e session's `server`).

The venv's Python runs from a folder outside the checkout, so what it imports is what the wheel put in
the venv, never the checkout's ftq/.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    REPO,
    TINY,
    TINY_RELATIVE,
    Deployment,
    clean_env,
    run_ftq,
    tiny_spec,
)

pytestmark = pytest.mark.slow

# The server's packages, none of which the client install may bring.
SERVER_PACKAGES = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "celery",
    "redis",
    "psycopg",
    "uvicorn",
    "torch",
    "pydantic_settings",
)
# The checkout's modules that the wheel must not ship.
SERVER_MODULES = (
    "ftq.planning",
    "ftq.runtime",
    "ftq.store",
    "ftq.cli.server",
    "service",
    "worker",
    "trainer",
)
CLIENT_COMMANDS = ("submit", "ls", "status", "logs", "cancel", "files")
SERVER_COMMANDS = ("up", "api", "worker", "migrate")

# Run by the venv's Python: what is installed, and what importing the SDK, the CLI and every module of
# the contract loads (the contract must need no server package at run time either).
PROBE = """
import importlib, importlib.metadata, importlib.util, json, pkgutil, sys
found = {name: importlib.util.find_spec(name) is not None for name in sys.argv[1].split(",")}
shipped = {name: importlib.util.find_spec(name) is not None for name in sys.argv[2].split(",")}
import ftq.client, ftq.cli, ftq.contract
for module in pkgutil.walk_packages(ftq.contract.__path__, "ftq.contract."):
    importlib.import_module(module.name)
print(json.dumps({"found": found, "shipped": shipped, "modules": sorted(sys.modules),
                  "ftq": ftq.__file__, "version": importlib.metadata.version("ftq-client")}))
"""

# Run by the venv's Python against the live server: a job through `Client`, read back by `AsyncClient`.
SDK_JOB = """
import asyncio, json, sys
from ftq.client import AsyncClient, Client

async def read(job_id):
    async with AsyncClient() as client:
        return (await client.jobs.get(job_id)).status, [p async for p in client.jobs.iter_metrics(job_id)]

with Client() as client:
    job = client.jobs.create(json.loads(sys.argv[1]), idempotency_key="client-distribution-sdk")
    done = client.jobs.wait(job.id, timeout=600)
status, points = asyncio.run(read(job.id))
print(json.dumps({"id": job.id, "waited": str(done.status), "read": str(status), "points": len(points),
                  "modules": sorted(sys.modules)}))
"""


def server_modules_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == s or m.startswith(s + ".") for s in SERVER_MODULES)]


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `pip install ./client` (on the checkout's pins) and nothing else. Its pip is this
    venv's (`pip --python`): a pip of its own would only add a minute of ensurepip to the test."""
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    install = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")),
            *("install", "-q", "--disable-pip-version-check"),
            *("-c", str(REPO / "constraints.txt"), str(REPO / "client")),
        ],
        env=venv_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return venv


def venv_env(**extra: str) -> dict[str, str]:
    env = clean_env(**extra)
    env.pop("PYTHONPATH", None)
    return env


def venv_python(venv: Path, code: str, *args: str, cwd: Path, **env: str) -> dict[str, Any]:
    """`code` run by the venv's Python from `cwd` (outside the checkout); its one line of JSON."""
    script = cwd / "script.py"
    script.write_text(code)
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(script), *args],
        cwd=cwd,
        env=venv_env(**env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_client_install_has_no_server_package_and_loads_no_server_module(
    client_venv: Path, tmp_path: Path
) -> None:
    probe = venv_python(client_venv, PROBE, ",".join(SERVER_PACKAGES), ",".join(SERVER_MODULES), cwd=tmp_path)
    assert Path(probe["ftq"]).is_relative_to(client_venv), probe["ftq"]
    assert probe["version"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert [name for name, there in probe["found"].items() if there] == []
    assert [name for name, there in probe["shipped"].items() if there] == []
    assert server_modules_in(probe["modules"]) == []
    assert "ftq.contract.spec" in probe["modules"] and "ftq.cli.client" in probe["modules"]


def test_client_ftq_has_the_client_commands_only(client_venv: Path, tmp_path: Path) -> None:
    ftq = str(client_venv / "bin" / "ftq")
    shown = run_ftq("--help", url=None, ftq=ftq, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    listed = {line.strip("│ ").split(" ")[0] for line in shown.stdout.splitlines()}
    assert set(CLIENT_COMMANDS) <= listed
    assert listed.isdisjoint(SERVER_COMMANDS)
    assert "come with the server package" in " ".join(shown.stdout.split())
    up = run_ftq("up", url=None, ftq=ftq, cwd=tmp_path)
    assert up.returncode == 2
    assert "No such command 'up'" in up.stderr


def test_client_sdk_and_cli_run_a_job_on_a_live_server(
    client_venv: Path, server: Deployment, tmp_path: Path
) -> None:
    # The SDK's job runs (in a thread of this test) while the CLI's does: two tiny runs side by side.
    spec = tiny_spec(TINY_RELATIVE, name="client-dist-sdk", max_steps=2)
    (tmp_path / "sdk").mkdir()
    with ThreadPoolExecutor(1) as pool:
        sdk_run = pool.submit(
            venv_python, client_venv, SDK_JOB, json.dumps(spec), cwd=tmp_path / "sdk", FTQ_URL=server.url
        )
        cli_job = run_cli_job(client_venv, server, tmp_path)
        sdk = sdk_run.result()
    assert (sdk["waited"], sdk["read"]) == ("succeeded", "succeeded"), server.report(sdk["id"])
    assert sdk["points"] > 0
    assert server_modules_in(sdk["modules"]) == []
    assert cli_job["status"] == "succeeded", server.report(cli_job["id"])


def run_cli_job(client_venv: Path, server: Deployment, tmp_path: Path) -> dict[str, Any]:
    """A job by the venv's `ftq`: submitted with its dataset uploaded (`ftq files`' upload), followed to
    its end, then read back by status, ls, files ls, logs and cancel (a finished job stays as it is)."""
    cli_spec = tiny_spec(TINY_RELATIVE, name="client-dist-cli", max_steps=2)
    cli_spec["dataset"]["name_or_path"] = str(TINY / "data" / "train.jsonl")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(cli_spec))
    ftq = str(client_venv / "bin" / "ftq")

    def cli(*args: str) -> str:
        done = run_ftq(*args, url=server.url, ftq=ftq, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, f"ftq {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    submitted = cli("submit", str(spec_file), "--upload", "--follow")
    job_id = next(w for w in submitted.split() if w.startswith("job_"))
    status: dict[str, Any] = json.loads(cli("status", job_id, "--json"))
    file_id = status["spec"]["dataset"]["file_id"]
    assert file_id.startswith("file_")
    assert job_id in cli("ls")
    assert file_id in cli("files", "ls")
    assert cli("logs", job_id).strip()
    assert status["status"] in cli("cancel", job_id)
    return status
