"""The Tinker API from outside (issue 52), with the official `tinker` SDK (0.38) against one live `ftq up`:
only `base_url` and an ftq token of the `tml-` form change. A LoRA training client on the catalog's
`ftq-tiny` (a run the scheduler places: `python -m trainer.tinker_host`) trains on a fixed batch until its
NLL falls, saves sampler weights, samples from them and computes logprobs (equal to forward's on the same
weights), saves its state, and the REST client lists its run and checkpoints. Another owner's key sees
none of it (404), an unknown key is refused (401), an unsupported loss is a 400 naming it, and closing the
session stops the run, whose device time is then in the owner's /usage.

Call latencies (create, a forward_backward + optim_step round trip, a sample) are printed and recorded as
JUnit properties."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import tinker
from tinker import types

from service.openai.models import _DEFAULT_TEMPLATE
from tests.harness import EXAMPLES, QUICK_SETTINGS, REPO, Deployment, clean_env, tiny_assets

pytestmark = pytest.mark.slow

# An operator issues Tinker users ftq tokens of the SDK's form (`tml-...`): FTQ_API_TOKENS as any other.
TOKENS = {"alice": "tml-alice-tinker-key", "bob": "tml-bob-tinker-key"}
ALICE, BOB = TOKENS["alice"], TOKENS["bob"]
TEXTS = [
    "alice has a red ball and bob has a blue cup.",
    "count from one: one, two, three, four, five.",
]
STEPS = 5
# The module's ftq up saves an idle training client after this long (FTQ_TINKER_IDLE_SECONDS, tiny here so
# a test can wait it out); every other test's calls keep working across such a save, transparently.
IDLE_SECONDS = 8
# The cookbook's recipes name a hub base; the module's catalog maps it to the tiny model.
COOKBOOK_BASE = "Qwen/Qwen3-8B-Base"


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tiny_assets()
    root = tmp_path_factory.mktemp("tinker")
    # The built-in catalog's two tiny bases, and the tiny model under the hub name the cookbook's recipes
    # ask for (their renderer is chosen by that name: role_colon for a base model).
    catalog = root / "catalog.yaml"
    template = {**_DEFAULT_TEMPLATE, "model": {"name_or_path": "./tiny/model"}}
    models = {
        "ftq-tiny": template,
        "ftq-tiny-serve": {**template, "model": {"name_or_path": "./tiny/model-serve"}},
    }
    catalog.write_text(json.dumps({"default": "ftq-tiny", "models": {**models, COOKBOOK_BASE: template}}))
    settings = {**QUICK_SETTINGS, "tinker_idle_seconds": IDLE_SECONDS, "openai_models": str(catalog)}
    d = Deployment(root, mode="up", tokens=TOKENS, settings=settings)
    d.start()
    try:
        yield d
    finally:
        d.close(cancel_active=True)


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def nll(result: types.ForwardBackwardOutput, data: list[types.Datum]) -> float:
    total = weight = 0.0
    for out, datum in zip(result.loss_fn_outputs, data, strict=True):
        lp = out["logprobs"].tolist()
        w = datum.loss_fn_inputs["weights"].tolist()
        total -= sum(a * b for a, b in zip(lp, w, strict=True))
        weight += sum(w)
    return total / weight


def batch(tokenizer: Any) -> list[types.Datum]:
    data = []
    for text in TEXTS:
        ids = tokenizer.encode(text)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": types.TensorData(data=ids[1:], dtype="int64", shape=[len(ids) - 1]),
                    "weights": types.TensorData(
                        data=[1.0] * (len(ids) - 1), dtype="float32", shape=[len(ids) - 1]
                    ),
                },
            )
        )
    return data


def run_status(dep: Deployment, model_id: str, key: str = ALICE) -> str:
    r = httpx.get(f"{dep.url}/api/v1/training_runs/{model_id}", headers={"X-API-Key": key})
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


def test_train_sample_save_and_list_with_the_official_sdk(
    dep: Deployment, record_property: Callable[[str, object], None]
) -> None:
    sc = tinker.ServiceClient(base_url=dep.url, api_key=ALICE)
    caps = tinker.RestClient(base_url=dep.url, api_key=ALICE).get_server_capabilities().result()
    assert {m.model_name for m in caps.supported_models} >= {"ftq-tiny", "ftq-tiny-serve"}

    tc, create_s = timed(
        lambda: sc.create_lora_training_client(base_model="ftq-tiny", rank=8, seed=0).result()
    )
    tokenizer = tc.get_tokenizer()  # from get_info's tokenizer_id: the base's folder on this machine
    data = batch(tokenizer)
    nlls, rounds = [], []
    for _ in range(STEPS):
        started = time.perf_counter()
        fwd = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-2))
        nlls.append(nll(fwd.result(), data))
        assert opt.result().metrics is not None
        rounds.append(time.perf_counter() - started)
    assert nlls[-1] < nlls[0] * 0.8, nlls

    # Sampler weights of the trained adapter: sampled, and scored as forward scores them.
    saved = tc.save_weights_for_sampler("s1").result()
    assert saved.path == f"tinker://{tc.model_id}/sampler_weights/s1"
    sampler = sc.create_sampling_client(model_path=saved.path).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("alice has"))
    sample, sample_s = timed(
        lambda: sampler.sample(
            prompt=prompt,
            num_samples=2,
            sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=1),
        ).result()
    )
    assert len(sample.sequences) == 2
    for seq in sample.sequences:
        assert 1 <= len(seq.tokens) <= 8 and seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
    ids = tokenizer.encode(TEXTS[0])
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    assert logprobs[0] is None and len(logprobs) == len(ids)
    forward = tc.forward([data[0]], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert logprobs[1:] == pytest.approx(forward, abs=1e-4)

    state = tc.save_state("st1").result()
    assert state.path == f"tinker://{tc.model_id}/weights/st1"

    rest = tinker.RestClient(base_url=dep.url, api_key=ALICE)
    runs = rest.list_training_runs().result()
    assert [r.training_run_id for r in runs.training_runs] == [tc.model_id]
    assert runs.training_runs[0].base_model == "ftq-tiny" and runs.training_runs[0].lora_rank == 8
    checkpoints = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert {c.tinker_path for c in checkpoints} == {saved.path, state.path}

    # Another owner: none of it exists for them.
    bob = tinker.RestClient(base_url=dep.url, api_key=BOB)
    assert bob.list_training_runs().result().training_runs == []
    with pytest.raises(tinker.NotFoundError):
        bob.get_training_run(tc.model_id).result()
    with pytest.raises(tinker.NotFoundError):
        bob.list_checkpoints(tc.model_id).result()
    headers = {"X-API-Key": BOB, "Content-Type": "application/json"}
    refused = httpx.post(f"{dep.url}/api/v1/get_info", json={"model_id": tc.model_id}, headers=headers)
    assert refused.status_code == 404, refused.text
    unknown = httpx.post(f"{dep.url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-nobody"})
    assert unknown.status_code == 401 and unknown.content

    # An unsupported loss: a 400 that names it (last: the SDK may poison the client after it).
    with pytest.raises(tinker.BadRequestError, match="cispo"):
        tc.forward_backward(data, "cispo").result()

    # The session's end stops the run; its device time is in the owner's usage.
    sc.close("success").result()
    deadline = time.monotonic() + 60
    auth = {"Authorization": f"Bearer {ALICE}"}
    while True:
        rows = httpx.get(f"{dep.url}/usage", headers=auth).json()["data"]
        if rows and rows[0]["training_clients"] == 1:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert rows[0]["owner"] == "alice" and rows[0]["device_seconds"] > 0

    round_trip = statistics.median(rounds)
    print(
        f"\ntinker: create {create_s:.1f} s, forward_backward + optim_step {round_trip:.3f} s (median of "
        f"{STEPS}), sample x2 {sample_s:.3f} s; NLL {nlls[0]:.3f} -> {nlls[-1]:.3f}"
    )
    record_property("tinker_create_seconds", round(create_s, 2))
    record_property("tinker_round_trip_seconds", round(round_trip, 3))
    record_property("tinker_nll", f"{nlls[0]:.3f} -> {nlls[-1]:.3f}")


def test_the_shipped_example_runs(dep: Deployment) -> None:
    """examples/tinker/train_tiny.py, as docs/tinker.md runs it: only FTQ_URL and the key change."""
    env = {**clean_env(), "FTQ_URL": dep.url, "TINKER_API_KEY": BOB, "TINKER_TELEMETRY": "0"}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "tinker" / "train_tiny.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 5 and losses[-1] < losses[0], out.stdout
    assert "saved: tinker://" in out.stdout


def test_an_idle_client_is_saved_stopped_and_brought_back_by_its_next_call(
    dep: Deployment, record_property: Callable[[str, object], None]
) -> None:
    """FTQ_TINKER_IDLE_SECONDS: the idle client's state (weights, Adam's moments, the gradients of a
    forward_backward no optim_step used yet) is saved, its run stops (`paused`, its CPU slot back); the next
    call waits for a new run that loads it, and training goes on from where it was."""
    sc = tinker.ServiceClient(base_url=dep.url, api_key=ALICE)
    tc = sc.create_lora_training_client(base_model="ftq-tiny", rank=8, seed=0).result()
    data = batch(tc.get_tokenizer())
    nlls = []
    for _ in range(2):
        fwd = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        nlls.append(nll(fwd.result(), data))
    before = [o["logprobs"].tolist() for o in tc.forward(data, "cross_entropy").result().loss_fn_outputs]
    nlls.append(nll(tc.forward_backward(data, "cross_entropy").result(), data))  # gradients, no step yet
    assert run_status(dep, tc.model_id) == "running"

    deadline = time.monotonic() + IDLE_SECONDS + 60
    while (status := run_status(dep, tc.model_id)) != "paused":
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    auth = {"Authorization": f"Bearer {ALICE}"}
    # Seen like any run: GET /training_clients and `ftq ls` show it paused, its devices back.
    listed = httpx.get(f"{dep.url}/training_clients", headers=auth).json()["data"]
    mine = next(t for t in listed if t["id"] == tc.model_id)
    assert mine["status"] == "paused" and mine["device_seconds"] > 0 and mine["last_step_seconds"] > 0
    env = {**clean_env(), "FTQ_URL": dep.url, "FTQ_TOKEN": ALICE, "COLUMNS": "160"}
    ls = subprocess.run(
        [str(REPO / "bin" / "ftq"), "ls"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ls.returncode == 0, ls.stderr
    assert "training clients" in ls.stdout
    assert any(tc.model_id in line and "paused" in line for line in ls.stdout.splitlines()), ls.stdout

    # The next call brings it back from the saved state (the SDK just waits for its future).
    after, back_s = timed(
        lambda: [o["logprobs"].tolist() for o in tc.forward(data, "cross_entropy").result().loss_fn_outputs]
    )
    assert run_status(dep, tc.model_id) == "running"
    for a, b in zip(after, before, strict=True):
        assert a == pytest.approx(b, abs=1e-5)  # the same weights
    step = tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert step.metrics is not None and step.metrics["grad_norm:mean"] > 0  # the saved gradients, stepped
    for _ in range(2):
        fwd = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        nlls.append(nll(fwd.result(), data))
    assert nlls[-1] < nlls[2] < nlls[0], nlls  # it goes on falling from where it was, not from the start

    events = httpx.get(f"{dep.url}/training_clients/{tc.model_id}/events", headers=auth)
    assert events.status_code == 200, events.text
    assert [e["type"].removeprefix("training_client.") for e in events.json()["data"]] == [
        "created", "started", "idle_saved", "resumed", "started",
    ]  # fmt: skip
    # Each call's time on its host, both runs' calls in one log.
    log = httpx.get(f"{dep.url}/training_clients/{tc.model_id}/logs", headers=auth).json()["text"]
    steps = re.findall(r"^tinker_host: forward_backward ([0-9.]+) s$", log, re.MULTILINE)
    assert len(steps) == 5 and log.count("tinker_host: forward ") == 2 and log.count(" loaded in ") == 2, log
    bob = httpx.get(
        f"{dep.url}/training_clients/{tc.model_id}/logs", headers={"Authorization": f"Bearer {BOB}"}
    )
    assert bob.status_code == 404
    sc.close("success").result()
    print(f"\ntinker idle: brought back in {back_s:.1f} s; NLL {[round(x, 3) for x in nlls]}")
    record_property("tinker_idle_restore_seconds", round(back_s, 2))


# The cookbook's minimal loops (tinker_cookbook/recipes/sl_loop.py and rl_loop.py, 0.6.1), unchanged, run as
# `python -m` in a folder that stands in for the hub: their base's name is a folder there (a link to the
# tiny model: the cookbook loads a tokenizer from a local folder of that name first), and the datasets they
# load by hub name are local folders of those names (`datasets` reads an existing folder as a dataset).
ARITHMETIC = [(a, 7 - a) for a in range(8)]  # every answer is 7: a format and a number the tiny model learns
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
STRAWBERRY = [  # rl_loop's own one-shot prefix, so that the SL data's context is the RL prompts'
    {"role": "user", "content": "How many r's are in strawberry?" + SUFFIX},
    {
        "role": "assistant",
        "content": "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w 6) b 7) e "
        "8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}",
    },
]
SL_STEPS, RL_STEPS = 10, 10


def hub_folder(root: Any) -> Any:
    """The run folder: the base by its hub name, no_robots (SL) and gsm8k (RL) as local datasets."""
    base = root / COOKBOOK_BASE
    base.parent.mkdir(parents=True)
    base.symlink_to((EXAMPLES / "tiny" / "model").resolve())
    rows = [(f"What is {a}+{b}?", a + b) for _ in range(50) for a, b in ARITHMETIC]
    sl = root / "HuggingFaceH4" / "no_robots"
    sl.mkdir(parents=True)
    with (sl / "train.jsonl").open("w") as f:
        for question, answer in rows:
            messages = [*STRAWBERRY, {"role": "user", "content": question + SUFFIX}]
            messages.append({"role": "assistant", "content": f"\\boxed{{{answer}}}"})
            f.write(json.dumps({"messages": messages}) + "\n")
    rl = root / "openai" / "gsm8k"
    (rl / "main").mkdir(parents=True)
    (rl / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n"
        "  - split: train\n    path: main/train.jsonl\n---\n"
    )
    with (rl / "main" / "train.jsonl").open("w") as f:
        for question, answer in rows:
            f.write(
                json.dumps({"question": question, "answer": f"{question[8:-1]}={answer}\n#### {answer}"})
                + "\n"
            )
    return root


def recipe(dep: Deployment, folder: Any, name: str, *args: str) -> list[dict[str, Any]]:
    """`python -m tinker_cookbook.recipes.<name> ...` in the run folder against the module's ftq up: its
    metrics.jsonl, one line per step."""
    env = {
        **clean_env(),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(folder / ".hf-datasets"),
        "TINKER_TELEMETRY": "0",
        "TINKER_API_KEY": ALICE,
        "OMP_NUM_THREADS": "1",
    }
    log_path = folder / f"{name}-log"
    out = subprocess.run(
        [sys.executable, "-m", f"tinker_cookbook.recipes.{name}", f"base_url={dep.url}",
         f"model_name={COOKBOOK_BASE}", f"log_path={log_path}", "batch_size=4", "lora_rank=8", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-5000:])
    assert "Training completed" in out.stdout + out.stderr
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_the_cookbook_sl_and_rl_loops_run_against_ftq(
    dep: Deployment, tmp_path: Any, record_property: Callable[[str, object], None]
) -> None:
    """sl_loop's NLL falls on a local chat set (the arithmetic set's answers, in rl_loop's one-shot
    context); rl_loop (importance_sampling) starts from sl_loop's final state, through its own resume
    (checkpoints.jsonl in its log_path), and its reward rises."""
    folder = hub_folder(tmp_path)
    started = time.perf_counter()
    sl = recipe(
        dep, folder, "sl_loop", f"max_steps={SL_STEPS}", "learning_rate=1e-2", "save_every=0",
        "max_length=512", "train_on_what=last_assistant_message",
    )  # fmt: skip
    sl_s = time.perf_counter() - started
    nlls = [m["train_mean_nll"] for m in sl]
    assert len(nlls) == SL_STEPS and nlls[-1] < nlls[0] * 0.5, nlls

    final = [
        json.loads(line) for line in (folder / "sl_loop-log" / "checkpoints.jsonl").read_text().splitlines()
    ]
    state = next(c["state_path"] for c in final if c.get("name") == "final")
    (folder / "rl_loop-log").mkdir()
    (folder / "rl_loop-log" / "checkpoints.jsonl").write_text(
        json.dumps({"name": "from-sl", "batch": 0, "state_path": state}) + "\n"
    )
    started = time.perf_counter()
    rl = recipe(
        dep, folder, "rl_loop", f"max_steps={RL_STEPS}", "learning_rate=1e-2", "save_every=0",
        "loss_fn=importance_sampling", "group_size=16", "max_tokens=10",
    )  # fmt: skip
    rl_s = time.perf_counter() - started
    rewards = [m["reward/total"] for m in rl]
    assert len(rewards) == RL_STEPS, rewards
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    print(
        f"\ncookbook: sl_loop {SL_STEPS} steps in {sl_s:.1f} s, NLL {nlls[0]:.3f} -> {nlls[-1]:.3f}; "
        f"rl_loop {RL_STEPS} steps in {rl_s:.1f} s, reward {[round(r, 3) for r in rewards]}"
    )
    record_property("cookbook_sl_nll", f"{nlls[0]:.3f} -> {nlls[-1]:.3f}")
    record_property("cookbook_rl_reward", f"{first:.3f} -> {last:.3f}")
    assert last > first + 0.1, rewards


def test_sampler_weights_are_sampled_by_the_serving_engine(
    dep: Deployment, record_property: Callable[[str, object], None]
) -> None:
    """A sampler on a base the engine serves (the catalog's ftq-tiny-serve) and an adapter without the
    output layer (train_unembed=False) is sampled by the owner's vLLM engine, the sampler folder loaded into
    it as an adapter: the training client's process samples nothing, the engine is in /deployments with
    the adapter, and the sampled tokens' logprobs are the trained model's (forward's, within float error)."""
    from service.tinker.engine_sampling import engine_installed

    # make test builds .venv-vllm: without it this fails, naming the command (a skip would hide it).
    assert engine_installed(), "vLLM is not installed: `make vllm` builds .venv-vllm"
    sc = tinker.ServiceClient(base_url=dep.url, api_key=BOB)
    tc = sc.create_lora_training_client(
        base_model="ftq-tiny-serve", rank=8, seed=0, train_unembed=False
    ).result()
    data = batch(tc.get_tokenizer())
    for _ in range(2):
        fwd = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        fwd.result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = tc.get_tokenizer().encode("alice has")
    params = types.SamplingParams(max_tokens=8, temperature=1.0, stop=[], seed=3)
    sample, cold_s = timed(
        lambda: sampler.sample(
            prompt=types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params
        ).result()
    )
    _, warm_s = timed(
        lambda: sampler.sample(
            prompt=types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params
        ).result()
    )
    auth = {"Authorization": f"Bearer {BOB}"}
    deadline = time.monotonic() + 15
    while True:  # the engine's use is written to the store just after its answer
        engines = httpx.get(f"{dep.url}/deployments", headers=auth).json()["data"]
        if (engines and engines[0]["requests"] >= 2) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [(e["base"], e["status"]) for e in engines] == [("ftq-tiny-serve", "ready")], engines
    assert len(engines[0]["adapters"]) == 1, engines
    assert engines[0]["requests"] >= 2 and engines[0]["completion_tokens"] >= 2 * 3 * 8, engines
    log = httpx.get(f"{dep.url}/training_clients/{tc.model_id}/logs", headers=auth).json()["text"]
    assert "tinker_host: sample" not in log, log
    gap = 0.0
    for seq in sample.sequences:
        assert len(seq.tokens) == 8 and seq.logprobs is not None and len(seq.logprobs) == 8
        tokens = prompt + list(seq.tokens)
        scored = tc.forward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={
                        "target_tokens": types.TensorData(
                            data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]
                        )
                    },
                )
            ],
            "cross_entropy",
        ).result()
        forward = scored.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1 :]
        assert seq.logprobs == pytest.approx(forward, abs=2e-3), (seq.logprobs, forward)
        gap = max(gap, *(abs(a - b) for a, b in zip(seq.logprobs, forward, strict=True)))
    sc.close("success").result()
    print(
        f"\ntinker on the engine: first sample {cold_s:.1f} s (the engine's start), then {warm_s:.3f} s; "
        f"sampled logprobs within {gap:.1e} of forward's"
    )
    record_property("tinker_engine_first_sample_seconds", round(cold_s, 1))
