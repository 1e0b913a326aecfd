"""One quick look at the Hugging Face Hub before a run asks it for a model or dataset it does not have.

huggingface_hub retries a refused or timed-out connection five times with backoff (1+2+4+8+8 s), per
file, and a model load asks for several files: with the Hub unreachable a job failed after a minute of
"Retrying in 8s". A single request with a short timeout tells the same thing in seconds. Only a hub id
that the local cache does not hold is looked up, and never with HF_HUB_OFFLINE set (the libraries then
fail at once from the cache by themselves).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

DEFAULT_ENDPOINT = "https://huggingface.co"
# Long enough for a slow link to answer, short enough that "unreachable" costs seconds.
PROBE_TIMEOUT_S = 5.0


def offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) says not to ask the Hub."""
    flags = (os.environ.get(n, "").strip().lower() for n in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f in ("1", "true", "yes", "on") for f in flags)


def _cached(repo_id: str, repo_type: str, revision: str | None) -> bool:
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    if repo_type == "model":
        return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)
    try:
        return any(r.repo_id == repo_id and r.repo_type == repo_type for r in scan_cache_dir().repos)
    except Exception:  # no cache folder yet: nothing cached
        return False


def unreachable_reason(repo_id: str, repo_type: str = "model", revision: str | None = None) -> str | None:
    """Why the Hub cannot be reached for `repo_id` (a hub id, not a path), or None when it answered
    (any HTTP status: a gated or missing repo is the loader's to explain) or need not be asked."""
    if offline() or _cached(repo_id, repo_type, revision):
        return None
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    kind = "models" if repo_type == "model" else "datasets"
    url = f"{endpoint}/api/{kind}/{repo_id}"
    request = urllib.request.Request(url, method="HEAD")  # noqa: S310 (the operator's endpoint)
    try:
        # urllib honours HTTP(S)_PROXY as huggingface_hub does, so a dead proxy is found here too.
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):  # noqa: S310
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        return (
            f"cannot reach the Hugging Face Hub at {endpoint} ({why}) to download {repo_id}, and it is "
            "not in this machine's Hugging Face cache; use a local path (./folder), put it in the cache "
            "(HF_HOME) first, or fix the network or proxy (HF_ENDPOINT, HTTPS_PROXY)"
        )
