"""Writes the blocking SDK client, ftq/client/_sync.py, from the async one, ftq/client/_async.py, with the
unasync package (as httpcore's sync client is made): `async` and `await` dropped and each async name
swapped for its blocking twin (REPLACEMENTS), then ruff's import sorting and formatting, since a shorter
name can reorder an import or let a wrapped line join. A line of _async.py marked `# async only` is left
out (AsyncClient's `aclose` alias, which would read `close = close`).

    python bin/unasync_sdk.py            rewrite ftq/client/_sync.py (`make unasync`)
    python bin/unasync_sdk.py --check    exit 1, with the diff, when it is stale (`make lint`)
    python bin/unasync_sdk.py --out DIR  write DIR/_sync.py instead
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "ftq" / "client" / "_async.py"
TARGET = ROOT / "ftq" / "client" / "_sync.py"
ASYNC_ONLY = "# async only"
HEADER = (
    "# Generated from ftq/client/_async.py by bin/unasync_sdk.py (unasync): do not edit. Change _async.py\n"
    "# and run `make unasync`; `make lint` fails while this file is stale.\n"
)

# unasync's own table covers `__aenter__`, `AsyncIterator`, `asynccontextmanager` and the like; its
# fallback for any other `AsyncX` is `SyncX`, which names nothing here, so each one is spelled out.
REPLACEMENTS = {
    "AsyncClient": "Client",
    "AsyncJobs": "Jobs",
    "AsyncFiles": "Files",
    "AsyncGraders": "Graders",
    "AsyncDeployments": "Deployments",
    "AsyncTrainingClients": "TrainingClients",
    "AsyncExitStack": "ExitStack",
    "AsyncBaseTransport": "BaseTransport",
    "enter_async_context": "enter_context",
    "aclose": "close",
    "aread": "read",
    "aiter_lines": "iter_lines",
    "aiter_bytes": "iter_bytes",
    "anext": "next",
    "achunks": "chunks",
    "arun": "run",
}


def unasynced(source: str) -> str:
    """`source` through unasync's rule (it works on files, so by way of a scratch folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "_async", "client.py")
        src.parent.mkdir()
        src.write_text(source, encoding="utf-8")
        unasync.unasync_files([str(src)], [unasync.Rule("/_async/", "/_sync/", REPLACEMENTS)])
        return Path(tmp, "_sync", "client.py").read_text(encoding="utf-8")


def unmapped(code: str) -> list[str]:
    """Names unasync's fallback made up (`SyncX`) or async names left in the code (docstrings aside)."""
    names = {
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(code).readline)
        if tok.type == tokenize.NAME
    }
    return sorted(n for n in names if re.fullmatch(r"Sync[A-Z]\w*|Async\w*|anyio|async|await", n))


def ruff(*args: str, code: str) -> str:
    """`code` through `ruff ARGS`, read as if it were _sync.py (so with the project's settings)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} on the generated client failed:\n{done.stderr}")
    return done.stdout


def generate() -> str:
    """What _sync.py should hold for the _async.py of this checkout."""
    lines = SOURCE.read_text(encoding="utf-8").splitlines(keepends=True)
    source = "".join(line for line in lines if ASYNC_ONLY not in line)
    code = unasynced(source)
    if left := unmapped(code):
        raise SystemExit(f"bin/unasync_sdk.py: add to REPLACEMENTS what these become in _sync.py: {left}")
    code = ruff("check", "--fix", "--select", "I,F401", "--quiet", code=code)
    return HEADER + ruff("format", "--quiet", code=code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when ftq/client/_sync.py is stale")
    parser.add_argument("--out", type=Path, help="write OUT/_sync.py instead of ftq/client/_sync.py")
    args = parser.parse_args(argv)
    code = generate()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current == code:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True), code.splitlines(keepends=True), str(TARGET), "generated"
            )
        )
        print("ftq/client/_sync.py is stale: run 'make unasync'", file=sys.stderr)
        return 1
    out = args.out / TARGET.name if args.out else TARGET
    out.write_text(code, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
