"""The Tinker API's cost (issue 52): a training step and sampling through ftq against the same work in
process. One `ftq up` (API, worker and scheduler; SQLite, its own broker) serves the official `tinker` SDK
(0.38); a LoRA training client on the catalog's `ftq-tiny` (rank 8, float32, on the CPU slot the
scheduler gives it: one thread) runs a `forward_backward` (cross_entropy on a fixed batch) + `optim_step`
(AdamW) round trip through the SDK, its futures and the API's queue to the client's own process
(trainer.tinker_host). Beside it the same step in this process: the same base with the same PEFT LoRA
(rank, targets, seed), the same loss and AdamW, one thread, no HTTP (trainer.tinker_host.Host called
directly). The figures are the medians of the round trips, their ratio ftq / in process, and ftq's
overhead per call (half the difference: a round trip is two calls).

Sampling, N samples of exactly T new tokens each (no stop), tokens/s, two ways:
- on a base the serving engine cannot serve (`ftq-tiny`: head_dim 16, under vLLM's CPU minimum) ftq samples
  in the training client's process (a forward pass per token with the KV cache): against Hugging Face
  `generate` in this process on the same saved sampler weights (the PEFT adapter folder ftq wrote);
- on one it serves (`ftq-tiny-serve`, a client with train_unembed=False) ftq samples on the owner's vLLM
  engine with the sampler folder as its adapter: against a bare vLLM engine (ftq.engine.LocalEngine, the
  same model folder and arguments) with the same adapter folder loaded, called on its /v1/completions with
  the same token ids, one engine alive at a time. Left out where vLLM is not installed, and by --smoke.

    python -m bench.tinker_bench [--steps 20] [--samples 8] [--tokens 32] [--rounds 3] [--smoke]

--smoke: 2 round trips and 2 samples of 4 tokens a side, one round, no engine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import log, note, result, scratch
from tests.harness import EXAMPLES, QUICK_SETTINGS, Deployment, tiny_assets

BASE = "ftq-tiny"
KEY = "tml-bench-tinker"
RANK = 8
LR = 1e-3
TEXTS = [
    "alice has a red ball and bob has a blue cup.",
    "count from one: one, two, three, four, five.",
]


def batch(tokenizer: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """The fixed batch, as the SDK's Datums and as the host's JSON (the same tokens and weights)."""
    from tinker import types

    sdk, host = [], []
    for text in TEXTS:
        ids = tokenizer.encode(text)
        n = len(ids) - 1
        targets = types.TensorData(data=ids[1:], dtype="int64", shape=[n])
        weights = types.TensorData(data=[1.0] * n, dtype="float32", shape=[n])
        sdk.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": targets, "weights": weights},
            )
        )
        host.append(
            {
                "tokens": ids[:-1],
                "loss_fn_inputs": {
                    "target_tokens": {"data": ids[1:], "dtype": "int64", "shape": [n]},
                    "weights": {"data": [1.0] * n, "dtype": "float32", "shape": [n]},
                },
            }
        )
    return sdk, host


def through_ftq(tc: Any, data: list[Any], steps: int) -> list[float]:
    from tinker import types

    times = []
    for _ in range(steps):
        started = time.perf_counter()
        fwd = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=LR))
        fwd.result()
        opt.result()
        times.append(time.perf_counter() - started)
    return times


def in_process(host: Any, data: list[dict[str, Any]], steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        host.forward_backward({"data": data, "loss_fn": "cross_entropy"})
        host.optim_step({"adam_params": {"learning_rate": LR}})
        times.append(time.perf_counter() - started)
    return times


def sample_ftq(sampler: Any, prompt: list[int], n: int, tokens: int) -> float:
    """Tokens/s of n samples of exactly `tokens` new tokens through ftq (no stop)."""
    from tinker import types

    params = types.SamplingParams(max_tokens=tokens, temperature=1.0, stop=[], seed=0)
    started = time.perf_counter()
    got = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=n, sampling_params=params)
    seqs = got.result().sequences
    wall = time.perf_counter() - started
    made = sum(len(s.tokens) for s in seqs)
    assert made == n * tokens, made
    return made / wall


def sample_hf(model: Any, prompt: list[int], n: int, tokens: int) -> float:
    """Tokens/s of the same through `generate` in this process (sampling, no EOS stop)."""
    import torch

    ids = torch.tensor([prompt])
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens, num_return_sequences=n,
            pad_token_id=0,
        )  # fmt: skip
    wall = time.perf_counter() - started
    made = int((out.shape[1] - len(prompt)) * out.shape[0])
    assert made == n * tokens, made
    return made / wall


def sample_direct(engine: Any, name: str, prompt: list[int], n: int, tokens: int) -> float:
    """Tokens/s of the same on a bare engine's /v1/completions, the adapter loaded as `name`."""
    import httpx

    body = {
        "model": name, "prompt": prompt, "n": n, "max_tokens": tokens, "min_tokens": tokens,
        "temperature": 1.0, "logprobs": 0, "ignore_eos": True, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    started = time.perf_counter()
    r = httpx.post(f"{engine.base_url}/completions", json=body, headers=engine.headers, timeout=600)
    wall = time.perf_counter() - started
    r.raise_for_status()
    made = sum(len(c["logprobs"]["tokens"]) for c in r.json()["choices"])
    assert made == n * tokens, made
    return made / wall


def on_engines(sc: Any, dep: Deployment, root: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """Sampling through ftq's engine, then on a bare one (see the module's docstring), one engine alive at a
    time: two vLLM engines on two cores contend (alternated, the ratio swung from 0.24x to 3.1x between
    runs). None without vLLM."""
    from ftq.engine import EngineConfig, LocalEngine
    from service.tinker.engine_sampling import engine_installed

    if not engine_installed():
        note("tinker engine sampling: left out, vLLM is not installed (make vllm)")
        return None
    tc = sc.create_lora_training_client(base_model="ftq-tiny-serve", rank=RANK, seed=0, train_unembed=False)
    tc = tc.result()
    sdk_data, _ = batch(tc.get_tokenizer())
    through_ftq(tc, sdk_data, 1)
    saved = tc.save_weights_for_sampler("bench-engine").result()
    sampler = sc.create_sampling_client(model_path=saved.path).result()
    checkpoints = Path(dep.data_dir) / "tinker" / "checkpoints"
    (folder,) = checkpoints.glob("tc_*/sampler_weights/bench-engine")
    prompt = tc.get_tokenizer().encode("alice has")
    started = time.perf_counter()
    sample_ftq(sampler, prompt, args.samples, args.tokens)  # cold: ftq starts its engine
    log(f"ftq: first sample on the engine (its start included) {time.perf_counter() - started:.1f} s")
    sample_ftq(sampler, prompt, args.samples, args.tokens)  # warm
    rates: dict[str, list[float]] = {"ftq": [], "direct": []}
    for _ in range(args.rounds):
        rates["ftq"].append(sample_ftq(sampler, prompt, args.samples, args.tokens))
    log(f"engine sampling through ftq: {', '.join(f'{x:.0f}' for x in rates['ftq'])} tok/s")
    # ftq's engine stops (DELETE /deployments/{id}) before the bare one starts.
    auth = {"Authorization": f"Bearer {KEY}"}
    (engine,) = dep.http.get("/deployments", headers=auth).json()["data"]
    dep.http.delete(f"/deployments/{engine['id']}", headers=auth)
    deadline = time.monotonic() + 120
    while dep.http.get("/deployments", headers=auth).json()["data"][0]["status"] != "stopped":
        assert time.monotonic() < deadline, "ftq's engine did not stop"
        time.sleep(0.5)
    model = (EXAMPLES / "tiny" / "model-serve").resolve()
    bare = LocalEngine(
        EngineConfig(model=model, name="ftq-tiny-serve", max_lora_rank=64, max_model_len=2048),
        log_path=root / "vllm-direct.log",
        die_with_parent=True,
    )
    bare.start()
    try:
        bare.wait_ready(timeout=600)
        bare.load_adapter("bench-engine", folder)
        for _ in range(2):  # warm, as ftq's
            sample_direct(bare, "bench-engine", prompt, args.samples, args.tokens)
        for _ in range(args.rounds):
            rates["direct"].append(sample_direct(bare, "bench-engine", prompt, args.samples, args.tokens))
        log(f"engine sampling direct: {', '.join(f'{x:.0f}' for x in rates['direct'])} tok/s")
    finally:
        bare.close()
    figures: dict[str, Any] = {side: statistics.median(v) for side, v in rates.items()}
    figures["ratios"] = (
        ",".join(f"{x:.0f}" for x in rates["ftq"]) + "/" + ",".join(f"{x:.0f}" for x in rates["direct"])
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="round trips a side, each round")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens a sample")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="2 round trips, 2 samples of 4 tokens, 1 round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.samples, args.tokens, args.rounds = 2, 2, 4, 1
    os.environ["TINKER_TELEMETRY"] = "0"

    import tinker
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.tinker_host import Host

    tiny_assets()
    base = (EXAMPLES / "tiny" / "model").resolve()
    # ftq's host gets one thread (the CPU slot's share of the cores under QUICK_SETTINGS' 4 slots): so does
    # this process.
    torch.set_num_threads(1)
    root = scratch("tinker-")
    with Deployment(root / "ftq", mode="up", tokens={"bench": KEY}, settings=QUICK_SETTINGS) as dep:
        sc = tinker.ServiceClient(base_url=dep.url, api_key=KEY)
        started = time.perf_counter()
        tc = sc.create_lora_training_client(base_model=BASE, rank=RANK, seed=0).result()
        log(f"ftq: training client up in {time.perf_counter() - started:.1f} s (queued, launched, loaded)")
        tokenizer = tc.get_tokenizer()
        sdk_data, host_data = batch(tokenizer)
        config = {"base": BASE, "base_folder": str(base), "lora": {"rank": RANK, "seed": 0}}
        local = Host(config)
        through_ftq(tc, sdk_data, 2)  # warm both sides: the first calls allocate Adam's state
        in_process(local, host_data, 2)
        trips: dict[str, list[float]] = {"ftq": [], "in_process": []}
        for r in range(args.rounds):
            for side in ("ftq", "in_process") if r % 2 == 0 else ("in_process", "ftq"):
                got = (
                    through_ftq(tc, sdk_data, args.steps)
                    if side == "ftq"
                    else in_process(local, host_data, args.steps)
                )
                trips[side] += got
                log(f"round {r + 1}: {side} median round trip {statistics.median(got) * 1000:.1f} ms")

        saved = tc.save_weights_for_sampler("bench").result()
        sampler = sc.create_sampling_client(model_path=saved.path).result()
        folder = Path(dep.data_dir) / "tinker" / "checkpoints" / "tc_1" / "sampler_weights" / "bench"
        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), str(folder)
        ).eval()
        prompt = tokenizer.encode("alice has")
        sample_ftq(sampler, prompt, args.samples, args.tokens)  # warm
        sample_hf(model, prompt, args.samples, args.tokens)
        rates: dict[str, list[float]] = {"ftq": [], "hf": []}
        for r in range(args.rounds):
            for side in ("ftq", "hf") if r % 2 == 0 else ("hf", "ftq"):
                fn = sample_ftq if side == "ftq" else sample_hf
                rates[side].append(fn(sampler if side == "ftq" else model, prompt, args.samples, args.tokens))
                log(f"round {r + 1}: sampling {side} {rates[side][-1]:.0f} tok/s")
        engines = None if args.smoke else on_engines(sc, dep, root, args)
        sc.close("success").result()

    ftq_s, local_s = statistics.median(trips["ftq"]), statistics.median(trips["in_process"])
    common = {"steps": args.steps * args.rounds, "rank": RANK}
    result("tinker_step_in_process", local_s * 1000, "ms", **common)
    result("tinker_step_ftq", ftq_s * 1000, "ms", baseline="tinker_step_in_process", **common)
    result("tinker_overhead_per_call", (ftq_s - local_s) / 2 * 1000, "ms")
    hf, ftq = statistics.median(rates["hf"]), statistics.median(rates["ftq"])
    shape = {"samples": args.samples, "tokens": args.tokens}
    result("tinker_sample_hf_generate", hf, "tok/s", **shape)
    result("tinker_sample_ftq", ftq, "tok/s", baseline="tinker_sample_hf_generate", **shape)
    if engines is not None:
        result("tinker_sample_engine_direct", engines["direct"], "tok/s", **shape)
        result(
            "tinker_sample_ftq_engine",
            engines["ftq"],
            "tok/s",
            baseline="tinker_sample_engine_direct",
            tok_s=engines["ratios"],
            **shape,
        )
        note(
            f"tinker engine sampling: {args.samples} samples of exactly {args.tokens} new tokens from "
            "sampler weights on ftq-tiny-serve (2 layers, hidden 128, head_dim 64; rank 8, "
            "train_unembed=False), through ftq (the SDK's future, the API's sample on the owner's vLLM "
            "engine with the sampler folder as its adapter) against a bare vLLM engine (the same model "
            "folder and arguments, the same adapter folder) called on its /v1/completions with the same "
            "token ids; both warm, one engine alive at a time (ftq's stopped through DELETE /deployments "
            "before the bare one starts: two on two cores contend, and alternated the ratio swung from 0.24x "
            "to 3.1x between runs), medians of the calls (tok_s: each call's, ftq's/direct's)"
        )
    note(
        f"tinker: a forward_backward (cross_entropy, {len(TEXTS)} texts of about 12 tokens) + optim_step "
        f"(AdamW) round trip on a rank-{RANK} LoRA of the tiny model (2 layers, hidden 64, float32), through "
        "`ftq up` with the official tinker SDK 0.38 (futures, the API's per-model queue, the training "
        "client's own process on one CPU thread) against the same PEFT step in this process on one thread; "
        f"medians of {args.rounds} alternated rounds of {args.steps}. The overhead per call is half the "
        "difference (two calls a round trip): the model is tiny, so that overhead is as large a share as it "
        "gets"
    )
    note(
        f"tinker sampling: {args.samples} samples of exactly {args.tokens} new tokens (no stop) from the "
        "saved sampler weights on ftq-tiny, which the engine cannot serve (head_dim 16), so through ftq in "
        "the training client's process (a forward pass per token with the KV cache) against Hugging Face "
        "generate in this process on the same adapter folder; medians of the rounds"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
