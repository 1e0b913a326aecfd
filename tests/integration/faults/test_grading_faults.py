"""A kill during grading: `ftq api` is SIGKILLed while a python grader sleeps in its sandbox. The sandbox
dies with it at once (bwrap's --die-with-parent), not at the grader's
deadline or never; nothing is left in /dev/shm; and the restarted API grades again."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness import Deployment, wait_gone
from tests.harness.procs import _stat

from .conftest import TOKENS

pytestmark = pytest.mark.slow
SLEEP = 600  # the grader's own sleep, and its deadline: the kill must not wait for either


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("faults-grading")
    settings = {"grader_timeout_seconds": SLEEP, "grader_cpu_seconds": 60}
    with Deployment(root, mode="api", tokens=TOKENS, settings=settings) as dep:
        yield dep


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(entry)) is not None and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _grade(dep: Deployment, source: str, timeout: float) -> httpx.Response:
    grader = {"type": "python", "name": "slow", "source": source}
    with dep.client(dep.token) as c:
        return c.post("/graders/run", json={"grader": grader, "model_sample": "x"}, timeout=timeout)


def test_a_killed_api_takes_its_graders_sandboxes_with_it(api: Deployment) -> None:
    token = uuid.uuid4().hex
    source = (
        f"import time\ndef grade(s, i):\n    open('/dev/shm/{token}', 'w').write('x')\n"
        f"    time.sleep({SLEEP})\n    return 1.0\n"
    )
    api_pid = api.pid("api")
    answered: list[object] = []

    def call() -> None:
        try:
            answered.append(_grade(api, source, timeout=SLEEP))
        except httpx.TransportError as e:
            answered.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 60
    started = False
    while time.monotonic() < deadline and not started:  # the grader's python, inside bwrap
        started = any(b"-I\0-S\0-c\0" in _cmdline(p) for p in _descendants(api_pid))
        time.sleep(0.1)
    assert started, "the grader's sandbox never started"
    everything = _descendants(api_pid)
    killed = time.monotonic()
    api.kill9("api")
    wait_gone(everything, timeout=30)
    # Liveness with room for a loaded machine: the grader's own deadline is SLEEP seconds.
    assert time.monotonic() - killed < 30
    caller.join(timeout=30)
    assert answered and isinstance(answered[0], httpx.TransportError), answered
    assert not Path(f"/dev/shm/{token}").exists()

    api.start_server()
    quick = _grade(api, "def grade(s, i):\n    return 1.0\n", timeout=60)
    assert quick.status_code == 200 and quick.json()["reward"] == 1.0, quick.text
