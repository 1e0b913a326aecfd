"""The fetch step: hub models downloaded once, before a run's processes start (issue 27, item 2).

    python -m trainer.fetch [--spec spec.json]     # in the run directory; launch.sh runs it when needed

launch.sh runs this before `accelerate launch` when the spec names a hub model (`model.name_or_path` or
`model.adapter` that is not a local path), then exports HF_HUB_OFFLINE=1 so every rank loads from the
cache alone (no rank downloads, no 16 concurrent downloads into one shared cache). The cache is the
launcher's HF_HUB_CACHE (FTQ_HUB_CACHE: a folder every node sees, default data_dir/hub); the token is the
launcher's HF_TOKEN (FTQ_HF_TOKEN), read from the environment by huggingface_hub and written nowhere.

Progress goes to train.log as `fetching <repo>: <done> of <total> bytes`, which the service shows as
`progress.phase: fetching`. A gated, private or missing repo (or revision) ends the run here with
`model_error` naming the repo and the fix, before any rank starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ftq.contract import runs
from ftq.contract.spec import JobSpec, hub_models

from . import hub
from .errors import FtqError, ModelError, report_and_exit

# When a repo has safetensors, the other weight formats it may also carry are not downloaded.
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".onnx", ".gguf", ".ot", ".tflite")


def wanted(names: list[str]) -> list[str]:
    """The files a load reads: everything but a second copy of the weights in another format (and the
    `original/` checkpoints some repos carry) when safetensors are there."""
    has_safetensors = any(n.endswith(".safetensors") for n in names)
    if not has_safetensors:
        return names
    return [n for n in names if not n.endswith(_OTHER_WEIGHTS) and not n.startswith("original/")]


def _explain(repo: str, exc: Exception) -> str:
    """The model_error message for a failed fetch: the repo and what to change."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    token = "the operator's Hub token (FTQ_HF_TOKEN)" if os.environ.get("HF_TOKEN") else "no Hub token"
    if isinstance(exc, GatedRepoError):
        return (
            f"model {repo} is gated on the Hugging Face Hub and the fetch, with {token}, may not download "
            f"it: accept its terms at https://huggingface.co/{repo} with the account whose token the "
            "operator sets as FTQ_HF_TOKEN (and that the token has read access), then submit again"
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"model {repo}: the revision in model.revision does not exist on the Hub; fix model.revision"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"model {repo} was not found on the Hugging Face Hub (fetched with {token}): check "
            "model.name_or_path (owner/name), or, for a private repo, that FTQ_HF_TOKEN belongs to an "
            "account with access"
        )
    return f"could not fetch model {repo} from the Hugging Face Hub: {type(exc).__name__}: {exc}"


def fetch_model(repo: str, revision: str | None) -> int:
    """Download `repo` at `revision` into the cache (HF_HUB_CACHE), logging bytes done; the bytes."""
    from huggingface_hub import HfApi, hf_hub_download

    problem = hub.unreachable_reason(repo, "model", revision)
    if problem:
        raise ModelError(problem)
    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
        files = wanted(sorted(sizes))
        total, done = sum(sizes[f] for f in files), 0
        print(f"fetching {repo}: {done} of {total} bytes ({len(files)} files)", flush=True)
        for name in files:
            # The spec's revision (None: main), not the commit: the cache then maps it to that commit
            # (refs/main), which is how the ranks' offline from_pretrained finds the files.
            hf_hub_download(repo, name, revision=revision)
            done += sizes[name]
            print(f"fetching {repo}: {done} of {total} bytes", flush=True)
    except FtqError:
        raise
    except Exception as exc:
        raise ModelError(_explain(repo, exc)) from exc
    print(f"fetched {repo} at {info.sha}: {total} bytes", flush=True)
    return total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=Path(runs.SPEC))
    args = ap.parse_args(argv)
    spec = JobSpec.model_validate_json(args.spec.read_text())
    try:
        for repo, revision in hub_models(spec):
            fetch_model(repo, revision)
    except FtqError as err:
        report_and_exit(err)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
