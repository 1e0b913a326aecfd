"""Exports end to end, through HTTP on a real `ftq up` with two owners (the bank's, tests/e2e/bank.py, with a
Hub token and a Hub endpoint where nothing listens): its tiny LoRA job (the rich job) and its full
fine-tune succeed, and the LoRA job's final/ carries a model card; a merged bf16 export runs as a launch of
its own, and the folder it writes loads with AutoModelForCausalLM and generates what base + adapter
generate; an adapter export loads with PEFT; the rules (409 for a job that has not succeeded and for
`adapter` of a full fine-tune, one export per identical request, 404 for another owner, 422 naming the
field); cancel of a running export; a push to an unreachable Hub fails fast with hub_error; the CLI's `ftq
export --follow` and `ftq exports`."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.bank import ALICE, BOB, BankedRun
from tests.harness import TINY, TINY_RELATIVE, Deployment, procs_with, run_ftq, tiny_spec, wait_until
from tests.harness.inprocess import MakeClient

pytestmark = pytest.mark.slow

TERMINAL = ("succeeded", "failed", "cancelled")
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def dep(bank_dep: Deployment) -> Deployment:
    """The bank's `ftq up`: tokens for alice and bob, a Hub token, a Hub endpoint where nothing listens."""
    return bank_dep


def alice(dep: Deployment) -> httpx.Client:
    return dep.client(ALICE)


def wait_export(
    dep: Deployment, job_id: str, export_id: str, pred: Any = None, timeout: float = 300
) -> dict[str, Any]:
    pred = pred or (lambda e: e["status"] in TERMINAL)
    deadline = time.monotonic() + timeout
    with alice(dep) as c:
        while time.monotonic() < deadline:
            r = c.get(f"/jobs/{job_id}/exports/{export_id}")
            assert r.status_code == 200, r.text
            export: dict[str, Any] = r.json()
            if pred(export):
                return export
            assert export["status"] not in TERMINAL, f"export ended without the condition: {export}"
            time.sleep(0.25)
    log = dep.run_dir(job_id) / "exports" / export_id / "train.log"
    raise AssertionError(
        f"export {export_id} not done in {timeout}s: {export}\n{log.read_text() if log.exists() else ''}"
    )


@pytest.fixture(scope="module")
def lora_job(rich_job: BankedRun) -> str:
    """A LoRA job of 4 steps on one process (the bank's rich job; it trained beside `full_job`)."""
    return rich_job.id


@pytest.fixture(scope="module")
def full_job(bank_full_job: BankedRun) -> str:
    """A full fine-tune of 2 steps (the bank's)."""
    return bank_full_job.id


@pytest.fixture(scope="module")
def merged(dep: Deployment, lora_job: str) -> dict[str, Any]:
    with alice(dep) as c:
        r = c.post(
            f"/jobs/{lora_job}/exports", json={"kind": "merged", "dtype": "bf16", "max_shard_size": "100KB"}
        )
    assert r.status_code == 202, r.text
    made: dict[str, Any] = r.json()
    assert made["status"] == "queued" and made["path"] == f"exports/{made['id']}"
    done = wait_export(dep, lora_job, made["id"])
    assert done["status"] == "succeeded", done
    return done


def greedy(model: Any, tokenizer: Any) -> list[int]:
    import torch

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return [int(t) for t in out[0, ids.shape[1] :]]


def test_final_has_a_model_card(dep: Deployment, lora_job: str) -> None:
    card = (dep.run_dir(lora_job) / "final" / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: peft" in card
    assert f"- ftq job: `{lora_job}`" in card
    assert "- Steps: 4" in card
    assert "- Compute: none: a CPU job (1 process)" in card
    assert "training rows" in card and "train.jsonl" in card
    assert "| learning_rate | 0.001 |" in card
    assert "- Final train loss: n/a" not in card


def download_tar(dep: Deployment, job_id: str, folder: str, into: Path) -> Path:
    """GET /jobs/{id}/artifacts/<folder>.tar, extracted into `into`: the folder that holds config.json."""
    with alice(dep) as c, c.stream("GET", f"/jobs/{job_id}/artifacts/{folder}.tar") as r:
        assert r.status_code == 200, r.read()
        with (into / "export.tar").open("wb") as f:
            for chunk in r.iter_bytes():
                f.write(chunk)
    with tarfile.open(into / "export.tar") as tar:
        tar.extractall(into / "x", filter="data")
    found = [p.parent for p in (into / "x").rglob("config.json")] or [
        p.parent for p in (into / "x").rglob("README.md")
    ]
    assert len(found) == 1, list((into / "x").rglob("*"))
    return found[0]


def test_merged_bf16_export_loads_and_generates_as_base_plus_adapter(
    dep: Deployment, lora_job: str, merged: dict[str, Any], tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Downloaded through the API as a tar, as a user gets it; the export's launch records are not in it.
    folder = download_tar(dep, lora_job, merged["path"], tmp_path)
    names = {p.name for p in folder.iterdir()}
    assert not names & {"export.json", "launch.sh", "launch.json", "exit_status", ".launch.lock"}, names
    assert {"config.json", "generation_config.json", "README.md", "tokenizer_config.json"} <= names
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert len(shards) > 1 and "model.safetensors.index.json" in names, names  # max_shard_size 100KB
    card = (folder / "README.md").read_text()
    assert "library_name: transformers" in card and f"`{merged['id']}` (merged, bf16)" in card

    exported = AutoModelForCausalLM.from_pretrained(str(folder))
    assert exported.dtype == torch.bfloat16
    assert not any("lora" in name for name, _ in exported.named_parameters())
    tokenizer = AutoTokenizer.from_pretrained(str(folder))

    base = AutoModelForCausalLM.from_pretrained(str(TINY / "model"), dtype=torch.bfloat16)
    base_tokens = greedy(base, tokenizer)
    with_adapter = PeftModel.from_pretrained(base, str(dep.run_dir(lora_job) / "final")).merge_and_unload()
    assert greedy(exported, tokenizer) == greedy(with_adapter, tokenizer)
    # The adapter is in the export: its weights differ from the base model's.
    base_again = AutoModelForCausalLM.from_pretrained(str(TINY / "model"), dtype=torch.bfloat16)
    differs = [n for n, p in exported.named_parameters() if not torch.equal(p, base_again.get_parameter(n))]
    assert differs, "the merged export holds the base model's weights unchanged"
    assert isinstance(base_tokens, list)


def test_adapter_export_loads_with_peft(dep: Deployment, lora_job: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with alice(dep) as c:
        r = c.post(f"/jobs/{lora_job}/exports", json={"kind": "adapter", "dtype": "fp16"})
    assert r.status_code == 202, r.text
    done = wait_export(dep, lora_job, r.json()["id"])
    assert done["status"] == "succeeded", done
    folder = dep.run_dir(lora_job) / done["path"]
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "README.md").is_file()
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(folder / "adapter_model.safetensors")).values()} == {torch.float16}
    base = AutoModelForCausalLM.from_pretrained(str(TINY / "model"))
    model = PeftModel.from_pretrained(base, str(folder))
    assert any("lora" in n for n, _ in model.named_parameters())


def test_a_second_identical_request_returns_the_existing_export(
    dep: Deployment, lora_job: str, merged: dict[str, Any]
) -> None:
    with alice(dep) as c:
        again = c.post(
            f"/jobs/{lora_job}/exports", json={"kind": "merged", "dtype": "bf16", "max_shard_size": "100KB"}
        )
        assert again.status_code == 200, again.text
        assert again.json()["id"] == merged["id"]
        listed = c.get(f"/jobs/{lora_job}/exports").json()["data"]
    assert merged["id"] in [e["id"] for e in listed]


def test_export_of_a_job_that_has_not_succeeded_is_409(dep: Deployment) -> None:
    with alice(dep) as c:
        r = c.post("/jobs", json=tiny_spec(TINY_RELATIVE, name="busy", max_steps=200))
        job_id = r.json()["id"]
        try:
            r = c.post(f"/jobs/{job_id}/exports", json={"kind": "merged"})
            assert r.status_code == 409, r.text
            assert "only a succeeded job" in r.json()["detail"]
        finally:
            c.post(f"/jobs/{job_id}/cancel")


def test_adapter_of_a_full_fine_tune_is_409_and_merged_reexports_it(dep: Deployment, full_job: str) -> None:
    from transformers import AutoModelForCausalLM

    with alice(dep) as c:
        r = c.post(f"/jobs/{full_job}/exports", json={"kind": "adapter"})
        assert r.status_code == 409, r.text
        assert "full fine-tune" in r.json()["detail"]
        r = c.post(f"/jobs/{full_job}/exports", json={"kind": "merged", "dtype": "fp16"})
        assert r.status_code == 202, r.text
    done = wait_export(dep, full_job, r.json()["id"])
    assert done["status"] == "succeeded", done
    model = AutoModelForCausalLM.from_pretrained(str(dep.run_dir(full_job) / done["path"]))
    assert str(model.dtype) == "torch.float16"


def test_bad_fields_are_422_naming_the_field(dep: Deployment, lora_job: str) -> None:
    with alice(dep) as c:
        for body, field in (
            ({"kind": "merged", "dtype": "int4"}, "dtype"),
            ({"kind": "gguf"}, "kind"),
            ({"kind": "merged", "max_shard_size": "big"}, "max_shard_size"),
            ({"kind": "merged", "push_to_hub": {"repo_id": "a b"}}, "repo_id"),
        ):
            r = c.post(f"/jobs/{lora_job}/exports", json=body)
            assert r.status_code == 422, r.text
            assert field in str(r.json()["detail"][0]["loc"]), r.text


def test_another_owner_gets_404_on_every_export_route(
    dep: Deployment, lora_job: str, merged: dict[str, Any]
) -> None:
    eid = merged["id"]
    with dep.client(BOB) as c:
        for method, path in (
            ("POST", f"/jobs/{lora_job}/exports"),
            ("GET", f"/jobs/{lora_job}/exports"),
            ("GET", f"/jobs/{lora_job}/exports/{eid}"),
            ("POST", f"/jobs/{lora_job}/exports/{eid}/cancel"),
        ):
            r = c.request(method, path, json={"kind": "merged"} if path.endswith("exports") else None)
            assert r.status_code == 404, (method, path, r.text)
    with alice(dep) as c:
        assert c.get(f"/jobs/{lora_job}/exports/exp_0000000000000000").status_code == 404
        assert c.get(f"/jobs/{lora_job}/exports/{eid}").json()["status"] == "succeeded"  # bob changed nothing


def test_cancel_a_running_export(dep: Deployment, lora_job: str) -> None:
    with alice(dep) as c:
        r = c.post(
            f"/jobs/{lora_job}/exports", json={"kind": "merged", "dtype": "fp32", "max_shard_size": "2MB"}
        )
        assert r.status_code == 202, r.text
        eid = r.json()["id"]
        running = wait_export(dep, lora_job, eid, lambda e: e["status"] == "running", timeout=120)
        # The export's process has started (the shell launch.sh runs it under, and the export itself).
        request = str(dep.run_dir(lora_job) / running["path"] / "export.json")
        wait_until("the export's processes", lambda: len(procs_with(request)) >= 2, timeout=60)
        r = c.post(f"/jobs/{lora_job}/exports/{eid}/cancel")
        assert r.status_code == 202 and r.json()["status"] == "cancelling", r.text
    done = wait_export(dep, lora_job, eid, timeout=120)
    assert done["status"] == "cancelled" and done["error"] is None, done
    # The export process itself got the SIGTERM (128 + 15, recorded by launch.sh), not a SIGKILL of the
    # whole launch after the grace period (which leaves no exit status).
    assert (dep.run_dir(lora_job) / done["path"] / "exit_status").read_text().strip() == "143"
    with alice(dep) as c:
        # Cancel is idempotent: a finished export stays as it is.
        assert c.post(f"/jobs/{lora_job}/exports/{eid}/cancel").json()["status"] == "cancelled"


def test_push_to_an_unreachable_hub_fails_fast_with_hub_error(dep: Deployment, lora_job: str) -> None:
    with alice(dep) as c:
        body = {"kind": "adapter", "dtype": "bf16", "push_to_hub": {"repo_id": "alice/tiny-lora"}}
        r = c.post(f"/jobs/{lora_job}/exports", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["push_to_hub"] == {"repo_id": "alice/tiny-lora", "private": True}
    done = wait_export(dep, lora_job, r.json()["id"], timeout=120)
    assert done["status"] == "failed", done
    assert (
        done["error"]["code"] == "hub_error"
        and "cannot reach the Hugging Face Hub" in done["error"]["message"]
    )
    # Failed before writing anything: the Hub was looked at before the merge.
    assert not (dep.run_dir(lora_job) / done["path"] / "adapter_model.safetensors").exists()


def test_push_without_an_operator_token_is_422(make_client: MakeClient) -> None:
    # An API without FTQ_HUB_TOKEN: the request is refused for its push_to_hub field, before any job is read.
    # One setting decides it: the app in process.
    c = make_client(api_tokens=f"{ALICE}:alice")
    r = c.post(
        "/jobs/job_0000000000000000/exports",
        json={"kind": "merged", "push_to_hub": {"repo_id": "a/b"}},
        headers={"Authorization": f"Bearer {ALICE}"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "push_to_hub"]
    assert "FTQ_HUB_TOKEN" in r.json()["detail"][0]["msg"]


def test_cli_export_follow_and_list(dep: Deployment, lora_job: str, merged: dict[str, Any]) -> None:
    result = run_ftq(
        "export", lora_job, "--merged", "--dtype", "bf16", "--max-shard-size", "100KB", "--follow",
        url=dep.url, token=ALICE,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert merged["id"] in result.stdout and "succeeded" in result.stdout
    listed = run_ftq("exports", lora_job, url=dep.url, token=ALICE)
    assert listed.returncode == 0 and merged["id"] in listed.stdout
    neither = run_ftq("export", lora_job, url=dep.url, token=ALICE)
    assert neither.returncode == 2 and "--merged or --adapter" in neither.stderr
