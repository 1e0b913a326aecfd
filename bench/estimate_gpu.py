"""How close is the preflight estimate (worker/estimate.py) to what a GPU really allocates?

On one CUDA GPU, for a ~1B Llama (random weights from a config: no hub needed), trains a few steps of
each setup the way the trainer does (bf16, sequence 2048, batch 1, AdamW; LoRA on all linear layers or
full fine-tuning; with and without gradient checkpointing) and compares the estimate with
`torch.cuda.max_memory_allocated()`. Prints a table and exits 1 when an error exceeds the target.

    python -m bench.estimate_gpu [--steps 3] [--seq 2048] [--target 0.15] [--json out.json]

Without a CUDA device it says so and exits 0 (nothing to measure); `--require-gpu` makes that exit 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from ftq.contract.spec import JobSpec
from ftq.planning.estimate import estimate_memory

GiB = 1024**3

# Llama-3.2-1B's shapes (1.24B parameters, tied embeddings).
LLAMA_1B: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}  # fmt: skip

SETUPS = [
    ("lora, checkpointing", True, True),
    ("lora, no checkpointing", True, False),
    ("full, checkpointing", False, True),
    ("full, no checkpointing", False, False),
]


def job_spec(lora: bool, checkpointing: bool, seq: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "bench/llama-1b", "attn_implementation": "sdpa"},
            "dataset": {"name_or_path": "bench/none"},
            "training": {
                "max_seq_len": seq,
                "max_steps": 10,
                "per_device_train_batch_size": 1,
                "gradient_checkpointing": checkpointing,
                "mixed_precision": "bf16",
            },
            "lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"} if lora else None,
            "distributed": {"strategy": "none"},
            "resources": {"launcher": "local", "device": "cuda", "processes_per_node": 1},
        }
    )


def measure(lora: bool, checkpointing: bool, seq: int, steps: int) -> dict[str, float]:
    """Peak allocated and reserved bytes over `steps` optimizer steps, set up as trainer/ does."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    config = LlamaConfig(**{k: v for k, v in LLAMA_1B.items() if k not in ("model_type", "architectures")})
    # trainer.model.load_dtype: LoRA loads the frozen base in bf16; full fine-tuning keeps fp32 master
    # weights and computes under bf16 autocast.
    dtype = torch.bfloat16 if lora else torch.float32
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        if checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
            ),
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True)
    model.train()
    started = time.time()
    for _ in range(steps):
        ids = torch.randint(3, LLAMA_1B["vocab_size"], (1, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    out = {
        "allocated": float(torch.cuda.max_memory_allocated() - base),
        "reserved": float(torch.cuda.max_memory_reserved()),
        "seconds": time.time() - started,
    }
    del model, optimizer, params, loss
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--target", type=float, default=0.15, help="largest acceptable relative error")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--require-gpu", action="store_true", help="exit 2 (not 0) when there is no CUDA GPU")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("estimate_gpu: torch is not installed; nothing to measure", file=sys.stderr)
        return 2 if args.require_gpu else 0
    if not torch.cuda.is_available():
        print(
            "estimate_gpu: no CUDA GPU on this machine; run it where there is one (bench/gpu.sh)",
            file=sys.stderr,
        )
        return 2 if args.require_gpu else 0

    device = torch.cuda.get_device_properties(0)
    print(
        f"GPU: {device.name}, {device.total_memory / GiB:.1f} GiB; torch {torch.__version__}; "
        f"Llama 1.24B (random weights), seq {args.seq}, batch 1, bf16, {args.steps} steps\n"
    )
    rows = []
    header = f"{'setup':<26} {'estimate':>10} {'est-ctx':>10} {'allocated':>10} {'reserved':>10} {'error':>8}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for label, lora, ckpt in SETUPS:
        spec = job_spec(lora, ckpt, args.seq)
        est = estimate_memory(spec, LLAMA_1B, device_memory_bytes=device.total_memory)
        # max_memory_allocated counts what torch's allocator handed out: not the CUDA context.
        assert est.per_device_bytes is not None, est.reason
        est_alloc = est.per_device_bytes - est.breakdown["cuda_context"]
        got = measure(lora, ckpt, args.seq, args.steps)
        err = (est_alloc - got["allocated"]) / got["allocated"]
        worst = max(worst, abs(err))
        rows.append(
            {
                "setup": label,
                "estimate_bytes": est.per_device_bytes,
                "estimate_alloc_bytes": est_alloc,
                "allocated_bytes": got["allocated"],
                "reserved_bytes": got["reserved"],
                "error": err,
                "breakdown": est.breakdown,
                "seconds": got["seconds"],
            }
        )
        print(
            f"{label:<26} {est.per_device_bytes / GiB:>9.2f}G {est_alloc / GiB:>9.2f}G "
            f"{got['allocated'] / GiB:>9.2f}G {got['reserved'] / GiB:>9.2f}G {err:>+7.1%}"
        )
    print(
        f"\nlargest error {worst:.1%} (target {args.target:.0%}); error = (estimate without the CUDA "
        "context - max_memory_allocated) / max_memory_allocated"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if worst <= args.target else 1


if __name__ == "__main__":
    raise SystemExit(main())
