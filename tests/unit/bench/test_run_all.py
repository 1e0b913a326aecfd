"""bench/run_all.py (`make bench`): a bench that fails makes the command fail, naming it, and is still
written up; the suite smoke-tests every bench but those it says why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import run_all
from bench.run_all import BENCHES, Bench

OK = Bench(
    "poll", ["-c", "print('RESULT ok_figure 2 ms')"], [], 60, smoke_argv=["-c", "print('RESULT s 1 x')"]
)


@pytest.fixture
def out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(run_all, "OUT", tmp_path / "out")
    return tmp_path / "RESULTS.md"


def test_every_smoke_run_is_of_its_own_bench() -> None:
    for b in BENCHES:
        smoke = b.smoke_argv or b.quick_argv
        assert smoke[:2] == b.argv[:2], b.key  # the same module, smaller
        if b.argv[2:4] == ["--only", b.key]:  # poll_bench's `up` and `openai`
            assert smoke[2:4] == b.argv[2:4], b.key
    assert len({b.key for b in BENCHES}) == len(BENCHES)


def test_the_suite_smoke_tests_every_bench_but_those_it_says_why_not() -> None:
    from tests.integration.bench.smoke import EMBEDDED, POSTGRES

    in_suite = [b.key for b in BENCHES if not b.suite_skip]
    assert sorted(in_suite) == sorted([*POSTGRES, *EMBEDDED])


def test_a_failing_bench_fails_the_run_and_is_written_up(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = "import sys; print('RESULT half 1 ms'); sys.exit('the server did not start')"
    failing = Bench("up", ["-c", code], [], 60)
    monkeypatch.setattr(run_all, "BENCHES", [OK, failing])
    assert run_all.main(["--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "FAILED up: exited with 1: the server did not start" in err
    assert "1 bench(es) failed: up" in err
    text = out.read_text()
    assert "| poll | ok_figure | 2 ms |" in text and "| up | half | 1 ms |" in text
    assert "- up: exited with 1: the server did not start" in text


def test_a_bench_without_figures_fails(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    silent = Bench("up", ["-c", "print('nothing measured')"], [], 60)
    monkeypatch.setattr(run_all, "BENCHES", [silent])
    assert run_all.main(["--out", str(out)]) == 1
    assert "FAILED up: exited 0 but reported no figure" in capsys.readouterr().err


def test_only_keeps_the_other_benches_figures_and_passes(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_all, "BENCHES", [OK, Bench("up", ["-c", "print('RESULT u 3 ms')"], [], 60)])
    assert run_all.main(["--out", str(out)]) == 0
    monkeypatch.setattr(run_all, "BENCHES", [OK, Bench("up", ["-c", "print('RESULT u 4 ms')"], [], 60)])
    assert run_all.main(["--out", str(out), "--only", "up"]) == 0
    text = out.read_text()
    assert "| poll | ok_figure | 2 ms |" in text and "| up | u | 4 ms |" in text and "| u | 3 ms" not in text


def test_smoke_runs_the_smallest_argv_and_writes_no_results(
    out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = ["-c", "print('RESULT q 5 x')"]
    quick_only = Bench("up", ["-c", "raise SystemExit(3)"], quick, 60, suite_skip="it trains")
    monkeypatch.setattr(run_all, "BENCHES", [OK, quick_only])
    assert run_all.main(["--out", str(out), "--smoke"]) == 0
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "| poll | s | 1 x |" in printed and "| up | q | 5 x |" in printed


def test_an_unknown_bench_is_refused(out: Path) -> None:
    with pytest.raises(SystemExit):
        run_all.main(["--out", str(out), "--only", "nosuch"])
