"""Issue 18 item 6 against a real `ftq api`: preflight never reads a user's file whole, and never blocks.

A FIFO and a 1 GiB sparse file (made with truncate, nothing written), named as the model path, as the
model's config.json and as the dataset, are each answered with a 422 naming the field, in well under a
second, without the API's memory growing by the file; a config.json just over 1 MiB is refused too; six
FIFOs submitted at once leave the API answering everyone else.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.security.common import live_api, spec
from tests.harness import Deployment, proc_children

GiB = 1024**3
# Hostile paths used to hang the request forever: a client that gives up first turns that into a failure.
CLIENT_TIMEOUT = 20


def _sparse(path: Path, size: int = GiB) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _model_folder(path: Path, config: str) -> None:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    if config == "fifo":
        os.mkfifo(path / "config.json")
    elif config == "sparse":
        _sparse(path / "config.json")
    else:  # a valid config, padded to just over 1 MiB
        body = {"model_type": "llama", "hidden_size": 64, "pad": "x" * 1024**2}
        (path / "config.json").write_text(json.dumps(body))


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with live_api(tmp_path_factory.mktemp("preflight-files"), post_rate_per_minute="100000") as dep:
        data = dep.data_dir
        os.mkfifo(data / "model-fifo")
        _sparse(data / "model-big.bin")
        _model_folder(data / "config-fifo", "fifo")
        _model_folder(data / "config-big", "sparse")
        _model_folder(data / "config-over", "over")
        os.mkfifo(data / "data-fifo.jsonl")
        _sparse(data / "data-big.jsonl")
        for i in range(6):
            os.mkfifo(data / f"fifo-{i}")
        yield dep


def _peak_rss_kib(pid: int) -> int:
    """VmHWM of the server and its children (the peak each has had)."""
    total = 0
    for p in [pid, *proc_children(pid)]:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1])
    return total


def _with(model: str | None = None, dataset: str | None = None) -> dict[str, Any]:
    body = spec()
    if model:
        body["model"]["name_or_path"] = model
    if dataset:
        body["dataset"]["name_or_path"] = dataset
    return body


HOSTILE = [
    # (spec, the field refused, what the message says)
    (_with(model="./model-fifo"), "model", "FIFO"),
    (_with(model="./model-big.bin"), "model", "not a model folder"),
    (_with(model="./config-fifo"), "model", "FIFO"),
    (_with(model="./config-big"), "model", "1.0 GiB, more than the 1.0 MiB"),
    (_with(model="./config-over"), "model", "more than the 1.0 MiB"),
    (_with(dataset="./data-fifo.jsonl"), "dataset", "FIFO"),
    (_with(dataset="./data-big.jsonl"), "dataset", "not JSON Lines"),
]


def test_hostile_files_are_refused_at_once_without_being_read(api: Deployment) -> None:
    with httpx.Client(base_url=api.url, timeout=CLIENT_TIMEOUT) as c:
        # What a normal submission costs here, so the bound below is one of liveness, not speed.
        normal = []
        for _ in range(3):
            t0 = time.monotonic()
            assert c.post("/jobs", params={"dry_run": "true"}, json=spec()).status_code == 200
            normal.append(time.monotonic() - t0)
        bound = max(1.0, 10 * max(normal))
        peak_before = _peak_rss_kib(api.pid())
        for body, section, says in HOSTILE:
            t0 = time.monotonic()
            r = c.post("/jobs", json=body)
            took = time.monotonic() - t0
            assert r.status_code == 422, (body[section], r.text)
            errors = {tuple(e["loc"]): e["msg"] for e in r.json()["detail"]}
            msg = errors.get(("body", section, "name_or_path"), "")
            assert says in msg, (body[section], errors)
            assert took < bound, (body[section], took, bound)
        grown_mib = (_peak_rss_kib(api.pid()) - peak_before) / 1024
        # A 1 GiB file read whole raised the API's peak by about twice its size.
        assert grown_mib < 100, f"the API's peak memory grew {grown_mib:.0f} MiB"
        assert c.get("/jobs").json()["data"] == [], "a hostile spec was accepted"


def test_six_fifos_at_once_leave_the_api_answering(api: Deployment) -> None:
    answers: list[int | str] = []

    def submit(i: int) -> None:
        try:
            with httpx.Client(base_url=api.url, timeout=CLIENT_TIMEOUT) as c:
                answers.append(c.post("/jobs", json=_with(model=f"./fifo-{i}")).status_code)
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    with httpx.Client(base_url=api.url, timeout=CLIENT_TIMEOUT) as c:
        for _ in range(5):
            t0 = time.monotonic()
            assert c.get("/jobs").status_code == 200
            assert c.post("/jobs", params={"dry_run": "true"}, json=spec()).status_code == 200
            assert time.monotonic() - t0 < 5
    for t in threads:
        t.join(CLIENT_TIMEOUT + 5)
    assert answers == [422] * 6, answers
