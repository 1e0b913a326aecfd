"""GPU throughput of a ~1B Llama: flash attention against sdpa, packed against padded batches.

    python -m bench.gpu_bench --out DIR [--seq-len 4096] [--steps 10]   (bench/gpu.sh runs this)

A random-init model from a TinyLlama-1.1B-shaped config (no download), bf16, gradient checkpointing
(non-reentrant, as the trainer does), AdamW, one GPU. Each variant trains `--steps` measured steps after
3 warm-up steps on the same synthetic mixed-length sequences:
  packed   sequences laid end to end in one row per step, position_ids restarting per sequence
           (padding-free, as TRL's `bfd` packing feeds the model)
  padded   the same sequences as a batch padded to its longest row, with an attention mask
Reported per variant: non-padding tokens/s, model FLOPs utilisation (PaLM formula, 6N + 12*L*d*len
per token over the GPU's dense bf16 peak) and peak memory (torch.cuda.max_memory_allocated).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

# Dense bf16 peak (TFLOP/s) by device name fragment; the first match wins.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}
ONE_B = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
}


def no_gpu_exit() -> None:
    print(
        "gpu_bench: no CUDA GPU visible to torch (torch.cuda.is_available() is False); "
        "this benchmark needs a GPU machine, nothing was measured",
        file=sys.stderr,
    )
    raise SystemExit(3)


def sequence_lengths(total_tokens: int, seq_len: int, rng: random.Random) -> list[int]:
    """Mixed lengths, mostly short with a long tail (as SFT data is), summing to at most total_tokens."""
    lengths: list[int] = []
    while True:
        n = max(32, min(seq_len, int(rng.lognormvariate(6.0, 0.9))))
        if sum(lengths) + n > total_tokens:
            return lengths
        lengths.append(n)


def batches(lengths: list[int], packed: bool, vocab: int, device: Any) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, vocab, (n,), generator=gen) for n in lengths]
    if packed:
        ids = torch.cat(seqs).unsqueeze(0)
        pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        return {"input_ids": ids.to(device), "position_ids": pos.to(device), "labels": ids.to(device)}
    longest = max(lengths)
    ids = torch.zeros(len(seqs), longest, dtype=torch.long)
    mask = torch.zeros(len(seqs), longest, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def flops_per_step(n_params: int, cfg: dict[str, int], lengths: list[int]) -> float:
    """PaLM's model FLOPs: 6N per token plus 12*L*d*len per token for attention, per sequence."""
    d, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    return sum(6.0 * n_params * n + 12.0 * layers * d * n * n for n in lengths)


def run_variant(attn: str, packed: bool, seq_len: int, steps: int, tokens_per_step: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    cfg: dict[str, Any] = dict(ONE_B)
    config = LlamaConfig(**cfg, use_cache=False)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=attn)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    n_params = (
        sum(p.numel() for p in model.parameters()) - cfg["vocab_size"] * cfg["hidden_size"]
    )  # no embedding
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    rng = random.Random(0)
    plan = [sequence_lengths(tokens_per_step, seq_len, rng) for _ in range(steps + 3)]
    tokens = flops = 0.0
    started = 0.0
    for i, lengths in enumerate(plan):
        if i == 3:
            torch.cuda.synchronize()
            started = time.perf_counter()
        batch = batches(lengths, packed, cfg["vocab_size"], "cuda")
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 3:
            tokens += sum(lengths)
            flops += flops_per_step(n_params, cfg, lengths)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    result = {
        "attn": attn,
        "packing": "packed" if packed else "padded",
        "seq_len": seq_len,
        "tokens_per_second": tokens / elapsed,
        "mfu": (flops / elapsed) / (peak * 1e12) if peak else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "params_non_embedding": n_params,
        "steps": steps,
        "seconds": elapsed,
    }
    del model, opt
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens-per-step", type=int, default=16384)
    ns = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        no_gpu_exit()
    ns.out.mkdir(parents=True, exist_ok=True)
    attns = ["sdpa"]
    if importlib.util.find_spec("flash_attn") is not None:
        attns.insert(0, "flash_attention_2")
    else:
        print("gpu_bench: flash-attn is not installed; measuring sdpa only", file=sys.stderr)

    results = []
    for attn in attns:
        for packed in (True, False):
            try:
                r = run_variant(attn, packed, ns.seq_len, ns.steps, ns.tokens_per_step)
            except torch.cuda.OutOfMemoryError as err:
                r = {
                    "attn": attn,
                    "packing": "packed" if packed else "padded",
                    "error": f"out of memory: {err}",
                }
            results.append(r)
            print(json.dumps(r), flush=True)

    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "config": ONE_B,
        "seq_len": ns.seq_len,
        "tokens_per_step": ns.tokens_per_step,
    }
    (ns.out / "gpu_bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = ["| attn | batches | tokens/s | MFU | peak GiB |", "| --- | --- | ---: | ---: | ---: |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['attn']} | {r['packing']} | {r['error']} | | |")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        lines.append(
            f"| {r['attn']} | {r['packing']} | {r['tokens_per_second']:.0f} | {mfu} | "
            f"{r['peak_memory_gib']:.1f} |"
        )
    (ns.out / "gpu_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
