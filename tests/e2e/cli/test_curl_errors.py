"""The mistakes a new user makes with curl and a spec file, made with the real curl against `ftq up`:
each answer names its fix. Dry runs only, so nothing is queued."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.e2e.session import TINY_SPEC
from tests.harness import Deployment


def _curl(server: Deployment, *args: str) -> tuple[int, str]:
    """(HTTP status, the error's text) of `curl ARGS` posting to a dry run."""
    out = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", "-X", "POST", f"{server.url}/jobs?dry_run=true", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    body, _, status = out.rpartition("\n")
    detail = json.loads(body)["detail"]
    text = detail if isinstance(detail, str) else " | ".join(e["msg"] for e in detail)
    return int(status), text


def test_curl_mistakes_are_answered_with_their_fix(server: Deployment, tmp_path: Path) -> None:
    yaml_type = "content-type: application/yaml"
    spec = str(TINY_SPEC)

    # -d: a form, the file's newlines stripped.
    status, text = _curl(server, "-d", f"@{spec}")
    assert status == 415 and "--data-binary @spec.yaml" in text, text
    status, text = _curl(server, "-H", yaml_type, "-d", f"@{spec}")
    assert status == 400 and "--data-binary @spec.yaml" in text, text

    # The right flags, the wrong content type.
    status, text = _curl(server, "-H", "content-type: application/json", "--data-binary", f"@{spec}")
    assert status == 400 and "Content-Type: application/yaml" in text, text

    # A tab for an indent, and a typo'd field.
    lines = TINY_SPEC.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  name_or_path:"))
    tabbed = tmp_path / "tabbed.yaml"
    tabbed.write_text("\n".join([*lines[:at], "\t" + lines[at].lstrip(), *lines[at + 1 :]]) + "\n")
    status, text = _curl(server, "-H", yaml_type, "--data-binary", f"@{tabbed}")
    assert status == 400 and f"line {at + 1}, column 1: a tab character" in text, text

    typo = tmp_path / "typo.yaml"
    typo.write_text(TINY_SPEC.read_text().replace("  learning_rate:", "  learnig_rate:"))
    status, text = _curl(server, "-H", yaml_type, "--data-binary", f"@{typo}")
    assert status == 422 and "did you mean `learning_rate`?" in text, text

    # A local folder written without ./ (examples/ is one of the server's roots).
    bare = tmp_path / "bare.yaml"
    bare.write_text(TINY_SPEC.read_text().replace("name_or_path: ./tiny/model", "name_or_path: tiny/model"))
    status, text = _curl(server, "-H", yaml_type, "--data-binary", f"@{bare}")
    assert status == 422 and text.startswith("did you mean ./tiny/model?"), text
