"""The estimate's loss head against a real process: TRL's fused LM head (what SFTTrainer trains with)
never holds the (tokens, vocab) logits, so its peak does not grow with the tokens, as transformers'
own loss does; and the estimate's figure for it matches the measured peak RSS of a CPU step."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from ftq.planning.estimate import estimate_memory
from tests.harness import LEAN_PRELUDE, REPO

pytestmark = pytest.mark.slow

# A quarter of Llama 2's 32,000: each pass's logits (4096 x 8000 x 4 bytes, 131 MB) stay far above the
# allocator's noise, and the passes move a quarter of the memory (at 32,000 this process took 44 to 80
# CPU-s under the suite's load). The same things hold: the fused head's peak flat in the tokens, the
# estimate within 5% of it, the plain loss at 4x one logits tensor.
VOCAB = 8000
CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
}  # fmt: skip

# Forward and backward passes of a 1-layer Llama in float32 on CPU, in one process (its imports are most
# of the time): for each (head, tokens) of argv, how far the pass raised VmHWM. Writing 5 to clear_refs
# resets VmHWM to the current RSS, so each pass is measured from where the last one left the process.
STEP = (
    LEAN_PRELUDE
    + """
import gc, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import add_fused_lm_head

def hwm():
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) * 1024

config = {config!r}
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**{{k: v for k, v in config.items() if k != "model_type"}}))
# As SFTTrainer patches it; a call without fused_lm_head=True still runs transformers' own loss.
add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
for run in sys.argv[1:]:
    head, tokens = run.split(":")
    fused = head == "fused"
    ids = torch.randint(0, config["vocab_size"], (1, int(tokens)))
    model.zero_grad(set_to_none=True)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = hwm()
    out = model(input_ids=ids, labels=ids, fused_lm_head=True) if fused else model(input_ids=ids, labels=ids)
    out.loss.backward()
    print(head, tokens, hwm() - before, flush=True)
    del out
"""
)


def peaks(*runs: tuple[str, int]) -> dict[tuple[str, int], int]:
    """The peak growth of each (head, tokens) pass, in one process."""
    code = STEP.format(config=CONFIG)
    proc = subprocess.run(
        [sys.executable, "-c", code, *(f"{head}:{tokens}" for head, tokens in runs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {}
    for line in proc.stdout.splitlines():
        head, tokens, grew = line.split()
        found[(head, int(tokens))] = int(grew)
    return found


def estimated(tokens: int) -> int:
    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": "./m"},
            "dataset": {"name_or_path": "./d.jsonl"},
            "training": {"max_steps": 1, "max_seq_len": tokens, "mixed_precision": "no"},
            "lora": {"r": 8},
            "resources": {"device": "cpu"},
        }
    )
    return estimate_memory(spec, CONFIG, device_memory_bytes=2**40).breakdown["logits"]


def test_the_fused_head_does_not_grow_with_tokens_and_the_estimate_matches_it() -> None:
    measured = peaks(("fused", 4096), ("fused", 8192), ("plain", 4096))
    fused_4k, fused_8k, plain_4k = measured["fused", 4096], measured["fused", 8192], measured["plain", 4096]
    # transformers' own loss holds the logits, their log-softmax and gradient: ~16 bytes per entry.
    assert plain_4k > 3 * 4096 * VOCAB * 4
    # The fused head works in 4096-token tiles: twice the tokens, about the same peak.
    assert fused_8k < 1.2 * fused_4k
    for tokens, grew in ((4096, fused_4k), (8192, fused_8k)):
        assert 0.75 * grew <= estimated(tokens) <= 1.25 * grew, (tokens, grew, estimated(tokens))
