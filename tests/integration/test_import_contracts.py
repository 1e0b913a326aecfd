"""The import contracts in pyproject.toml hold, and each one catches the import it forbids.

Each check copies the packages and pyproject.toml into a temporary folder and runs the real
`lint-imports` there: once on the clean copy (it passes), once per contract with one forbidden import
planted into a module (it fails and names that contract).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PACKAGES = ("ftq", "service", "worker", "trainer", "migrations")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy_repo(dest: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: `make install` installs the dev extra"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "250"  # one line per contract in the report
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _plant(module: Path, line: str) -> None:
    module.write_text(module.read_text() + f"\n{line}  # planted by test_import_contracts\n")


def test_clean_copy_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint_imports(_copy_repo(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("service/deps.py", "import worker", "service and worker are independent of each other"),
        ("worker/tasks.py", "import service.app", "service and worker are independent of each other"),
        ("ftq/contract/status.py", "import service", "core: ftq imports none of service, worker, trainer"),
        ("trainer/data.py", "import ftq.store.db", "trainer: of the core, only the contract"),
        ("trainer/args.py", "import ftq.planning.render", "trainer: of the core, only the contract"),
        ("trainer/args.py", "import worker", "trainer: of the core, only the contract"),
        ("ftq/contract/runs.py", "import ftq.runtime.settings", "the contract (spec, statuses"),
        ("ftq/contract/spec.py", "import sqlalchemy", "the contract (spec, statuses"),
        (
            "ftq/client/_core.py",
            "import ftq.planning.estimate",
            "the SDK and the client commands load no server",
        ),
        ("ftq/cli/output.py", "import fastapi", "the SDK and the client commands load no server"),
        ("ftq/client/errors.py", "import ftq.store.db", "the SDK and the client commands load no server"),
        ("ftq/runtime/settings.py", "import ftq.store.db", "the core in layers"),
        ("migrations/env.py", "import service.app", "migrations import only the core"),
        ("ftq/engine/local.py", "import ftq.runtime.settings", "the generation engine (vLLM's server"),
        # A cycle, even inside one package: the CLI modules once imported each other.
        ("ftq/cli/files.py", "import ftq.cli.client", "no import cycles"),
        ("ftq/contract/status.py", "import ftq.contract.schemas", "no import cycles"),
    ],
)
def test_planted_import_breaks_its_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = _copy_repo(tmp_path)
    _plant(root / module, line)
    result = _lint_imports(root)
    assert result.returncode != 0, result.stdout
    broken = [ln for ln in result.stdout.splitlines() if " BROKEN" in ln]
    # An import into the core can break more than one contract (worker reaches service through ftq).
    assert any(ln.startswith(contract) for ln in broken), result.stdout
    # The module is named in full, or relative to its package where a cycle is reported (`.status -> .x`).
    dotted = module.removesuffix(".py").replace("/", ".")
    assert dotted in result.stdout or f".{dotted.rsplit('.', 1)[1]} -> " in result.stdout, result.stdout
