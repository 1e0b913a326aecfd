"""Headless Chromium for the dashboard tests (the server and its finished job: tests/e2e/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ARTIFACTS

CHROMIUM = "/usr/bin/chromium"


# Module scope, not session: Playwright's sync API keeps an asyncio loop running in this thread while it
# is open, and asyncio.run() in any later test of the session would refuse to start.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "the dashboard tests need Debian's chromium: apt-get install -y chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context per test (its own sessionStorage); page errors fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.set_default_timeout(30_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
