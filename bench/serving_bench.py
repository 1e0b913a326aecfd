"""Serving through ftq against vLLM directly (issue 49): the serving proxy's cost. One `ftq up` (API, worker
and scheduler; SQLite, its own broker) serves the catalog's `ftq-tiny-serve` base through
`/v1/chat/completions` (bearer token, owner checks, the engine it starts on the first call); beside it a
bare engine (ftq.engine.LocalEngine: the same `vllm` server from .venv-vllm, the same model folder
examples/tiny/model-serve, the same arguments ftq gives its engines) is called on its own /v1. Each round
sends bursts of N concurrent greedy chat completions of at most `--max-tokens` tokens for `--seconds` to
one, then to the other (the order swapped every round), both engines warm; the figures are the medians
over the rounds of tokens/s (completion tokens over the wall time of the bursts) and of the median request
latency, and their ratios ftq / direct. Both give the same greedy answers (checked: the same completion
tokens a burst, the same texts).

    python -m bench.serving_bench [--concurrency 8] [--max-tokens 32] [--rounds 3] [--seconds 8] [--smoke]

--smoke: 2 requests of 4 tokens, one burst a side (both engines still start: about a minute on 2 cores).
Everything goes through HTTP: ftq's API is called as a client would; its engine is never reached
directly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import log, note, result, scratch
from tests.harness import EXAMPLES, QUICK_SETTINGS, Deployment, tiny_assets

MODEL = "ftq-tiny-serve"  # the built-in catalog's serving base (service/openai/models.py)
TOKEN = "tok-bench-serve"


def serve_model() -> Path:
    """The catalog's ftq-tiny-serve folder (examples/tiny/model-serve: head_dim 64, which vLLM's CPU
    attention takes), built by `make install` or here."""
    tiny_assets()
    model = (EXAMPLES / "tiny" / "model-serve").resolve()
    assert json.loads((model / "config.json").read_text())["head_dim"] == 64, model
    return model


def prompts(n: int) -> list[str]:
    subjects = ["three", "an animal", "carol", "the sea", "a tree", "bob", "seven", "a house"]
    return [f"describe {subjects[i % len(subjects)]}, number {i}." for i in range(n)]


class Target:
    """One side: an OpenAI-compatible /v1 (ftq's, or the bare engine's) and what its calls carry."""

    def __init__(self, name: str, base_url: str, headers: dict[str, str], model: str, concurrency: int):
        self.name = name
        self.model = model
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=900, limits=limits)

    def chat(self, prompt: str, max_tokens: int) -> tuple[float, int, str]:
        """(seconds, completion tokens, text) of one greedy chat completion."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        started = time.perf_counter()
        r = self.http.post("/chat/completions", json=body)
        took = time.perf_counter() - started
        assert r.status_code == 200, (self.name, r.status_code, r.text[:500])
        data = r.json()
        return took, int(data["usage"]["completion_tokens"]), str(data["choices"][0]["message"]["content"])

    def bursts(self, batch: list[str], max_tokens: int, seconds: float) -> dict[str, Any]:
        """The requests of `batch` at once, again and again until `seconds` have passed (once at least):
        tokens/s over the wall time of them all, their median latency, the first burst's answers."""
        latencies: list[float] = []
        tokens, bursts = 0, 0
        answers: list[str] = []
        with ThreadPoolExecutor(len(batch)) as pool:
            started = time.perf_counter()
            while not bursts or time.perf_counter() - started < seconds:
                done = list(pool.map(lambda p: self.chat(p, max_tokens), batch))
                latencies += [d[0] for d in done]
                tokens += sum(d[1] for d in done)
                answers = answers or [d[2] for d in done]
                bursts += 1
            wall = time.perf_counter() - started
        return {
            "tokens_s": tokens / wall,
            "p50_s": statistics.median(latencies),
            "tokens": tokens // bursts,
            "answers": answers,
            "bursts": bursts,
            "wall_s": wall,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="of bursts a side, each round")
    parser.add_argument("--smoke", action="store_true", help="2 requests of 4 tokens, one burst a side")
    args = parser.parse_args(argv)
    if args.smoke:
        args.concurrency, args.max_tokens, args.rounds, args.seconds = 2, 4, 1, 0.0

    from ftq.engine import EngineConfig, LocalEngine

    model = serve_model()
    root = scratch("serving-")
    batch = prompts(args.concurrency)
    # ftq's engines: EngineConfig's defaults with the API's FTQ_SERVE_MAX_LORA_RANK (64) and the base's
    # max_model_len (FTQ_SERVE_MAX_MODEL_LEN, 2048, under the model's 4096): the same arguments here.
    bare = LocalEngine(
        EngineConfig(model=model, name=MODEL, max_lora_rank=64, max_model_len=2048),
        log_path=root / "vllm-direct.log",
        die_with_parent=True,
    )
    with Deployment(root / "ftq", mode="up", tokens={"bench": TOKEN}, settings=QUICK_SETTINGS) as dep:
        bare.start()  # both engines start at once: the bare one here, ftq's on its first call
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            ftq = Target("ftq", f"{dep.url}/v1", auth, MODEL, args.concurrency)
            started = time.monotonic()
            ftq.chat(batch[0], args.max_tokens)  # cold: ftq starts its engine and waits for it
            log(f"ftq: first call (engine start included) {time.monotonic() - started:.1f} s")
            bare.wait_ready(timeout=600)
            direct = Target("direct", bare.base_url, bare.headers, bare.model, args.concurrency)
            for side in (direct, ftq):  # warm both: a burst each before any is timed
                side.bursts(batch, args.max_tokens, 0.0)
            figures: dict[str, list[dict[str, Any]]] = {"direct": [], "ftq": []}
            for r in range(args.rounds):
                for side in (direct, ftq) if r % 2 == 0 else (ftq, direct):
                    got = side.bursts(batch, args.max_tokens, args.seconds)
                    figures[side.name].append(got)
                    log(
                        f"round {r + 1}: {side.name} {got['bursts']} bursts of {got['tokens']} tokens in "
                        f"{got['wall_s']:.2f} s, {got['tokens_s']:.1f} tok/s, "
                        f"p50 {got['p50_s'] * 1000:.0f} ms"
                    )
            deployments = dep.http.get("/deployments", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        finally:
            bare.close()
    # The same greedy work on both sides: the same answers, token for token.
    for a, b in zip(figures["direct"], figures["ftq"], strict=True):
        assert a["tokens"] == b["tokens"] and a["answers"] == b["answers"], (a["answers"], b["answers"])
    assert [d["base"] for d in deployments["data"]] == [MODEL], deployments

    def med(side: str, key: str) -> float:
        return float(statistics.median(f[key] for f in figures[side]))

    tokens = figures["ftq"][0]["tokens"]
    ratios = [f["tokens_s"] / d["tokens_s"] for f, d in zip(figures["ftq"], figures["direct"], strict=True)]
    common = {"requests": args.concurrency, "max_tokens": args.max_tokens, "tokens_a_burst": tokens}
    result("serving_direct_tokens_per_s", med("direct", "tokens_s"), "tok/s", **common)
    result(
        "serving_ftq_tokens_per_s",
        med("ftq", "tokens_s"),
        "tok/s",
        baseline="serving_direct_tokens_per_s",
        rounds=",".join(f"{x:.2f}" for x in ratios),
        **common,
    )
    result("serving_direct_p50_latency", med("direct", "p50_s") * 1000, "ms")
    result("serving_ftq_p50_latency", med("ftq", "p50_s") * 1000, "ms", baseline="serving_direct_p50_latency")
    note(
        f"serving: {args.concurrency} concurrent greedy chat completions of at most {args.max_tokens} tokens "
        f"({tokens} completion tokens a burst, the same answers on both sides) through `ftq up`'s "
        f"/v1/chat/completions on {MODEL} (bearer token; the engine ftq started) against a bare vLLM "
        "engine on the same model folder and arguments (ftq.engine.LocalEngine, float32, CPU), both warm, "
        f"alternated, medians of {args.rounds} rounds of {args.seconds:g} s of bursts a side (the next burst "
        "sent when the last request of one has answered); tokens/s is completion tokens over the wall time, "
        "latency the median request. The model is tiny (2 layers, hidden 128), so the "
        "engine's own work is small and the proxy's share is as large as it gets"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
