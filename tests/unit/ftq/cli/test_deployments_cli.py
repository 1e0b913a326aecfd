"""`client.deployments.list()` and `ftq deployments` (issue 49's native view of the serving engines): the SDK
reads GET /deployments as the API's own models (Client and AsyncClient alike), and the command prints one
line per engine within 80 columns (id, base, status, devices, adapters, requests, tokens in/out, device
time), why a queued engine waits or a failed one failed under the table, and the usage since the API
started; `--json` prints the answer as it came. The listing with engines in it is built here from the
contract's models (an engine needs vLLM); the empty one comes from the real app, in process."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from ftq.cli import app, output
from ftq.cli import client as client_cli
from ftq.cli.output import fmt_count
from ftq.client import AsyncClient, Client, Deployment, DeploymentList
from tests.harness.inprocess import MakeClient
from tests.unit.ftq.cli.test_client_cli import InProcess

NOW = time.time()
URL = "http://ftq.test"
TOKEN = "tok-alice"
LONG_BASE = "ft:llama-3-8b:alice:a-rather-long-suffix:0123456789abcdef"
REASON = "waiting for 4 GPUs: 2 free, 2 held by job_0123456789abcdef"


def _listing() -> DeploymentList:
    model = "ft:ftq-tiny-serve:alice::0123456789abcdef"
    adapter = {"model": model, "loaded_at": NOW - 60}
    return DeploymentList.model_validate(
        {
            "data": [
                {"id": "dep_00000000000000a1", "base": "ftq-tiny-serve", "status": "ready", "device": "cpu",
                 "adapters": [adapter, {**adapter, "model": f"{model}:ckpt-step-8"}],
                 "started_at": NOW - 300, "ready_at": NOW - 270, "last_used": NOW - 5,
                 "device_seconds": 192.4, "requests": 14, "prompt_tokens": 1234, "completion_tokens": 340},
                {"id": "dep_00000000000000a2", "base": LONG_BASE, "status": "queued", "device": "cuda",
                 "launcher": "slurm", "devices": 4, "tensor_parallel_size": 4, "queue_reason": REASON,
                 "adapters": [], "started_at": NOW - 20, "last_used": NOW - 20, "device_seconds": 0,
                 "requests": 0, "prompt_tokens": 0, "completion_tokens": 0},
                {"id": "dep_00000000000000a3", "base": "ftq-tiny", "status": "failed", "device": "cuda",
                 "error": "the engine exited with code 1 while loading the base", "adapters": [],
                 "started_at": NOW - 45296, "last_used": NOW - 100, "device_seconds": 45296.0,
                 "requests": 123456, "prompt_tokens": 98765432, "completion_tokens": 1234567},
            ],
            "usage": {"since": 1_700_000_000.0, "requests": 123470, "prompt_tokens": 98766666,
                      "completion_tokens": 1234907},
        }
    )  # fmt: skip


def _transport(listing: DeploymentList, seen: list[httpx.Request]) -> httpx.MockTransport:
    """A server that answers GET /deployments with `listing` (and nothing else)."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET" and request.url.path == "/deployments":
            return httpx.Response(200, json=listing.model_dump(mode="json"))
        return httpx.Response(404, json={"detail": "no such route", "code": "not_found"})

    return httpx.MockTransport(handle)


def test_the_sdk_returns_the_listing_as_typed_models_sync_and_async() -> None:
    listing, seen = _listing(), list[httpx.Request]()
    with Client(URL, TOKEN, transport=_transport(listing, seen)) as client:
        got = client.deployments.list()
    assert isinstance(got, DeploymentList) and got == listing
    assert all(isinstance(d, Deployment) for d in got.data)
    assert got.data[1].queue_reason == REASON and got.data[1].tensor_parallel_size == 4
    assert seen[0].headers["Authorization"] == f"Bearer {TOKEN}"

    async def read() -> DeploymentList:
        async with AsyncClient(URL, TOKEN, transport=_transport(listing, seen)) as client:
            return await client.deployments.list()

    assert asyncio.run(read()) == listing
    assert [r.url.path for r in seen] == ["/deployments", "/deployments"]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """The CLI's SDK client answered by the constructed listing; the console reads COLUMNS as a terminal."""
    monkeypatch.setattr(client_cli, "api", lambda: Client(URL, TOKEN, transport=_transport(_listing(), [])))
    monkeypatch.setattr(output.out, "_width", None)
    return CliRunner()


def test_one_line_per_deployment_within_80_columns(cli: CliRunner) -> None:
    shown = cli.invoke(app, ["deployments"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    table, beneath, usage = lines[:4], lines[4:6], lines[6:]
    assert all(len(line) <= 80 for line in table), table
    assert table[0].split() == ["ID", "BASE", "STATUS", "DEVICES", "ADPT", "REQS", "IN/OUT", "DEV-TIME"]
    rows = [line.split() for line in table[1:]]
    assert rows[0] == ["dep_00000000000000a1", "ftq-tiny-serve", "ready", "cpu", "x1", "2", "14", "1.2k/340",
                       "3m12s"]  # fmt: skip
    assert rows[1][0] == "dep_00000000000000a2"
    assert rows[1][2:] == ["queued", "cuda", "x4", "0", "0", "0/0", "0s"]
    # The long base is cut, with an ellipsis, to the room the whole columns leave it.
    assert rows[1][1].endswith("…") and LONG_BASE.startswith(rows[1][1][:-1]) and len(rows[1][1]) >= 8
    assert rows[2][2:] == ["failed", "cuda", "x1", "0", "123k", "99M/1.2M", "12h34m"]
    assert beneath == [
        f"dep_00000000000000a2: queued: {REASON}",
        "dep_00000000000000a3: failed: the engine exited with code 1 while loading the base",
    ]
    assert usage == ["since 2023-11-14 22:13 UTC: 123470 requests, 99M tokens in, 1.2M out"]

    wide = cli.invoke(app, ["deployments"], env={"COLUMNS": "160"})
    assert wide.exit_code == 0, wide.output
    assert wide.output.splitlines()[2].split()[1] == LONG_BASE  # whole where there is room


def test_json_is_the_servers_answer(cli: CliRunner) -> None:
    shown = cli.invoke(app, ["deployments", "--json"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output) == _listing().model_dump(mode="json")


def test_the_empty_list_of_the_real_app(make_client: MakeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    api = make_client()
    monkeypatch.setattr(client_cli, "api", lambda: Client("http://testserver", "", transport=InProcess(api)))
    assert Client("http://testserver", "", transport=InProcess(api)).deployments.list().data == []
    runner = CliRunner()
    shown = runner.invoke(app, ["deployments"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines() == ["no deployments: a call to a model through /v1 starts its engine"]
    as_json: dict[str, Any] = json.loads(runner.invoke(app, ["deployments", "--json"]).output)
    assert as_json["data"] == [] and as_json["usage"]["requests"] == 0


@pytest.mark.parametrize(
    ("n", "shown"),
    [(None, "-"), (0, "0"), (999, "999"), (1000, "1.0k"), (1234, "1.2k"), (9949, "9.9k"), (9950, "10k"),
     (123_456, "123k"), (999_499, "999k"), (999_500, "1.0M"), (98_765_432, "99M"), (1_234_567_890, "1.2G")],
)  # fmt: skip
def test_counts_fit_a_narrow_column(n: int | None, shown: str) -> None:
    assert fmt_count(n) == shown
