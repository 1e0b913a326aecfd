"""Serving in process, with a fake engine (the ftq.engine Engine protocol) behind an httpx MockTransport:
which folder a name calls (a catalog base, an `ft:` model's final/, a checkpoint's folder, a full
fine-tune's own engine), owners apart (their own engines, another owner's model a 404 and never listed),
models the engine cannot serve (a 400 saying why), the body validated (a 400 naming the parameter, only
known parameters passed on), streams relayed with the usage counted, a cold start waited for, the idle
sweep, the engine caps and /deployments. Jobs are created through /v1 and marked succeeded in the store,
with adapter folders written by the test."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ftq.contract import runs
from ftq.contract.status import JobStatus
from ftq.engine import EngineNotInstalled
from ftq.runtime.settings import get_settings
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.deployments import DEPLOYMENTS, DeploymentRepository
from service.serving.deployed import EngineRefused, EngineRun, ScheduledEngine
from service.serving.engines import EngineManager
from service.serving.proxy import Transport
from tests.harness import EXAMPLES
from tests.harness.assets import checkpoint_dir
from tests.harness.inprocess import MakeClient

TOKENS = "tok-alice:alice,tok-bob:bob"
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}
SERVE_MODEL = (EXAMPLES / "tiny" / "model-serve").resolve()


class FakeEngine(ScheduledEngine):
    """A deployment whose worker is the test (its row moved as the worker's launch and end move it) and
    whose engine answers from memory: its text names the model called, the adapter folder behind it and
    the last message, so a test sees which folder a name reached."""

    def __init__(self, run: EngineRun, number: int, gate: threading.Event, fail_start: Exception | None):
        super().__init__(run, get_settings())
        self.config = run.config
        self.number = number
        self.gate = gate
        self.fail_start = fail_start
        self.started = False
        self.stopped = False
        self.loaded: dict[str, Path] = {}
        self.requests: list[dict[str, Any]] = []
        self._key = f"key-of-engine-{number}"
        self.refuse: str | None = None

    @property
    def base_url(self) -> str:
        # An adopted engine is the one that first started, with its key: the answers are that fake's.
        return f"http://engine-{self._key.rsplit('-', 1)[1]}.fake/v1"

    def start(self) -> None:
        if self.fail_start is not None:
            raise self.fail_start
        self._ask()
        with session_scope() as session:  # the worker's claim and launch (none for an adopted engine)
            if DEPLOYMENTS.mark_starting(session, self.id, resources={"cpu_slots": 1}):
                assert DEPLOYMENTS.mark_running(session, self.id, external_id=None, pid=1, pid_start_ticks=1)
            session.commit()
        self.started = True

    def wait_ready(self, timeout: float = 300.0) -> None:
        assert self.gate.wait(timeout)
        if self.refuse is not None:  # the scheduler's refusal, as ScheduledEngine reads it from the row
            raise EngineRefused(self.refuse)
        with session_scope() as session:
            DeploymentRepository(session, self.run.owner).mark_ready(self.id, self.base_url)
            session.commit()

    def healthy(self) -> bool:
        return self.started and not self.stopped

    def load_adapter(self, name: str, path: Path) -> None:
        self.loaded[name] = path
        self._remember(name)

    def unload_adapter(self, name: str) -> None:
        self.loaded.pop(name, None)
        self._forget(name)

    def adapters(self) -> list[str]:
        return list(self.loaded)

    def stop(self, timeout: float = 30.0) -> None:
        super().stop(timeout)
        with session_scope() as session:  # the worker's end of the run it cancelled
            DEPLOYMENTS.mark_finished(session, self.id, JobStatus.cancelled)
            session.commit()
        self.stopped = True

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        model = body["model"]
        if model != self.model and model not in self.loaded:
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
            return httpx.Response(404, json={"error": error})
        behind = str(self.loaded[model]) if model in self.loaded else f"base:{self.config.model}"
        last = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        text = f"{model}|{behind}|{last}"
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        chat = request.url.path.endswith("/chat/completions")
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            kind = "chat.completion" if chat else "text_completion"
            return httpx.Response(
                200,
                json={
                    "id": "x-1",
                    "object": kind,
                    "created": 1,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
        kind = "chat.completion.chunk" if chat else "text_completion"
        events = []
        for piece in (text[:5], text[5:]):
            delta = {"delta": {"content": piece}} if chat else {"text": piece}
            chunk = {
                "id": "x-1",
                "object": kind,
                "created": 1,
                "model": model,
                "choices": [{"index": 0, **delta}],
            }
            events.append(json.dumps(chunk, separators=(",", ":")))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk = {"id": "x-1", "object": kind, "created": 1, "model": model, "choices": [], "usage": usage}
            events.append(json.dumps(chunk, separators=(",", ":")))
        sse = "".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})


class Engines:
    """The fake engines a test's app made, and what makes them."""

    def __init__(self) -> None:
        self.made: list[FakeEngine] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_start: Exception | None = None
        self.refuse: str | None = None

    def factory(self, run: EngineRun) -> FakeEngine:
        engine = FakeEngine(run, len(self.made), self.gate, self.fail_start)
        engine.refuse = self.refuse
        self.made.append(engine)
        return engine

    def handler(self, request: httpx.Request) -> httpx.Response:
        number = int(request.url.host.split("-")[1].split(".")[0])
        # Every call carries the engine's own key (a real engine refuses /v1 without it).
        assert request.headers.get("authorization") == f"Bearer key-of-engine-{number}", request.headers
        return self.made[number].answer(request)


@dataclass
class Served:
    client: Any
    engines: Engines
    manager: EngineManager


def _serve(client: Any) -> Served:
    engines = Engines()
    manager = EngineManager(get_settings(), factory=engines.factory)
    client.app.state.engines = manager
    client.app.state.engine_transport = Transport(httpx.MockTransport(engines.handler))
    return Served(client, engines, manager)


def _catalog(tmp_path: Path) -> Path:
    """The built-in catalog plus `serve-full`, a full fine-tune of the servable tiny model."""
    from service.openai.models import catalog

    templates = dict(catalog("").templates)
    full = json.loads(json.dumps(templates["ftq-tiny-serve"]))
    full.pop("lora")
    templates["serve-full"] = full
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"default": "ftq-tiny", "models": templates}))
    return path


@pytest.fixture
def served(make_client: MakeClient, tmp_path: Path) -> Iterator[Served]:
    client = make_client(
        api_tokens=TOKENS,
        openai_file_wait_seconds="0",
        openai_models=str(_catalog(tmp_path)),
        serve_idle_seconds="600",
    )
    s = _serve(client)
    yield s
    s.manager.close()


def _sdk(client: Any, token: str = "tok-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=token, http_client=client, max_retries=0)


def _upload(client: Any, tiny_dir: Path, headers: dict[str, str]) -> str:
    from worker.files import validate

    lines = (tiny_dir / "chat" / "train.jsonl").read_bytes().splitlines()[:8]
    r = client.post(
        "/v1/files",
        headers=headers,
        files={"file": ("train.jsonl", b"\n".join(lines) + b"\n", "application/jsonl")},
        data={"purpose": "fine-tune"},
    )
    assert r.status_code == 200, r.text
    validate("file_" + r.json()["id"].removeprefix("file-"))
    return str(r.json()["id"])


def _adapter(folder: Path, rank: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(b"x")
    return folder


def _trained(
    client: Any, tiny_dir: Path, model: str = "ftq-tiny-serve", headers: dict[str, str] = ALICE, **kw: Any
) -> tuple[str, Path]:
    """A /v1 job on `model`, marked succeeded, with a final/ LoRA adapter (or, for `full`, a copy of the
    servable model) and a checkpoint at step 2 of the same kind: (its fine_tuned_model, its run dir)."""
    train = _upload(client, tiny_dir, headers)
    r = client.post(
        "/v1/fine_tuning/jobs", json={"model": model, "training_file": train, **kw}, headers=headers
    )
    assert r.status_code == 200, r.text
    job_id = "job_" + r.json()["id"].removeprefix("ftjob-")
    with session_scope() as s:
        assert repository.JOBS.mark_starting(s, job_id, resources=None)
        assert repository.JOBS.mark_running(s, job_id, external_id=None, pid=None, pid_start_ticks=None)
        assert repository.JOBS.mark_finished(s, job_id, JobStatus.succeeded, exit_code=0)
    run_dir = runs.run_dir(get_settings().runs_dir, job_id)
    ckpt = checkpoint_dir(run_dir, 2)
    if model == "serve-full":
        shutil.copytree(SERVE_MODEL, run_dir / runs.FINAL)
        shutil.copytree(SERVE_MODEL, ckpt, dirs_exist_ok=True)
    else:
        _adapter(run_dir / runs.FINAL)
        _adapter(ckpt)
    name = client.get(f"/v1/fine_tuning/jobs/{r.json()['id']}", headers=headers).json()["fine_tuned_model"]
    assert name
    return str(name), run_dir


def _chat(client: Any, model: str, headers: dict[str, str] = ALICE, **kw: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], **kw}
    return client.post("/v1/chat/completions", json=body, headers=headers)  # type: ignore[no-any-return]


def _error(r: httpx.Response) -> dict[str, Any]:
    return dict(r.json()["error"])


def test_a_model_its_checkpoint_and_the_base_are_served_from_their_folders_on_one_engine(
    served: Served, tiny_dir: Path
) -> None:
    client = served.client
    name, run_dir = _trained(client, tiny_dir, suffix="bot")
    sdk = _sdk(client)

    answer = sdk.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.model == name
    assert answer.choices[0].message.content == f"{name}|{run_dir / 'final'}|hi"
    ckpt_name = f"{name}:ckpt-step-2"
    ckpt = sdk.chat.completions.create(model=ckpt_name, messages=[{"role": "user", "content": "hi"}])
    assert ckpt.model == ckpt_name
    assert ckpt.choices[0].message.content == f"{ckpt_name}|{run_dir / 'checkpoints' / 'checkpoint-2'}|hi"
    base = sdk.completions.create(model="ftq-tiny-serve", prompt="once")
    assert (
        base.model == "ftq-tiny-serve" and base.choices[0].text == f"ftq-tiny-serve|base:{SERVE_MODEL}|once"
    )

    # One engine for alice's base: the base model the job trained on, its two adapters loaded into it.
    assert len(served.engines.made) == 1
    engine = served.engines.made[0]
    assert engine.config.model == SERVE_MODEL and engine.config.name == "ftq-tiny-serve"
    assert engine.loaded == {name: run_dir / "final", ckpt_name: run_dir / "checkpoints" / "checkpoint-2"}
    # Only the validated parameters reach it; `user` is the token's owner's business, not the engine's.
    sdk.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], temperature=0, user="someone", seed=3
    )
    assert engine.requests[-1] == {
        "model": name,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "n": 1,
        "temperature": 0.0,
        "seed": 3,
    }

    # Both are listed, with the catalog; the native view shows the engine without its address.
    listed = [m.id for m in sdk.models.list()]
    assert {name, ckpt_name, "ftq-tiny-serve", "ftq-tiny"} <= set(listed)
    assert sdk.models.retrieve(ckpt_name).id == ckpt_name
    view = client.get("/deployments", headers=ALICE).json()
    assert [d["base"] for d in view["data"]] == ["ftq-tiny-serve"]
    dep = view["data"][0]
    assert dep["status"] == "ready" and dep["device"] == "cpu" and dep["requests"] == 4
    assert [a["model"] for a in dep["adapters"]] == [name, ckpt_name]
    assert (dep["prompt_tokens"], dep["completion_tokens"]) == (28, 12)
    assert view["usage"]["prompt_tokens"] == 28 and view["usage"]["requests"] == 4
    assert "fake" not in json.dumps(view) and str(SERVE_MODEL) not in json.dumps(view)


def test_owners_never_share_an_engine_nor_see_each_others_models(served: Served, tiny_dir: Path) -> None:
    client = served.client
    name, _ = _trained(client, tiny_dir)
    assert _chat(client, name).status_code == 200

    for model in (name, f"{name}:ckpt-step-2"):
        r = _chat(client, model, BOB)
        assert r.status_code == 404, r.text
        assert _error(r)["param"] == "model" and _error(r)["type"] == "invalid_request_error"
        # The same answer as a model that does not exist.
        assert _error(r)["message"] == _error(_chat(client, model.replace(name[-4:], "0000"), BOB))[
            "message"
        ].replace(model.replace(name[-4:], "0000"), model)
    bob = _sdk(client, "tok-bob")
    assert not [m.id for m in bob.models.list() if m.id.startswith("ft:")]
    with pytest.raises(openai.NotFoundError):
        bob.models.retrieve(name)

    # Bob's call of the same base starts an engine of his own, with none of alice's adapters.
    assert _chat(client, "ftq-tiny-serve", BOB).status_code == 200
    assert len(served.engines.made) == 2
    assert served.engines.made[1].loaded == {}
    assert [d["adapters"] for d in client.get("/deployments", headers=BOB).json()["data"]] == [[]]
    assert len(client.get("/deployments", headers=ALICE).json()["data"]) == 1


def test_what_cannot_be_served_is_a_4xx_saying_why(served: Served, tiny_dir: Path) -> None:
    client = served.client
    # The catalog's ftq-tiny has head_dim 16: neither it nor a model trained on it can be served.
    tiny, run_dir = _trained(client, tiny_dir, model="ftq-tiny")
    for model in ("ftq-tiny", tiny, f"{tiny}:ckpt-step-2"):
        r = _chat(client, model)
        assert r.status_code == 400, r.text
        assert _error(r)["code"] == "model_not_servable" and _error(r)["param"] == "model"
        assert "head_dim 16" in _error(r)["message"] and "ftq-tiny-serve" in _error(r)["message"]
    # It can still be fine-tuned further, so it is listed; its checkpoints cannot be called, so they are not.
    listed = [m["id"] for m in client.get("/v1/models", headers=ALICE).json()["data"]]
    assert tiny in listed and f"{tiny}:ckpt-step-2" not in listed

    name, run_dir = _trained(client, tiny_dir)
    for model in ("gpt-4o", f"{name}:ckpt-step-99", name + "0", "ft:nothing", f"{name}:ckpt-step-x"):
        r = _chat(client, model)
        assert r.status_code == 404 and _error(r)["param"] == "model", (model, r.text)
    # A sharded checkpoint (FSDP) holds no adapter; a removed final/ is said as such.
    checkpoint_dir(run_dir, 4, kind="fsdp")
    r = _chat(client, f"{name}:ckpt-step-4")
    assert r.status_code == 400 and "sharded" in _error(r)["message"]
    assert f"{name}:ckpt-step-4" not in [
        m["id"] for m in client.get("/v1/models", headers=ALICE).json()["data"]
    ]
    _adapter(run_dir / "checkpoints" / "checkpoint-6", rank=1024)
    r = _chat(client, f"{name}:ckpt-step-6")
    assert r.status_code == 400 and "rank is 1024" in _error(r)["message"]
    shutil.rmtree(run_dir / "final")
    r = _chat(client, name)
    assert r.status_code == 400 and "no longer on this server" in _error(r)["message"]
    assert str(run_dir) not in r.text
    assert served.engines.made == []  # nothing was started for any of them


def test_a_full_fine_tune_is_served_by_an_engine_of_its_own(served: Served, tiny_dir: Path) -> None:
    client = served.client
    name, run_dir = _trained(client, tiny_dir, model="serve-full")
    r = _chat(client, name)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == f"{name}|base:{run_dir / 'final'}|hello"
    ckpt = f"{name}:ckpt-step-2"
    assert _chat(client, ckpt).status_code == 200
    assert [(e.config.model, e.config.name, e.loaded) for e in served.engines.made] == [
        (run_dir / "final", name, {}),
        (run_dir / "checkpoints" / "checkpoint-2", ckpt, {}),
    ]
    assert ckpt in [m["id"] for m in client.get("/v1/models", headers=ALICE).json()["data"]]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"temperature": 3}, "temperature"),
        ({"n": 9}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream_options": {"continuous_usage_stats": True}}, "stream_options.continuous_usage_stats"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_parameter(served: Served, body: dict[str, Any], param: str) -> None:
    base = {"model": "ftq-tiny-serve", "messages": [{"role": "user", "content": "hi"}]}
    r = served.client.post("/v1/chat/completions", json={**base, **body}, headers=ALICE)
    assert r.status_code == 400, r.text
    assert _error(r)["param"] == param and _error(r)["type"] == "invalid_request_error"
    assert served.engines.made == []


def test_completions_take_a_prompt_and_refuse_what_they_do_not_know(served: Served) -> None:
    r = served.client.post(
        "/v1/completions", json={"model": "ftq-tiny-serve", "prompt": "x", "suffix": "y"}, headers=ALICE
    )
    assert r.status_code == 400 and _error(r)["param"] == "suffix"
    r = served.client.post(
        "/v1/completions", json={"model": "ftq-tiny-serve", "prompt": [[1, 2], [3]]}, headers=ALICE
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"].endswith("[[1, 2], [3]]")
    assert served.engines.made[0].requests[-1]["max_tokens"] == 16  # OpenAI's default for completions
    assert (
        served.client.post("/v1/completions", json={"prompt": "x"}, headers=ALICE).json()["error"]["param"]
        == "model"
    )


def test_a_stream_is_relayed_as_the_engine_sends_it_and_its_usage_counted(
    served: Served, tiny_dir: Path
) -> None:
    client = served.client
    name, _ = _trained(client, tiny_dir)
    sdk = _sdk(client)
    chunks = list(
        sdk.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks).endswith("|hi")
    assert {c.model for c in chunks} == {name} and all(c.usage is None for c in chunks)
    # The engine was asked for its usage all the same, and it was counted.
    assert served.engines.made[0].requests[-1]["stream_options"] == {"include_usage": True}
    assert client.get("/deployments", headers=ALICE).json()["usage"]["completion_tokens"] == 3

    with_usage = list(
        sdk.completions.create(model=name, prompt="p", stream=True, stream_options={"include_usage": True})
    )
    assert with_usage[-1].usage is not None and with_usage[-1].usage.prompt_tokens == 7
    raw = client.post(
        "/v1/chat/completions",
        json={"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers=ALICE,
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and '"usage"' not in raw.text
    assert client.get("/deployments", headers=ALICE).json()["usage"] == {
        **client.get("/deployments", headers=ALICE).json()["usage"],
        "requests": 3,
        "prompt_tokens": 21,
        "completion_tokens": 9,
    }


def test_a_cold_engine_is_waited_for_and_started_once_for_calls_at_once(served: Served) -> None:
    served.engines.gate.clear()  # the engine starts, and answers only once the gate opens
    answers: list[httpx.Response] = []
    calls = [
        threading.Thread(target=lambda: answers.append(_chat(served.client, "ftq-tiny-serve")))
        for _ in range(3)
    ]
    for t in calls:
        t.start()
    deadline = time.monotonic() + 10
    while not served.engines.made or not served.engines.made[0].started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    assert answers == []  # still waiting for it
    view = served.client.get("/deployments", headers=ALICE).json()["data"]
    assert [d["status"] for d in view] == ["starting"] and view[0]["ready_at"] is None
    served.engines.gate.set()
    for t in calls:
        t.join(10)
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert len(served.engines.made) == 1


def test_an_idle_engine_is_stopped_and_started_again_on_the_next_call(served: Served, tiny_dir: Path) -> None:
    client = served.client
    name, _ = _trained(client, tiny_dir)
    assert _chat(client, name).status_code == 200
    first = served.engines.made[0]
    assert served.manager.sweep(time.monotonic() + 599) == []
    assert served.manager.sweep(time.monotonic() + 601) != []
    deadline = time.monotonic() + 5
    while not first.stopped or _live(client):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Still shown, stopped, with its use and its device time.
    (stopped,) = client.get("/deployments", headers=ALICE).json()["data"]
    assert stopped["status"] == "stopped" and stopped["requests"] == 1 and stopped["device_seconds"] > 0
    # Cold again: a new engine, the adapter loaded into it again.
    assert _chat(client, name).status_code == 200
    assert len(served.engines.made) == 2 and name in served.engines.made[1].loaded


def _live(client: Any) -> list[dict[str, Any]]:
    """The caller's deployments that are not over."""
    data = client.get("/deployments", headers=ALICE).json()["data"]
    return [d for d in data if d["status"] not in ("stopped", "failed")]


def test_the_engine_caps_stop_the_idlest_or_refuse(
    make_client: MakeClient, tmp_path: Path, tiny_dir: Path
) -> None:
    client = make_client(
        api_tokens=TOKENS,
        openai_file_wait_seconds="0",
        openai_models=str(_catalog(tmp_path)),
        serve_engines_per_owner="1",
    )
    s = _serve(client)
    try:
        full, _ = _trained(client, tiny_dir, model="serve-full")
        assert _chat(client, "ftq-tiny-serve").status_code == 200
        # A second base of alice's: her idle engine makes room.
        assert _chat(client, full).status_code == 200
        assert (
            s.engines.made[0].stopped
            or [d["status"] for d in client.get("/deployments", headers=ALICE).json()["data"]].count(
                "stopping"
            )
            == 1
        )
        # With her one engine busy starting, another base is a 429 with Retry-After.
        s.engines.gate.clear()
        busy = threading.Thread(target=lambda: _chat(client, "ftq-tiny-serve"))
        busy.start()
        deadline = time.monotonic() + 10
        while len(s.engines.made) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = _chat(client, full)
        assert r.status_code == 429 and r.headers["Retry-After"] and _error(r)["type"] == "rate_limit_error"
        s.engines.gate.set()
        busy.join(10)
    finally:
        s.manager.close()


def test_without_the_engine_installed_the_call_names_the_command(served: Served) -> None:
    served.engines.fail_start = EngineNotInstalled("vLLM is not installed: /srv/x/.venv-vllm has no vLLM")
    r = _chat(served.client, "ftq-tiny-serve")
    assert r.status_code == 503, r.text
    assert _error(r)["code"] == "engine_not_installed" and "`make vllm`" in _error(r)["message"]
    assert "/srv" not in r.text
    served.engines.fail_start = None
    assert _chat(served.client, "ftq-tiny-serve").status_code == 200  # a failed start is not kept


def test_a_second_api_process_adopts_the_running_engine(served: Served) -> None:
    """An engine is a run of the store's, not of the API process that asked for it: another API process
    (or this one restarted) calling the same base uses it, with its key, rather than asking for another."""
    assert _chat(served.client, "ftq-tiny-serve").status_code == 200
    first = served.engines.made[0]
    other = EngineManager(get_settings(), factory=served.engines.factory)
    served.client.app.state.engines = other
    try:
        assert _chat(served.client, "ftq-tiny-serve").status_code == 200
        second = served.engines.made[1]
        assert second.id == first.id and second.headers == first.headers
        (dep,) = served.client.get("/deployments", headers=ALICE).json()["data"]
        assert dep["id"] == first.id and dep["status"] == "ready" and dep["requests"] == 2
        # Stopped from outside (DELETE): the call after asks for a new engine.
        r = served.client.delete(f"/deployments/{first.id}", headers=ALICE)
        assert r.status_code == 202 and r.json()["status"] in ("stopping", "stopped"), r.text
        assert served.client.delete(f"/deployments/{first.id}", headers=BOB).status_code == 404
        assert _chat(served.client, "ftq-tiny-serve").status_code == 200
        assert served.engines.made[2].id != first.id
    finally:
        other.close()


def test_an_engine_past_its_owners_quota_is_a_429_saying_so(served: Served) -> None:
    served.engines.refuse = "alice's cpu_slots quota is 0 and this run needs 1 (FTQ_QUOTA_CPU_SLOTS)"
    r = _chat(served.client, "ftq-tiny-serve")
    assert r.status_code == 429, r.text
    assert _error(r)["code"] == "quota_exceeded" and "FTQ_QUOTA_CPU_SLOTS" in _error(r)["message"]
    served.engines.refuse = None
    assert _chat(served.client, "ftq-tiny-serve").status_code == 200  # a refusal is not kept
