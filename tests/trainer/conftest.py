"""Fixtures for the trainer's tests (helpers live in trainer_helpers.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from trainer_helpers import REPO, Tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The tiny model and data, built by the real entry point once per session."""
    root = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [sys.executable, "-m", "trainer.tiny", "--out", str(root)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return Tiny(root)
