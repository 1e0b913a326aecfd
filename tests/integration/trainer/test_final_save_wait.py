"""While rank 0 writes `final/`, the other ranks wait longer than the process group's timeout allows.

A 70B full fine-tune's final save writes hundreds of GB from rank 0; the other ranks used to wait in
a barrier bound by the collective timeout, which kills the job just as it finishes. Here the group's
timeout is 3 s and rank 0's write takes 8 s (a slow tokenizer write stands for a slow filesystem).
The wait's gloo group is the one made at start (`open_save_group`, issue 27), not one made at the end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import LEAN_PRELUDE, REPO, free_port
from tests.integration.trainer.helpers import trainer_env

pytestmark = pytest.mark.slow

SCRIPT = (
    LEAN_PRELUDE
    + """\
import datetime, sys, time
from pathlib import Path
from types import SimpleNamespace

from accelerate import Accelerator, PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer

import torch.distributed as dist

from trainer.train import open_save_group, save_final

# Two CPU processes over gloo, as `accelerate launch` with use_cpu sets them up, with a short timeout.
state = PartialState(cpu=True, timeout=datetime.timedelta(seconds=3))
assert state.num_processes == 2 and state.distributed_type == "MULTI_CPU", state
# The save's gloo group is made and checked at start, as the trainer does before loading the model
# (a wrong GLOO_SOCKET_IFNAME fails here); the save must use it, never make a group at the end.
group = open_save_group()
assert group is not None and open_save_group() is group


def no_new_group(*args, **kwargs):
    raise AssertionError("the final save made a new process group instead of the one made at start")


dist.new_group = no_new_group
tiny, final = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(tiny)


class SlowFilesystem:
    def save_pretrained(self, folder):
        time.sleep(8)
        tokenizer.save_pretrained(folder)


model = AutoModelForCausalLM.from_pretrained(tiny)
trainer = SimpleNamespace(accelerator=Accelerator(cpu=True), model=model, model_wrapped=model)
save_final(trainer, final, SlowFilesystem(), "ddp")
# Past the wait, every rank can rely on final/ being complete (the next step may read it).
assert (final / "tokenizer.json").is_file() and (final / "model.safetensors").is_file()
print("rank done", flush=True)
"""
)


def test_other_ranks_outwait_the_collective_timeout_while_rank_0_writes(
    tiny_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "save.py"
    script.write_text(SCRIPT)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), str(script)]
    proc = subprocess.run(
        [*cmd, str(tiny_dir / "model"), str(tmp_path / "final")],
        cwd=REPO,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("rank done") == 2
