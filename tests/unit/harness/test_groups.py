"""The xdist groups' weights (tests/harness/groups.py): measured seconds where a module was measured, and
the JUnit report turned into those seconds (bin/test_weights.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import REPO, groups
from tests.harness.env import load_script


def test_a_junit_report_becomes_seconds_by_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = load_script("bin/test_weights.py")
    assert script.module_of("tests.e2e.cli.test_cli") == "tests/e2e/cli/test_cli.py"
    assert script.module_of("tests.unit.ftq.test_x.TestThing") == "tests/unit/ftq/test_x.py"
    report = tmp_path / "results.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.cli.test_cli" name="test_a" time="1.25"/>'
        '<testcase classname="tests.e2e.cli.test_cli" name="test_b" time="2.5"/>'
        '<testcase classname="tests.unit.test_y.TestY" name="test_c" time="0.05"/>'
        "</testsuite></testsuites>"
    )
    out = tmp_path / "module_seconds.json"
    monkeypatch.setattr(script, "OUT", out)
    monkeypatch.setattr(script, "REPO", tmp_path)
    script.main([str(report)])
    assert json.loads(out.read_text()) == {"tests/e2e/cli/test_cli.py": 3.8, "tests/unit/test_y.py": 0.1}


def test_the_checked_in_seconds_name_modules_that_exist() -> None:
    measured = groups.module_seconds()
    assert len(measured) > 100  # the whole suite, not a stray partial report
    missing = [m for m in measured if not (REPO / m).is_file()]
    assert missing == [], "modules renamed or removed since the last `make test-weights`"
    # The heaviest groups go out first: the training groups and the e2e session are among the biggest.
    heavy, light = "tests/integration/trainer/test_fsdp_memory.py", "tests/unit/harness/test_deployment.py"
    assert measured[heavy] > 60 > 5 > measured[light]
