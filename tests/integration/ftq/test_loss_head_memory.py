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
from tests.harness import REPO

pytestmark = pytest.mark.slow

VOCAB = 32000
CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
}  # fmt: skip

# One forward and backward of a 1-layer Llama in float32 on CPU; prints how far it raised VmHWM.
STEP = """
import sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import add_fused_lm_head

def hwm():
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) * 1024

config = {config!r}
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**{{k: v for k, v in config.items() if k != "model_type"}}))
fused = sys.argv[1] == "fused"
if fused:
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer patches it
ids = torch.randint(0, config["vocab_size"], (1, int(sys.argv[2])))
Path("/proc/self/clear_refs").write_text("5")
before = hwm()
out = model(input_ids=ids, labels=ids, fused_lm_head=True) if fused else model(input_ids=ids, labels=ids)
out.loss.backward()
print(hwm() - before)
"""


def peak(head: str, tokens: int) -> int:
    code = STEP.format(config=CONFIG)
    proc = subprocess.run(
        [sys.executable, "-c", code, head, str(tokens)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.split()[-1])


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
    fused_4k, fused_16k = peak("fused", 4096), peak("fused", 16384)
    plain_4k = peak("plain", 4096)
    # transformers' own loss holds the logits, their log-softmax and gradient: ~16 bytes per entry.
    assert plain_4k > 3 * 4096 * VOCAB * 4
    # The fused head works in 4096-token tiles: four times the tokens, about the same peak.
    assert fused_16k < 1.2 * fused_4k
    for tokens, measured in ((4096, fused_4k), (16384, fused_16k)):
        assert 0.75 * measured <= estimated(tokens) <= 1.25 * measured, (tokens, measured, estimated(tokens))
