"""The fetch step: hub models and datasets downloaded once, before a run's processes start (issue 27).

    python -m trainer.fetch [--spec spec.json]     # in the run directory; launch.sh runs it when needed

launch.sh runs this before `accelerate launch` when the spec names a hub model (`model.name_or_path` or
`model.adapter` that is not a local path) or a hub dataset (`dataset.name_or_path`), then exports
HF_HUB_OFFLINE=1 so every rank loads from the cache alone (no rank downloads, no 16 concurrent downloads
into one shared cache; trainer.data loads the dataset's snapshot folder from it). The cache is the
launcher's HF_HUB_CACHE (FTQ_HUB_CACHE: a folder every node sees, default data_dir/hub); the token is the
launcher's HF_TOKEN (FTQ_HF_TOKEN), read from the environment by huggingface_hub and written nowhere.

Progress goes to progress.jsonl (runs.PROGRESS) as a `fetching` record after each file (the repo, bytes
done and total), which the service shows as `progress.phase: fetching` with the bytes in its message;
train.log gets the same as `fetching <repo>: <done> of <total> bytes`, for people. A gated, private or
missing repo (or revision) ends the run here, before any rank starts, with `model_error` (a model) or
`dataset_error` (the dataset) naming the repo and the fix.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ftq.contract import progress, runs
from ftq.contract.spec import JobSpec, hub_datasets, hub_models

from . import hub
from .errors import DatasetError, FtqError, ModelError, report_and_exit

# When a repo has safetensors, the other weight formats it may also carry are not downloaded.
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".onnx", ".gguf", ".ot", ".tflite")


def wanted(names: list[str]) -> list[str]:
    """The files a load reads: everything but a second copy of the weights in another format (and the
    `original/` checkpoints some repos carry) when safetensors are there."""
    has_safetensors = any(n.endswith(".safetensors") for n in names)
    if not has_safetensors:
        return names
    return [n for n in names if not n.endswith(_OTHER_WEIGHTS) and not n.startswith("original/")]


def _explain(repo: str, exc: Exception, repo_type: str = "model") -> str:
    """The error message for a failed fetch: the repo and what to change (the field that names it)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    token = "the operator's Hub token (FTQ_HF_TOKEN)" if os.environ.get("HF_TOKEN") else "no Hub token"
    field = "model.name_or_path" if repo_type == "model" else "dataset.name_or_path"
    page = (
        f"https://huggingface.co/{repo}"
        if repo_type == "model"
        else f"https://huggingface.co/datasets/{repo}"
    )
    if isinstance(exc, GatedRepoError):
        return (
            f"{repo_type} {repo} is gated on the Hugging Face Hub and the fetch, with {token}, may not "
            f"download it: accept its terms at {page} with the account whose token the operator sets as "
            "FTQ_HF_TOKEN (and that the token has read access), then submit again"
        )
    if isinstance(exc, RevisionNotFoundError):
        if repo_type == "model":
            return (
                f"model {repo}: the revision in model.revision does not exist on the Hub; fix model.revision"
            )
        return f"dataset {repo} has no branch main on the Hub; check {field}"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"{repo_type} {repo} was not found on the Hugging Face Hub (fetched with {token}): check "
            f"{field} (owner/name), or, for a private repo, that FTQ_HF_TOKEN belongs to an account with "
            "access"
        )
    return f"could not fetch {repo_type} {repo} from the Hugging Face Hub: {type(exc).__name__}: {exc}"


def fetch_repo(
    repo: str, revision: str | None, repo_type: str = "model", progress_file: Path | None = None
) -> int:
    """Download `repo` (a model or dataset repo) at `revision` into the cache (HF_HUB_CACHE), logging bytes
    done after each file and appending them to `progress_file` as a `fetching` record; the bytes. A
    failure is a ModelError for a model, a DatasetError for a dataset.

    One file at a time rather than snapshot_download, for the progress lines; the cache ends up the same
    (blobs, the snapshot and refs/<revision>), which is what the ranks' offline loads look up."""
    from huggingface_hub import HfApi, hf_hub_download

    error = ModelError if repo_type == "model" else DatasetError
    problem = hub.unreachable_reason(repo, repo_type, revision)
    if problem:
        raise error(problem)
    try:
        info = HfApi().repo_info(repo, repo_type=repo_type, revision=revision, files_metadata=True)
        siblings = getattr(info, "siblings", None) or []  # model and dataset infos have them
        sizes = {s.rfilename: s.size or 0 for s in siblings}
        # A dataset repo's files are all data (or its card): only a model's second weight format is left.
        files = wanted(sorted(sizes)) if repo_type == "model" else sorted(sizes)
        total, done = sum(sizes[f] for f in files), 0
        _report(progress_file, repo, done, total)
        print(f"fetching {repo}: {done} of {total} bytes ({len(files)} files)", flush=True)
        for name in files:
            # The spec's revision (None: main), not the commit: the cache then maps it to that commit
            # (refs/main), which is how the ranks' offline from_pretrained finds the files.
            hf_hub_download(repo, name, repo_type=repo_type, revision=revision)
            done += sizes[name]
            _report(progress_file, repo, done, total)
            print(f"fetching {repo}: {done} of {total} bytes", flush=True)
    except FtqError:
        raise
    except Exception as exc:
        raise error(_explain(repo, exc, repo_type)) from exc
    print(f"fetched {repo} at {info.sha}: {total} bytes", flush=True)
    return total


def _report(progress_file: Path | None, repo: str, done: int, total: int) -> None:
    if progress_file is not None:
        progress.append(progress_file, progress.fetching(repo, done, total))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=Path(runs.SPEC))
    args = ap.parse_args(argv)
    spec = JobSpec.model_validate_json(args.spec.read_text())
    progress_file = args.spec.parent / runs.PROGRESS  # the run directory, beside spec.json
    try:
        for repo, revision in hub_models(spec):
            fetch_repo(repo, revision, "model", progress_file)
        for repo, revision in hub_datasets(spec):
            fetch_repo(repo, revision, "dataset", progress_file)
    except FtqError as err:
        report_and_exit(err)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
