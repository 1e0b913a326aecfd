"""Where things are, and the environment every process the harness starts is given."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
# The venv's console scripts, next to the interpreter running the tests or the bench.
BIN = Path(sys.executable).parent
FTQ = str(BIN / "ftq")
# Screenshots and other files a human may want to look at after a run (gitignored).
ARTIFACTS = REPO / "tests" / "_artifacts"


# The first lines of a script a test runs as a rank of its own (not through `-m trainer`): the packages
# no such script uses marked absent, as the trainer's start-up does for a run that needs none of them
# (trainer/lean.py), so that transformers, PEFT and TRL do not import them (~2 CPU-s a process).
LEAN_PRELUDE = """\
import sys as _sys
from trainer.lean import OPTIONAL as _OPTIONAL
for _name in _OPTIONAL:
    _sys.modules.setdefault(_name, None)
"""


def load_script(relative: str) -> ModuleType:
    """A script of the checkout (`bin/unasync_sdk.py`, `docs/hooks.py`: no package) as a module, loaded by
    path the way its own tool runs it."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without FTQ_ settings (a developer's shell cannot leak in; the suite's own
    FTQ_TEST_ knobs stay), with wide colourless unbuffered output, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    # Wide, colourless output: rich tables and lines are then easy to assert on.
    env.update({"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def ftq_settings(settings: dict[str, object]) -> dict[str, str]:
    """`{"cpu_slots": 4}` -> `{"FTQ_CPU_SLOTS": "4"}` (names already spelt FTQ_... are kept as given)."""
    out = {}
    for key, value in settings.items():
        name = key if key.startswith("FTQ_") else f"FTQ_{key.upper()}"
        out[name] = str(value)
    return out
