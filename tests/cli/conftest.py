"""Fixtures for the CLI tests: the shared real server (tests/e2e/ftq_e2e.py) and its finished tiny job."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from ftq_e2e import auth_server, finished_job, server  # noqa: F401  (session fixtures)
