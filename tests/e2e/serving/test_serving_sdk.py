"""Serving from outside (issue 49), with the official `openai` SDK's default client (its 600 s timeout and 2
retries) against one live `ftq up`: fine-tune the catalog's `ftq-tiny-serve` through /v1 (a few steps),
then call `job.fine_tuned_model` and a checkpoint's model, streamed and not, cold then warm. The greedy
answers equal transformers + PEFT's on the adapters downloaded from the job (float32, the tokenizer and
chat template saved with them); the same job's merged export (`POST /jobs/{id}/exports`, kind merged,
fp32, downloaded through the artifacts API) loaded by plain transformers answers the same, with the chat
template the job trained with; another owner can neither call nor list them; /deployments shows one
engine holding both adapters. One engine (vLLM from .venv-vllm, on the CPU) serves every call.

Cold start (the first call, engine start included), warm latency and the warm stream's first token are
printed and recorded as JUnit properties (`make test`'s build/test-results.xml)."""

from __future__ import annotations

import copy
import functools
import io
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from ftq.client import Client
from service.openai.models import TINY_SERVE_ALIAS, catalog
from tests.harness import EXAMPLES, QUICK_SETTINGS, Deployment, tiny_assets
from tests.harness.procs import live_pids

pytestmark = pytest.mark.slow

TOKENS = {"alice": "tok-alice-serve", "bob": "tok-bob-serve"}
PROMPTS = ["what does carol have?", "count from three.", "describe an animal."]
MAX_TOKENS = 16
# 32 chat rows, 4 a step, 2 epochs: 16 steps, a checkpoint at the end of each epoch (steps 8 and 16).
ROWS, BATCH, EPOCHS = 32, 4, 2
SERVE_MODEL = (EXAMPLES / "tiny" / "model-serve").resolve()


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tiny_assets()
    root = tmp_path_factory.mktemp("serving")
    # The built-in ftq-tiny-serve on one process, at a learning rate that moves a few steps' adapter far
    # enough from the base for its greedy answers to differ.
    template = copy.deepcopy(catalog("").templates[TINY_SERVE_ALIAS])
    template["resources"]["processes_per_node"] = 1
    template["training"]["learning_rate"] = 2.0e-3
    catalog_file = root / "catalog.json"
    catalog_file.write_text(json.dumps({"default": TINY_SERVE_ALIAS, "models": {TINY_SERVE_ALIAS: template}}))
    settings = {**QUICK_SETTINGS, "openai_models": str(catalog_file)}
    d = Deployment(root, mode="up", tokens=TOKENS, settings=settings)
    d.start()
    try:
        yield d
    finally:
        d.close(cancel_active=True)
        # The API's shutdown stopped its engines (sessions of their own, so not the group's SIGTERM).
        deadline = time.monotonic() + 30
        while _engines_of(d) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _engines_of(d), "the API left engines behind"


def _engines_of(dep: Deployment) -> list[int]:
    """Live vLLM servers of this deployment: engines the worker launched run in their folders under its
    data dir (`engines/<id>/`)."""
    found = []
    for pid in live_pids():
        try:
            if b"vllm" in Path(f"/proc/{pid}/cmdline").read_bytes() and Path(
                f"/proc/{pid}/cwd"
            ).resolve().is_relative_to(Path(dep.data_dir).resolve()):
                found.append(pid)
        except OSError:
            continue
    return found


def sdk(dep: Deployment, owner: str = "alice") -> openai.OpenAI:
    # The official SDK's default client: only base_url and api_key change.
    return openai.OpenAI(base_url=f"{dep.url}/v1", api_key=TOKENS[owner])


@dataclass(frozen=True)
class Trained:
    job: str  # the native job id (job_...)
    model: str  # job.fine_tuned_model
    checkpoint: str  # the first checkpoint's model
    final: Path  # final/ as downloaded
    ckpt: Path  # that checkpoint's folder as downloaded


@pytest.fixture(scope="module")
def trained(dep: Deployment, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    client = sdk(dep)
    lines = (tiny_dir / "chat" / "train.jsonl").read_bytes().splitlines()[:ROWS]
    train = client.files.create(
        file=("train.jsonl", io.BytesIO(b"\n".join(lines) + b"\n")), purpose="fine-tune"
    )
    job = client.fine_tuning.jobs.create(
        model=TINY_SERVE_ALIAS,
        training_file=train.id,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": EPOCHS, "batch_size": BATCH}},
        },
        suffix="served",
    )
    deadline = time.monotonic() + 900
    native = "job_" + job.id.removeprefix("ftjob-")
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert time.monotonic() < deadline, dep.report(native)
        time.sleep(2)
    assert job.status == "succeeded" and job.fine_tuned_model, dep.report(native)
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    first = min(checkpoints, key=lambda c: c.step_number)
    # The adapters as a user takes them out of ftq (docs/artifacts.md).
    out = tmp_path_factory.mktemp("downloaded")
    with Client(dep.url, TOKENS["alice"]) as ftq:
        ftq.jobs.download(native, "final", out)
        ftq.jobs.download(native, f"checkpoints/checkpoint-{first.step_number}", out)
    return Trained(
        native,
        job.fine_tuned_model,
        first.fine_tuned_model_checkpoint,
        out / "final",
        out / f"checkpoint-{first.step_number}",
    )


def _whole(text: str | None) -> str:
    """The text without a last character cut off mid-way (U+FFFD): vLLM's incremental detokenizer holds
    back the bytes of a character the last token left incomplete, where a whole decode shows U+FFFD."""
    return (text or "").rstrip("\ufffd")


@functools.cache
def _reference(adapter: Path | None, tokenizer_dir: Path, model_dir: Path = SERVE_MODEL) -> dict[str, str]:
    """transformers (+ PEFT on `adapter`) greedy on `model_dir` (the base, or a merged export), float32,
    `tokenizer_dir`'s chat template: per prompt. Cached: the tests share the downloaded folders."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(tokenizer_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    out = {}
    for prompt in PROMPTS:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=MAX_TOKENS, do_sample=False)
        completion = ids[0, enc["input_ids"].shape[1] :].tolist()
        if tok.eos_token_id in completion:
            completion = completion[: completion.index(tok.eos_token_id)]
        out[prompt] = _whole(tok.decode(completion, skip_special_tokens=True))
    return out


def _chat(client: openai.OpenAI, model: str, prompt: str) -> str:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0
    )
    assert r.model == model
    return _whole(r.choices[0].message.content)


def _stream(client: openai.OpenAI, model: str, prompt: str) -> tuple[str, float | None]:
    """(the streamed text, seconds to its first token: None for an empty answer)."""
    start = time.monotonic()
    first = None
    parts = []
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    ):
        assert chunk.model == model
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.monotonic() - start
            parts.append(chunk.choices[0].delta.content)
    return _whole("".join(parts)), first


def test_the_fine_tuned_model_and_its_checkpoint_answer_as_transformers_and_peft(
    dep: Deployment, trained: Trained, record_property: Any
) -> None:
    alice = sdk(dep)
    # Cold: no engine yet; the first call starts it and waits for it, within the SDK's default timeout.
    assert (
        dep.http.get("/deployments", headers={"Authorization": f"Bearer {TOKENS['alice']}"}).json()["data"]
        == []
    )
    start = time.monotonic()
    cold = _chat(alice, trained.model, PROMPTS[0])
    cold_s = time.monotonic() - start

    final_ref = _reference(trained.final, trained.final)
    ckpt_ref = _reference(trained.ckpt, trained.final)
    base_ref = _reference(None, trained.final)
    print(f"\nanswers: final {final_ref}, checkpoint {ckpt_ref}, base {base_ref}")
    assert cold == final_ref[PROMPTS[0]]
    for prompt in PROMPTS:
        assert _chat(alice, trained.model, prompt) == final_ref[prompt], prompt
        assert _stream(alice, trained.model, prompt)[0] == final_ref[prompt], prompt
        assert _chat(alice, trained.checkpoint, prompt) == ckpt_ref[prompt], prompt
        assert _stream(alice, trained.checkpoint, prompt)[0] == ckpt_ref[prompt], prompt
        assert _chat(alice, TINY_SERVE_ALIAS, prompt) == base_ref[prompt], prompt
    # The adapter is what makes the answers.
    assert [final_ref[p] for p in PROMPTS] != [base_ref[p] for p in PROMPTS]

    # Warm.
    times = []
    for _ in range(5):
        t = time.monotonic()
        _chat(alice, trained.model, PROMPTS[1])
        times.append(time.monotonic() - t)
    answered = [p for p in PROMPTS if final_ref[p]]
    assert answered, final_ref
    first_token = _stream(alice, trained.model, answered[0])[1]
    assert first_token is not None
    completion = alice.completions.create(
        model=trained.model, prompt="alice has", max_tokens=8, temperature=0
    )
    assert completion.model == trained.model and completion.usage and completion.usage.completion_tokens > 0

    view = dep.http.get("/deployments", headers={"Authorization": f"Bearer {TOKENS['alice']}"}).json()
    assert [(d["base"], d["status"]) for d in view["data"]] == [(TINY_SERVE_ALIAS, "ready")], view
    assert {a["model"] for a in view["data"][0]["adapters"]} == {trained.model, trained.checkpoint}
    assert view["usage"]["completion_tokens"] > 0 and view["usage"]["prompt_tokens"] > 0
    figures = {
        "serve_cold_first_call_s": round(cold_s, 2),
        f"serve_warm_{MAX_TOKENS}_tokens_median_s": round(statistics.median(times), 3),
        "serve_warm_first_token_s": round(first_token, 3),
        "serve_engine_ready_after_s": round(view["data"][0]["ready_at"] - view["data"][0]["started_at"], 2),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"\nserving figures: {figures}")


def test_the_merged_export_answers_as_the_adapter_and_the_engine(
    dep: Deployment, trained: Trained, tmp_path: Path
) -> None:
    """The same job exported merged (the adapter folded into the base by PEFT's merge_and_unload, fp32),
    downloaded through the artifacts API and loaded by plain transformers without PEFT, greedily gives the
    text transformers + PEFT gives on the downloaded adapter, and the text the served ft: model gives;
    the prompts rendered with the chat template the job trained with (final/'s), which the export carries."""
    from transformers import AutoTokenizer

    with Client(dep.url, TOKENS["alice"]) as ftq:
        export = ftq.jobs.export(trained.job, "merged", "fp32")
        export = ftq.jobs.wait_export(trained.job, export.id, timeout=600)
        assert export.status == "succeeded", (export.error, dep.report(trained.job))
        assert (export.kind, export.dtype, export.checkpoint) == ("merged", "fp32", "final")
        ftq.jobs.download(trained.job, export.path, tmp_path)
    merged = tmp_path / Path(export.path).name
    assert not (merged / "adapter_config.json").exists()  # a whole model, not an adapter
    job_template = AutoTokenizer.from_pretrained(trained.final).chat_template
    assert job_template and AutoTokenizer.from_pretrained(merged).chat_template == job_template

    merged_ref = _reference(None, trained.final, merged)
    final_ref = _reference(trained.final, trained.final)
    print(f"\nanswers: merged export {merged_ref}")
    assert merged_ref == final_ref
    # The merged weights are the adapter's, not the base's.
    assert merged_ref != _reference(None, trained.final)
    alice = sdk(dep)
    for prompt in PROMPTS:
        assert _chat(alice, trained.model, prompt) == merged_ref[prompt], prompt


def test_another_owner_can_neither_call_nor_list_them(dep: Deployment, trained: Trained) -> None:
    bob = sdk(dep, "bob")
    for model in (trained.model, trained.checkpoint):
        with pytest.raises(openai.NotFoundError) as err:
            _chat(bob, model, PROMPTS[0])
        assert isinstance(err.value.body, dict) and err.value.body["param"] == "model"
        with pytest.raises(openai.NotFoundError):
            list(
                bob.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "x"}], stream=True
                )
            )
    listed = [m.id for m in bob.models.list()]
    assert trained.model not in listed and trained.checkpoint not in listed
    assert {trained.model, trained.checkpoint} <= {m.id for m in sdk(dep).models.list()}
    assert (
        dep.http.get("/deployments", headers={"Authorization": f"Bearer {TOKENS['bob']}"}).json()["data"]
        == []
    )


def test_the_engine_answers_only_ftq_and_its_time_and_tokens_are_in_usage(
    dep: Deployment, trained: Trained
) -> None:
    """The engine is a run the scheduler placed (a CPU slot, in the owner's usage once it ends). Any
    process on the host reaches its port, but without the engine's own key vLLM answers 401 to a
    completion and to loading an adapter (which would put another owner's adapter in reach). Stopped
    (DELETE /deployments/{id}), its devices x time and its tokens in and out are in the owner's /usage;
    the next call asks for a new engine."""
    import httpx

    alice = {"Authorization": f"Bearer {TOKENS['alice']}"}
    (live,) = dep.http.get("/deployments", headers=alice).json()["data"]
    assert (live["status"], live["launcher"], live["devices"]) == ("ready", "local", 1)
    folder = Path(dep.data_dir) / "engines" / live["id"]
    url = json.loads((folder / "endpoint.json").read_text())["url"]
    body = {"model": TINY_SERVE_ALIAS, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert httpx.post(f"{url}/chat/completions", json=body, timeout=30).status_code == 401
    load = {"lora_name": "intruder", "lora_path": str(trained.final)}
    assert httpx.post(f"{url}/load_lora_adapter", json=load, timeout=30).status_code == 401

    r = dep.http.delete(f"/deployments/{live['id']}", headers=alice)
    assert r.status_code == 202 and r.json()["status"] in ("stopping", "stopped"), r.text
    deadline = time.monotonic() + 120
    while (d := dep.http.get("/deployments", headers=alice).json()["data"][0])["status"] != "stopped":
        assert time.monotonic() < deadline, d
        time.sleep(0.5)
    assert not _engines_of(dep)
    (usage,) = dep.http.get("/usage", headers=alice).json()["data"]
    assert usage["deployments"] == 1 and usage["device_seconds"] >= d["device_seconds"] > 0
    tokens = (d["prompt_tokens"], d["completion_tokens"])
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == tokens
    assert d["completion_tokens"] > 0 and d["requests"] >= 20
    # Cold again: a new engine answers the next call.
    assert _chat(sdk(dep), TINY_SERVE_ALIAS, PROMPTS[0]) is not None
    assert [x["status"] for x in dep.http.get("/deployments", headers=alice).json()["data"]] == [
        "stopped",
        "ready",
    ]
