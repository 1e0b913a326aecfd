"""The grader routes in process (the app factory): `POST /graders/run|validate`, the same on
`/v1/fine_tuning/alpha/graders/...` driven by the `openai` SDK, the SDK's `client.graders`, `ftq grade`,
and python graders that try to leave the sandbox (each held, with `grader_error` naming the limit)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from ftq.client import Client
from ftq.client.errors import ValidationError
from tests.harness.inprocess import MakeClient
from tests.harness.users import RUN_USERS, run_users
from tests.unit.ftq.cli.test_client_cli import InProcess

TINY_MODEL = str(Path("examples/tiny/model").resolve())
ALICE = {"Authorization": "Bearer tok-alice"}
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


@pytest.fixture
def api(make_client: MakeClient) -> Any:
    return make_client(
        api_tokens="tok-alice:alice",
        grader_cpu_seconds="1",
        grader_memory_mb="512",
        grader_timeout_seconds="10",
        grader_processes="16",
        grader_score_models=TINY_MODEL,
    )


def test_run_and_validate(api: Any) -> None:
    multi = {
        "type": "multi",
        "graders": {
            "exact": EXACT,
            "sim": {
                "type": "text_similarity",
                "input": "{{sample.output_text}}",
                "reference": "{{item.answer}}",
                "evaluation_metric": "fuzzy_match",
            },
        },
        "calculate_output": "0.5 * exact + 0.5 * sim",
    }
    r = api.post(
        "/graders/run",
        json={"grader": multi, "model_sample": "Pariz", "item": {"answer": "Paris"}},
        headers=ALICE,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["reward"] == pytest.approx(0.5 * 0.8)
    assert body["metadata"]["sub_rewards"] == {"exact": 0.0, "sim": pytest.approx(0.8)}
    assert body["metadata"]["errors"] == {}
    assert body["metadata"]["execution_time"] >= 0
    # Owner-authenticated like every route.
    assert api.post("/graders/run", json={"grader": EXACT, "model_sample": "x"}).status_code == 401
    # A 422 naming the field, through the union of grader types.
    bad = {"type": "multi", "graders": {"b": {**EXACT, "operation": "contains"}}, "calculate_output": "b"}
    r = api.post("/graders/validate", json={"grader": bad}, headers=ALICE)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "grader", "graders", "b", "operation"]
    r = api.post(
        "/graders/validate",
        json={"grader": {**bad, "graders": {"b": EXACT}, "calculate_output": "__import__('os')"}},
        headers=ALICE,
    )
    assert r.status_code == 422 and "calculate_output" in r.text
    # score_model: the operator's allow-list decides.
    scored = {
        "type": "score_model",
        "model": "gpt-4o",
        "input": [{"role": "user", "content": "{{sample.output_text}}"}],
    }
    r = api.post(
        "/graders/validate",
        json={"grader": {"type": "multi", "graders": {"m": scored}, "calculate_output": "m"}},
        headers=ALICE,
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "grader", "graders", "m", "model"]
    r = api.post("/graders/validate", json={"grader": {**scored, "model": TINY_MODEL}}, headers=ALICE)
    assert r.status_code == 200 and r.json()["grader"]["model"] == TINY_MODEL
    # The allowed model generates (the tiny random model answers words, not a number in range).
    run = {"grader": {**scored, "model": TINY_MODEL}, "model_sample": "4"}
    r = api.post("/graders/run", json=run, headers=ALICE)
    errors = r.json()["metadata"]["errors"]
    assert r.status_code == 200 and errors["code"] == "grader_error", r.text
    assert "the model answered" in errors["message"]


def test_v1_alpha_graders_with_the_openai_sdk(api: Any) -> None:
    sdk = openai.OpenAI(base_url=f"{api.base_url}/v1", api_key="tok-alice", http_client=api, max_retries=0)
    result = sdk.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Paris", item={"answer": "Paris"})  # type: ignore[arg-type]
    assert result.reward == 1.0
    checked = sdk.fine_tuning.alpha.graders.validate(grader=EXACT)  # type: ignore[arg-type]
    assert checked.grader is not None and checked.grader.type == "string_check"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.fine_tuning.alpha.graders.validate(grader={**EXACT, "operation": "contains"})  # type: ignore[arg-type]
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "grader.operation"


def test_sdk_client_and_cli(api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client("http://testserver", "tok-alice", transport=InProcess(api))
    assert client.graders.run(EXACT, "Paris", {"answer": "Paris"}).reward == 1.0
    assert client.graders.validate(EXACT).grader.type == "string_check"
    with pytest.raises(ValidationError) as e:
        client.graders.validate({**EXACT, "operation": "contains"})
    assert e.value.loc == ["body", "grader", "operation"]

    from ftq.cli import app
    from ftq.cli import client as client_cli

    monkeypatch.setattr(
        client_cli, "api", lambda: Client("http://testserver", "tok-alice", transport=InProcess(api))
    )
    grader_file, item_file = tmp_path / "grader.json", tmp_path / "item.json"
    grader_file.write_text(json.dumps(EXACT))
    item_file.write_text(json.dumps({"answer": "Paris"}))
    runner = CliRunner()
    r = runner.invoke(app, ["grade", str(grader_file), "--sample", "Paris", "--item", str(item_file)])
    assert r.exit_code == 0, r.output
    assert "reward 1" in r.output
    r = runner.invoke(
        app, ["grade", str(grader_file), "--sample", "Rome", "--item", str(item_file), "--json"]
    )
    assert r.exit_code == 0 and json.loads(r.output)["reward"] == 0.0


def _run(api: Any, source: str) -> dict[str, Any]:
    grader = {"type": "python", "name": "hostile", "source": source}
    r = api.post("/graders/run", json={"grader": grader, "model_sample": "x"}, headers=ALICE)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _held(body: dict[str, Any], limit: str | None, says: str) -> None:
    errors = body["metadata"]["errors"]
    assert body["reward"] == 0.0
    assert errors["code"] == "grader_error" and errors["grader"] == "hostile", errors
    assert errors["limit"] == limit, errors
    assert says in errors["message"], errors["message"]


def test_hostile_graders_are_held(api: Any) -> None:
    # A socket to a port listening on this host's loopback: refused (no network, and the audit hook).
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        body = _run(
            api,
            "import socket\ndef grade(s, i):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), 2)\n    return 1.0\n",
        )
        # The grader's process has ended: a connection it made would wait in the listen backlog (the
        # kernel completes the handshake without accept), so one look tells.
        server.settimeout(0.5)
        accepted = _try_accept(server)
    _held(body, None, "refuses socket")
    assert accepted is None, "the grader reached the listening port"
    # Apart from the hook: the grader's network namespace has only a loopback (/proc/net/dev lists lo).
    interfaces = "def grade(s, i):\n    return float(len(open('/proc/net/dev').read().splitlines()) - 2)\n"
    assert _run(api, interfaces)["reward"] == 1.0
    # The fork that skips os.fork's audit event.
    _held(
        _run(api, "import _posixsubprocess\ndef grade(s, i):\n    return 1.0\n"),
        None,
        "refuses _posixsubprocess",
    )
    _held(_run(api, "def grade(s, i):\n    while True:\n        pass\n"), "cpu", "CPU-time limit (1 s)")
    _held(
        _run(api, "import time\ndef grade(s, i):\n    time.sleep(60)\n"),
        "wall_clock",
        "wall-clock limit (10 s)",
    )
    _held(
        _run(api, "def grade(s, i):\n    b = bytearray(2 * 1024 ** 3)\n    return 1.0\n"),
        "memory",
        "memory limit (512 MB)",
    )
    _held(
        _run(api, "import os\ndef grade(s, i):\n    while True:\n        os.fork()\n"),
        None,
        "refuses os.fork",
    )
    body = _run(api, "def grade(s, i):\n    raise KeyError('answer')\n")
    _held(body, None, 'File "<grader>", line 2, in grade')
    assert "KeyError: 'answer'" in body["metadata"]["errors"]["message"]
    # No inherited environment: no FTQ_ setting, no token reaches the grader.
    body = _run(
        api,
        "import os\ndef grade(s, i):\n"
        "    return float(sum(k.startswith('FTQ') for k in os.environ) + 7 * ('HOME' in os.environ))\n",
    )
    assert os.environ.get("FTQ_API_TOKENS") and body["reward"] == 0.0, body


def _try_accept(server: socket.socket) -> object:
    try:
        conn, _ = server.accept()
    except OSError:
        return None
    conn.close()
    return "accepted"


def test_run_user_cannot_read_the_data_dir(make_client: MakeClient, ftq_env: dict[str, str]) -> None:
    """As the run user (FTQ_RUN_AS_USER), a grader reads nothing of the service's data directory."""
    run_users()
    # The venv's interpreter lies under root's 0700 home here; the system's is one the run user may run.
    api = make_client(
        api_tokens="tok-alice:alice",
        run_as_user=f"alice:{RUN_USERS['alice']}",
        grader_python="/usr/bin/python3",
        grader_processes="8",
        grader_memory_mb="16384",
    )
    data = Path(ftq_env["FTQ_DATA_DIR"])
    secret = data / "secret.txt"
    secret.write_text("service secret")
    os.chmod(data, 0o700)
    source = f"def grade(s, i):\n    return float(len(open({str(secret)!r}).read()))\n"
    body = _run(api, source)
    # The sandbox binds no folder of the service's: the data dir is not there to be denied.
    _held(body, None, "FileNotFoundError")
    # Inside, the grader is the sandbox's user; outside, bwrap and everything it starts are the run user.
    body = _run(api, "import os\ndef grade(s, i):\n    return float(os.getuid())\n")
    assert body["reward"] == 65534.0
    # RLIMIT_NPROC binds the run user: threads (tasks to the kernel) stop at the limit of 8 (RLIMIT_AS
    # raised here, or glibc's 64 MB arenas per thread stop it first).
    bomb = (
        "import threading, time\ndef grade(s, i):\n    n = 0\n    try:\n        while n < 1000:\n"
        "            threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n"
        "            n += 1\n"
        "    except RuntimeError:\n        pass\n    return float(n)\n"
    )
    # bwrap's own processes (outside and its first inside) count as the run user's too.
    assert 5.0 <= _run(api, bomb)["reward"] <= 7.0
    # As the worker's own user (root here) the same grader sees no more: the boundary is the sandbox's
    # mount namespace, not the file modes.
    root_api = make_client(api_tokens="tok-alice:alice", run_as_user="")
    _held(_run(root_api, source), None, "FileNotFoundError")


def test_a_slow_grader_does_not_block_the_event_loop(api: Any) -> None:
    """While a python grader sleeps in its sandbox, the same app answers other requests."""
    import anyio
    import httpx

    slow = {
        "grader": {
            "type": "python",
            "source": "import time\ndef grade(s, i):\n    time.sleep(3)\n    return 1.0\n",
        }
    }
    answered: list[str] = []

    async def main() -> None:
        transport = httpx.ASGITransport(app=api.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=ALICE
        ) as http:

            async def grade() -> None:
                r = await http.post("/graders/run", json={**slow, "model_sample": "x"})
                assert r.json()["reward"] == 1.0, r.text
                answered.append("grader")

            async def health() -> None:
                await anyio.sleep(0.5)
                assert (await http.get("/healthz")).status_code == 200
                answered.append("healthz")

            async with anyio.create_task_group() as tg:
                tg.start_soon(grade)
                tg.start_soon(health)

    anyio.run(main)
    assert answered == ["healthz", "grader"]
