"""Rendering and estimating stay light: importing them pulls in neither torch nor transformers (the API
imports them on every request path). A fresh interpreter, since this one has imported both already."""

from __future__ import annotations

import subprocess
import sys

from tests.harness import REPO


def test_no_heavy_imports() -> None:
    code = "import sys, ftq.planning.render, ftq.planning.estimate\n"
    code += "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
