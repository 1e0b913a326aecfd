"""An lm_eval suite on lm-eval's vLLM backend (trainer.evaluate.lm_eval_backend: lm-eval's `vllm` model type
in a child on .venv-vllm's interpreter, the task folder's child in the sandbox) scores what the HF backend
scores: on the local task of examples/evaluation and a wider one beside it, in float32, with an adapter
trained briefly on the serve-able tiny model (examples/tiny/model-serve: vLLM's CPU attention needs a
head_dim of 32 or more), whose accuracy is far from the base model's, so that the same figures mean vLLM
served the adapter, not the base.

Needs .venv-vllm with lm-eval (`make vllm`, which `make test` builds): without it the evaluation runs on
HF, and the test fails naming why rather than skipping."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.evaluation import LmEvalSuite
from ftq.contract.spec import JobSpec
from tests.harness import REPO, tiny_assets
from trainer import evaluate
from trainer.evaluate import EvaluationArgs, LmEvalBackend, lm_eval_backend

pytestmark = pytest.mark.slow

TASKS = REPO / "examples" / "evaluation" / "tasks"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
COLORS = ["black", "blue", "white", "green"]
ANIMALS = ["dog", "cat", "horse", "bird", "fish", "fox"]
VERBS = ["sees", "follows", "finds", "chases"]


def _wide_rows(n: int = 32) -> list[dict[str, Any]]:
    """Three-way questions in the tiny data's words, each question once, the answer at a random place."""
    rng = random.Random(7)
    questions = [f"the {c} {a} {v} the" for c in COLORS for a in ANIMALS for v in VERBS]
    rows = []
    for question in rng.sample(questions, n):
        choices = [f" {a}" for a in rng.sample(ANIMALS, 3)]
        rows.append({"question": question, "choices": choices, "answer": rng.randrange(3)})
    return rows


def _task_folder(root: Path) -> Path:
    """examples/evaluation/tasks as shipped, and tiny_mc_wide: the same task on 32 rows, also scored by
    acc_norm."""
    folder = root / "tasks"
    shutil.copytree(TASKS, folder)
    (folder / "tiny_mc_wide.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _wide_rows()))
    yaml = (TASKS / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: tiny_mc_wide")
    yaml = yaml.replace("test: tiny_mc.jsonl", "test: tiny_mc_wide.jsonl")
    yaml += "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
    (folder / "tiny_mc_wide.yaml").write_text(yaml)
    return folder


def _train_adapter(base: Path, rows: list[dict[str, Any]], out: Path) -> None:
    """A LoRA adapter trained for a few dozen steps to put each row's answer first, saved as PEFT saves it
    (what a LoRA job's final/ holds)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), config)
    # One padded batch of every row a step (right-padded, the pads out of the loss and the attention).
    seqs, targets = [], []
    for row in rows:
        context = tokenizer(row["question"])["input_ids"]
        whole = tokenizer(row["question"] + row["choices"][row["answer"]])["input_ids"]
        seqs.append(whole)
        targets.append([-100] * len(context) + whole[len(context) :])
    width = max(len(x) for x in seqs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([x + [pad] * (width - len(x)) for x in seqs])
    labels = torch.tensor([y + [-100] * (width - len(y)) for y in targets])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(30):
        optimizer.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
    model.save_pretrained(str(out))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA job's run directory as the worker leaves it for an evaluation: spec.json and final/."""
    root = tmp_path_factory.mktemp("lm-eval-vllm")
    serve = (tiny_assets() / "model-serve").resolve()
    tasks = _task_folder(root)
    run = root / "run"
    _train_adapter(serve, _wide_rows(), run / "final")
    spec = {
        "name": "t",
        "model": {"name_or_path": str(serve)},
        "dataset": {"name_or_path": str(REPO / "examples/tiny/data/train.jsonl"), "format": "text"},
        "training": {"max_steps": 1},
        "resources": {"device": "cpu"},
        "lora": {"r": 8, "target_modules": TARGETS},
        "eval": {
            "suites": [
                {
                    "name": "bench",
                    "type": "lm_eval",
                    "tasks": ["tiny_mc", "tiny_mc_wide"],
                    "task_dir": str(tasks),
                }
            ]
        },
    }
    (run / "spec.json").write_text(json.dumps(spec))
    return run


def _evaluate(run: Path, name: str) -> dict[str, Any]:
    out = run / "evaluations" / name
    return evaluate.evaluate(EvaluationArgs(name, "job_t", run, out, None))


def test_vllm_scores_the_local_task_as_hf_does(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_vllm = _evaluate(run_dir, "vllm")
    detail = on_vllm["suites"]["bench"]
    assert detail["backend"] == "vllm", detail["backend_reason"]  # e.g. no .venv-vllm: `make vllm`
    with monkeypatch.context() as m:  # the same evaluation with the choice made for HF
        m.setattr(evaluate, "lm_eval_backend", lambda *_: LmEvalBackend("hf", "the test's baseline"))
        on_hf = _evaluate(run_dir, "hf")
    assert on_hf["suites"]["bench"]["backend"] == "hf"
    print(f"\nvLLM: {on_vllm['metrics']}\nHF:   {on_hf['metrics']}")
    assert set(on_vllm["metrics"]) == {
        f"bench/{task}/{metric}"
        for task, metrics in {
            "tiny_mc": ["acc", "sample_len"],
            "tiny_mc_wide": ["acc", "acc_norm", "sample_len"],
        }.items()
        for metric in metrics
    }
    assert on_vllm["metrics"] == on_hf["metrics"]

    # The comparison means something: the trained adapter answers the wide task far better than its base,
    # so scoring the base alone would not have matched.
    spec = JobSpec.model_validate(json.loads((run_dir / "spec.json").read_text()))
    suite = spec.eval.suites[0]
    assert isinstance(suite, LmEvalSuite)
    base = evaluate.load_checkpoint(spec.model_copy(update={"lora": None}), Path(spec.model.name_or_path))
    base_metrics, _ = evaluate.run_lm_eval(suite, *base)
    print(f"base: {base_metrics}")
    assert base_metrics["bench/tiny_mc_wide/acc"] <= on_vllm["metrics"]["bench/tiny_mc_wide/acc"] - 0.3


def test_the_backend_is_vllm_only_for_what_it_can_serve(run_dir: Path, tmp_path: Path) -> None:
    spec = JobSpec.model_validate(json.loads((run_dir / "spec.json").read_text()))
    chosen = lm_eval_backend(spec, run_dir / "final")
    assert chosen.name == "vllm", chosen.reason
    assert chosen.lm["dtype"] == "float32"
    assert chosen.lm["lora_local_path"] == str((run_dir / "final").resolve())
    assert chosen.lm["max_lora_rank"] == 8

    # The tiny model's head_dim (16) is below what vLLM's CPU attention takes: HF, saying so.
    tiny = spec.model_copy(
        update={"model": spec.model.model_copy(update={"name_or_path": str(tiny_assets() / "model")})}
    )
    assert lm_eval_backend(tiny, run_dir / "final") == LmEvalBackend(
        "hf", "vLLM's CPU attention needs a head_dim of 32 or more; this model's is 16"
    )
    # An adapter trained over another one: vLLM serves one adapter at a time.
    stacked = spec.model_copy(
        update={"model": spec.model.model_copy(update={"adapter": str(run_dir / "final")})}
    )
    assert "model.adapter" in lm_eval_backend(stacked, run_dir / "final").reason
    # Sharded states (here, a folder with neither an adapter nor whole weights): only HF consolidates them.
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    assert lm_eval_backend(spec, tmp_path).name == "hf"
    # No vLLM venv at all.
    assert "make vllm" in _without_venv(spec, run_dir / "final", tmp_path).reason


def _without_venv(spec: JobSpec, folder: Path, tmp_path: Path) -> LmEvalBackend:
    with pytest.MonkeyPatch.context() as m:
        m.setenv("FTQ_VLLM_VENV", str(tmp_path / "no-venv"))
        return lm_eval_backend(spec, folder)
