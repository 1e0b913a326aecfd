"""Write tests/harness/module_seconds.json (the seconds each test module took, which the xdist scheduler
in tests/harness/groups.py orders its groups by) from a pytest JUnit XML report.

    python bin/test_weights.py [build/test-results.xml]

`make test` writes that report; `make test-weights` runs this on it. A test's time there is its setup,
call and teardown; a module's is the sum of its tests'. Times on three workers of the 2-core machine are
what the order is for: refresh them from such a run.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "harness" / "module_seconds.json"


def module_of(classname: str) -> str:
    """`tests.e2e.cli.test_cli[.TestClass]` -> `tests/e2e/cli/test_cli.py`."""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return "/".join(parts[: i + 1]) + ".py"
    return "/".join(parts) + ".py"


def main(argv: list[str]) -> None:
    report = Path(argv[0]) if argv else REPO / "build" / "test-results.xml"
    seconds: dict[str, float] = defaultdict(float)
    # The report pytest wrote on this machine, not data from elsewhere.
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314
        seconds[module_of(case.get("classname", ""))] += float(case.get("time") or 0)
    OUT.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())}, indent=1) + "\n")
    print(f"{OUT.relative_to(REPO)}: {len(seconds)} modules, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1:])
