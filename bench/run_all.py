"""`make bench`: run every benchmark, print one table of ratios, write bench/RESULTS.md.

    python -m bench.run_all [--only poll,ingest,...] [--quick | --smoke]

With --only, the figures and notes of the benches not run are kept from the RESULTS.md there was.

A bench fails when it exits non-zero, does not finish within its timeout, or reports no figure. A failed
bench is still written up (a note gives its exit status and the last lines of its stderr), and then the
command exits 1, with a `FAILED <bench>: <why>` line on stderr for each: `make bench` fails with it.

--smoke runs each bench once with its smallest argv (`smoke_argv`; its quick argv where it has none), to
show that it still runs to its figures; the figures are not timings, and no RESULTS.md is written. The
suite runs the same for every bench but those that train or take minutes (`suite_skip` says why each is
left out): tests/integration/bench/test_smoke_*.py.

Protocol (how a bench reports to this runner). A bench is a program run as a subprocess; on stdout it
prints, among anything else:

    RESULT <name> <value> <unit> [key=value ...]
    NOTE <one sentence>

- `name` is unique within the bench, no spaces; `value` a number; `unit` e.g. req/s, ms, s, x.
- `baseline=<name>`: another RESULT of the same bench, measured in the same run; the table shows
  value / baseline's value as the ratio. `ratio=<x>` gives the ratio directly instead.
- `target=<op><number>` (op one of >=, <=, >, <): applied to the ratio when there is a baseline,
  else to the value; the table says met or missed.
- Any other key=value (p99_ms=..., errors=...) is shown as detail.
- NOTE lines are copied under the table: how something was measured, what was skipped and why.
A bench that prints no RESULT line but writes a JSON file is read through an adapter below
(trainer_bench's results.json); new benches should print RESULT lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from bench import OUT, REPO

RESULTS_MD = REPO / "bench" / "RESULTS.md"
KEPT_HEADING = "## History of fixes"


@dataclass
class Bench:
    key: str
    argv: list[str]
    quick_argv: list[str]
    timeout: int
    json_adapter: str | None = None
    # The smallest run that still prints every RESULT line (None: quick_argv is), and why the suite's smoke
    # tests leave it out, where they do.
    smoke_argv: list[str] | None = None
    suite_skip: str = ""
    # Programs the bench needs on PATH (its smoke test is skipped without them; run_all runs it and fails).
    needs: tuple[str, ...] = ()


SMOKE_TIMEOUT = 300


def _argv(line: str) -> list[str]:
    return line.split()


_SAMPLES_ACCELERATE = _argv("-m bench.samples_bench --launch accelerate")

# The smoke runs' wall seconds: from one run of tests/integration/bench/test_smoke_*.py on the 2-core machine
# (load average 2 to 6); those the suite leaves out, timed alone with /usr/bin/time (load average 8 to 12).
BENCHES = [
    Bench(
        "poll",
        ["-m", "bench.poll_bench"],
        ["-m", "bench.poll_bench", "--seconds", "6", "--jobs", "200"],
        1800,
        # 22 s: the metrics poll against /healthz; mlflow, history, status and workers are not run.
        smoke_argv=_argv("-m bench.poll_bench --only poll --seconds 1 --jobs 20 --points 50 --no-mlflow"),
        needs=("wrk",),
    ),
    Bench(
        "up",
        ["-m", "bench.poll_bench", "--only", "up"],
        ["-m", "bench.poll_bench", "--only", "up"],
        600,
        smoke_argv=_argv("-m bench.poll_bench --only up --rounds 1 --seconds 1"),  # 14 s
    ),
    Bench(
        "openai",
        ["-m", "bench.poll_bench", "--only", "openai"],
        ["-m", "bench.poll_bench", "--only", "openai"],
        600,
        smoke_argv=_argv("-m bench.poll_bench --only openai --rounds 1 --seconds 1"),  # 20 s
    ),
    Bench(
        "ingest",
        ["-m", "bench.ingest_bench"],
        ["-m", "bench.ingest_bench", "--lines", "20000"],
        900,
        smoke_argv=_argv("-m bench.ingest_bench --lines 2000 --lag-seconds 3"),  # 27 s
    ),
    Bench(
        "artifacts",
        ["-m", "bench.artifacts_tar"],
        ["-m", "bench.artifacts_tar", "--gb", "0.5"],
        600,
        smoke_argv=_argv("-m bench.artifacts_tar --gb 0.05 --files 2"),  # 5 s
    ),
    Bench(
        "load",
        ["-m", "bench.load_bench"],
        ["-m", "bench.load_bench", "--seconds", "15"],
        900,
        smoke_argv=_argv("-m bench.load_bench --seconds 2 --paced-seconds 2 --pollers 16 --jobs 4"),  # 23 s
        needs=("wrk",),
    ),
    Bench(
        "dispatch",
        ["-m", "bench.dispatch_bench"],
        ["-m", "bench.dispatch_bench", "--samples", "3", "--repeats", "1"],
        1800,
        smoke_argv=_argv("-m bench.dispatch_bench --samples 2 --repeats 1 --steps 4"),
        suite_skip="it trains the tiny job by hand and through two deployments: 31 CPU-s, 181 s",
    ),
    Bench(
        "scheduler",
        ["-m", "bench.scheduler_scale"],
        ["-m", "bench.scheduler_scale", "--queued", "2000", "--running", "200", "--dispatch", "40"],
        3600,
        # Every mode (tick, decide, dispatch with one worker): 32 s, 15 of them the worker's start.
        smoke_argv=_argv("-m bench.scheduler_scale --queued 200 --running 20 --dispatch 10 --workers 1"),
    ),
    Bench(
        "trainer",
        ["-m", "bench.trainer_bench"],
        ["-m", "bench.trainer_bench", "--steps", "8", "--rounds", "1"],
        1800,
        json_adapter="trainer",
        smoke_argv=_argv("-m bench.trainer_bench --steps 4 --rounds 1"),
        suite_skip="three tiny training runs: 72 CPU-s, 239 s",
    ),
    # Issue 29: the python grader sandbox's overhead per scored sample against an in-process call.
    Bench(
        "graders",
        ["-m", "bench.graders_bench"],
        ["-m", "bench.graders_bench", "--samples", "16"],
        600,
        smoke_argv=_argv("-m bench.graders_bench --samples 4 --batches 1,4"),  # under 1 s
    ),
    # Issue 49: samples on 2 processes of FSDP2, batched with the KV cache against a whole-sequence forward
    # per prompt and token.
    Bench(
        "samples",
        ["-m", "bench.samples_bench"],
        ["-m", "bench.samples_bench", "--prompts", "4", "--tokens", "16", "--rounds", "1"],
        900,
        smoke_argv=_argv("-m bench.samples_bench --prompts 2 --tokens 2 --rounds 1 --hidden 64 --layers 1"),
        suite_skip="two processes that import torch and transformers (about 20 CPU-s); the batched loop is "
        "tested in tests/unit/trainer/test_samples.py and under FSDP and ZeRO-3 in "
        "tests/integration/trainer/test_samples.py",
    ),
    # Issue 49: the same two loops under `accelerate launch --num_processes 2` with an FSDP2 config (the
    # model wrapped by Accelerator.prepare, as a training run's), on a random Llama of 116M parameters.
    Bench(
        "samples_accelerate",
        [*_SAMPLES_ACCELERATE, *_argv("--hidden 768 --layers 12 --prompts 4 --tokens 16")],
        [*_SAMPLES_ACCELERATE, *_argv("--hidden 768 --layers 12 --prompts 2 --tokens 8 --rounds 1")],
        1200,
        # `accelerate launch`, two ranks importing torch, transformers and the trainer: 15 CPU-s, 18 s.
        smoke_argv=[*_SAMPLES_ACCELERATE, *_argv("--prompts 2 --tokens 2 --rounds 1 --hidden 64 --layers 1")],
    ),
    # Issue 49: serving through ftq's /v1/chat/completions against a bare vLLM engine on the same model.
    Bench(
        "serving",
        ["-m", "bench.serving_bench"],
        ["-m", "bench.serving_bench", "--rounds", "1"],
        1200,
        smoke_argv=_argv("-m bench.serving_bench --smoke"),
        suite_skip="`ftq up` and two vLLM engines started at once on the CPU (67 to 90 s, ~57 of them the "
        "engines' start with both cores busy: well over the smoke runs' 40 CPU-s); the engine, as the worker "
        "launches it, and the proxy are tested against transformers in tests/e2e/serving",
    ),
    # Issue 52: a Tinker forward_backward + optim_step round trip through ftq (the official SDK against
    # `ftq up`) against the same PEFT step in process; sampling against HF generate on the same weights.
    Bench(
        "tinker",
        ["-m", "bench.tinker_bench"],
        ["-m", "bench.tinker_bench", "--steps", "10", "--rounds", "1"],
        900,
        smoke_argv=_argv("-m bench.tinker_bench --smoke"),  # 19 s: `ftq up`, a training client's start
    ),
    # Issue 29: a GRPO job's tokens/s through ftq's trainer against a plain TRL GRPOTrainer script.
    Bench(
        "grpo",
        ["-m", "bench.grpo_bench"],
        ["-m", "bench.grpo_bench", "--steps", "6", "--rounds", "1"],
        1200,
        smoke_argv=_argv("-m bench.grpo_bench --steps 3 --rounds 1"),
        suite_skip="two tiny GRPO training runs: 87 CPU-s, 267 s",
    ),
    # POST /jobs on a dataset file the API has seen (its preflight's token counts kept) against a new one.
    Bench(
        "submit",
        ["-m", "bench.submit_bench"],
        ["-m", "bench.submit_bench", "--rounds", "1"],
        300,
        smoke_argv=_argv("-m bench.submit_bench --rounds 1"),  # 8 s
    ),
    # An idle deployment's beat: CPU a minute with worker/beat.py's scheduler against Celery's own.
    Bench(
        "beat",
        ["-m", "bench.beat_bench"],
        ["-m", "bench.beat_bench", "--rounds", "1"],
        300,
        smoke_argv=_argv("-m bench.beat_bench --rounds 1 --seconds 3"),  # 14 s
    ),
    # A run's start-up in CPU seconds, with and without the optional packages its spec does not use.
    Bench(
        "startup",
        ["-m", "bench.startup_bench"],
        ["-m", "bench.startup_bench", "--rounds", "1"],
        600,
        suite_skip="three whole tiny runs (the first fills the start-up cache): about 35 CPU-s, 48 s",
    ),
    # An evaluation's CPU with lm-eval indexing the suite's own task folder alone, against all its tasks.
    Bench(
        "evaluate",
        ["-m", "bench.evaluate_bench"],
        ["-m", "bench.evaluate_bench", "--rounds", "1"],
        600,
        smoke_argv=_argv("-m bench.evaluate_bench --smoke"),
        suite_skip="tiny training runs and lm-eval evaluations on vLLM and on HF (a vLLM engine's start in "
        "the sandbox): over the smoke runs' 40 CPU-s; both backends' accuracy is tested in "
        "tests/integration/trainer/test_lm_eval_vllm.py",
    ),
    # Issue 28: kills during uploads, exports and webhook deliveries, a full disk, a deleted run dir.
    Bench(
        "fault_campaign",
        ["-m", "bench.fault_campaign"],
        ["-m", "bench.fault_campaign"],
        1800,
        suite_skip="five phases that kill and restart `ftq up` and train jobs (no smaller run): 292 s",
    ),
]


@dataclass
class Row:
    bench: str
    name: str
    value: float
    unit: str
    extra: dict[str, str] = field(default_factory=dict)
    ratio: float | None = None
    verdict: str = ""


_LINE = re.compile(r"^RESULT\s+(\S+)\s+(\S+)\s+(\S+)(.*)$")


def parse(bench: str, stdout: str) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("NOTE "):
            notes.append(line[5:].strip())
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        extra = dict(kv.split("=", 1) for kv in m.group(4).split() if "=" in kv)
        rows.append(Row(bench, m.group(1), value, m.group(3), extra))
    by_name = {r.name: r for r in rows}
    for r in rows:
        if "ratio" in r.extra:
            r.ratio = float(r.extra.pop("ratio"))
        elif "baseline" in r.extra and r.extra["baseline"] in by_name:
            base = by_name[r.extra["baseline"]].value
            r.ratio = r.value / base if base else None
        target = r.extra.pop("target", None)
        if target:
            r.extra["target"] = target
            if "baseline" in r.extra and r.ratio is None:
                # A target on a ratio whose baseline is missing or zero: no verdict, not the raw value's.
                r.verdict = "NO BASELINE"
                continue
            r.verdict = verdict(r.ratio if r.ratio is not None else r.value, target)
    return rows, notes


def verdict(x: float, target: str) -> str:
    m = re.match(r"^(>=|<=|>|<)(-?[\d.]+)$", target)
    if not m:
        return "?"
    op, bound = m.group(1), float(m.group(2))
    ok = {">=": x >= bound, "<=": x <= bound, ">": x > bound, "<": x < bound}[op]
    return "met" if ok else "MISSED"


def trainer_adapter() -> tuple[list[Row], list[str]]:
    path = OUT / "trainer" / "results.json"
    if not path.exists():
        return [], []
    data = json.loads(path.read_text())
    rows = []
    # The targets of the performance issue: within 5 % of plain TRL, packing well over 1.5x.
    targets = {"trainer": ">=0.95"}
    for name, tps in data.get("tokens_per_second", {}).items():
        ratio = data.get("ratio_vs_baseline", {}).get(name)
        row = Row("trainer", f"tokens_per_s_{name}", tps, "tok/s", {"baseline": "baseline"}, ratio)
        if name in targets and ratio is not None:
            row.extra["target"] = targets[name]
            row.verdict = verdict(ratio, targets[name])
        rows.append(row)
    if "packing_speedup" in data:
        speedup = data["packing_speedup"]
        rows.append(
            Row(
                "trainer",
                "packing_speedup",
                speedup,
                "x",
                {"baseline": "no-pack", "target": ">=1.5"},
                speedup,
                verdict(speedup, ">=1.5"),
            )
        )
    return rows, ["trainer: tokens/s against a plain TRL SFTTrainer script, same settings, same run"]


@dataclass
class Ran:
    """One bench's run: its figures and notes, its wall time, and why it failed (None when it did not)."""

    rows: list[Row]
    notes: list[str]
    took: float
    failure: str | None = None


def run_bench(b: Bench, mode: str = "full", smoke_out: Path | None = None) -> Ran:
    """Run `b` with its argv for `mode` ("full", "quick" or "smoke") and read its figures. A smoke run's
    scratch folders and output go to `smoke_out` (default bench/out/smoke), not where a real run's are."""
    argv = {"full": b.argv, "quick": b.quick_argv, "smoke": b.smoke_argv or b.quick_argv}[mode]
    timeout, out, env = b.timeout, OUT, dict(os.environ)
    if mode == "smoke":
        timeout, out = SMOKE_TIMEOUT, smoke_out or OUT / "smoke"
        env["FTQ_BENCH_OUT"] = str(out)
    t = time.perf_counter()
    print(f"== {b.key}: python {' '.join(argv)}", flush=True)
    try:
        proc = subprocess.run(
            [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        why = f"did not finish within {timeout} s"
        return Ran([], [f"{b.key}: {why}"], time.perf_counter() - t, why)
    took = time.perf_counter() - t
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{b.key}.stdout").write_text(proc.stdout)
    (out / f"{b.key}.stderr").write_text(proc.stderr)
    rows, notes = parse(b.key, proc.stdout)
    if not rows and b.json_adapter == "trainer":
        rows, notes = trainer_adapter()
    failure = None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        failure = f"exited with {proc.returncode}: {tail[:400]}"
    elif not rows:
        failure = f"exited 0 but reported no figure (no RESULT line on stdout; see {out / b.key}.stdout)"
    if failure:
        notes.append(f"{b.key}: {failure}")
    notes = [f"{b.key}: {n}" if not n.startswith(f"{b.key}:") else n for n in notes]
    return Ran(rows, notes, took, failure)


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024**2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    versions = []
    for pkg in (
        "fastapi",
        "starlette",
        "uvicorn",
        "uvloop",
        "httptools",
        "pydantic",
        "sqlalchemy",
        "psycopg",
        "celery",
        "torch",
        "transformers",
        "trl",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{pkg} {metadata.version(pkg)}")
    pg = ""
    with contextlib.suppress(OSError):
        pg = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.strip()
    wrk = ""
    if shutil.which("wrk"):
        lines = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.splitlines()
        wrk = lines[0].strip() if lines else "wrk"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "load average at start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql client": pg,
        "load generator": wrk,
        "versions": ", ".join(versions),
    }


def table(rows: list[Row]) -> list[str]:
    out = [
        "| bench | figure | value | ratio | target | verdict | detail |",
        "| --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    for r in rows:
        base = r.extra.get("baseline", "")
        ratio = ""
        if r.ratio is not None:
            shown = f"{r.ratio:.2f}" if r.ratio >= 0.1 else f"{r.ratio:.2g}"  # 0.0046x, not 0.00x
            ratio = f"{shown}x" + (f" of {base}" if base else "")
        detail = ", ".join(f"{k}={v}" for k, v in r.extra.items() if k not in ("baseline", "target"))
        out.append(
            f"| {r.bench} | {r.name} | {r.value:.4g} {r.unit} | {ratio} | {r.extra.get('target', '')} | "
            f"{r.verdict} | {detail} |"
        )
    return out


_TABLE_ROW = re.compile(r"^\| ([a-z_]+) \| ")
_NOTE = re.compile(r"^- ([a-z_]+): ")


def earlier_figures(text: str, rerun: set[str]) -> tuple[list[str], list[str]]:
    """From a RESULTS.md written before: the table rows and the notes of the benches not in `rerun`."""
    others = {b.key for b in BENCHES} - rerun
    rows: list[str] = []
    notes: list[str] = []
    for line in text.split(KEPT_HEADING)[0].splitlines():
        row, note_ = _TABLE_ROW.match(line), _NOTE.match(line)
        if row and row.group(1) in others:
            rows.append(line)
        elif note_ and note_.group(1) in others:
            notes.append(line[2:])
    return rows, notes


def _in_bench_order(lines: list[str]) -> list[str]:
    order = {b.key: i for i, b in enumerate(BENCHES)}

    def key(line: str) -> int:
        m = _TABLE_ROW.match(line) or _NOTE.match("- " + line)
        return order.get(m.group(1), len(order)) if m else len(order)

    return sorted(lines, key=key)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated: " + ",".join(b.key for b in BENCHES))
    runs = ap.add_mutually_exclusive_group()
    runs.add_argument("--quick", action="store_true", help="shorter runs")
    runs.add_argument(
        "--smoke", action="store_true", help="each bench's smallest run, once: that it runs (no RESULTS.md)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS_MD)
    args = ap.parse_args(argv)
    keys = set(args.only.split(",")) if args.only else {b.key for b in BENCHES}
    unknown = keys - {b.key for b in BENCHES}
    if unknown:
        ap.error(f"no bench {', '.join(sorted(unknown))} (the benches: {', '.join(b.key for b in BENCHES)})")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    info = machine()
    rows: list[Row] = []
    notes: list[str] = []
    timings: list[str] = []
    failed: list[tuple[str, str]] = []
    started = datetime.now(UTC)
    for b in BENCHES:
        if b.key not in keys:
            continue
        ran = run_bench(b, mode)
        rows += ran.rows
        notes += ran.notes
        timings.append(f"{b.key} {ran.took:.0f} s")
        if ran.failure:
            failed.append((b.key, ran.failure))
        for line in table(ran.rows)[2:]:
            print(line, flush=True)
    lines = table(rows)
    print("\n".join(lines))
    if args.smoke:
        print("\n".join(notes))
        print(f"smoke runs (not timings; no RESULTS.md written): {', '.join(timings)}")
        return report_failures(failed)
    kept_from = ""
    if args.only and args.out.exists():
        earlier = args.out.read_text()
        kept_rows, kept_notes = earlier_figures(earlier, keys)
        lines = lines[:2] + _in_bench_order(lines[2:] + kept_rows)
        notes = _in_bench_order(notes + kept_notes)
        written = re.search(r"\) on (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", earlier)
        when = written.group(1) if written else "before"
        if kept_rows:
            kept_from = (
                f"- figures of the other benches: kept from the run of {when} (this run was `--only "
                + ",".join(sorted(keys))
                + "`; the lines above describe it)"
            )
    md = [
        "# ftq benchmark results",
        "",
        f"Written by `make bench` (python -m bench.run_all{' --quick' if args.quick else ''}) on "
        f"{started:%Y-%m-%d %H:%M} UTC. Every ratio is against a baseline measured in the same run on the "
        "same machine; absolute figures depend on the machine and on what else it was running.",
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in info.items() if v],
        f"- bench wall time: {', '.join(timings)}",
        *([kept_from] if kept_from else []),
        "",
        "## Figures",
        "",
        *lines,
        "",
        "## Notes",
        "",
        *[f"- {n}" for n in notes],
        "",
    ]
    # The hand-written record of fixes (before/after figures) under this heading survives a rerun.
    kept = ""
    if args.out.exists() and KEPT_HEADING in args.out.read_text():
        kept = args.out.read_text()[args.out.read_text().index(KEPT_HEADING) :]
    args.out.write_text("\n".join(md) + ("\n" + kept if kept else ""))
    print(f"wrote {args.out}")
    return report_failures(failed)


def report_failures(failed: list[tuple[str, str]]) -> int:
    """1 and a line on stderr for each failed bench, or 0 when none failed."""
    for key, why in failed:
        print(f"FAILED {key}: {why}", file=sys.stderr, flush=True)
    if failed:
        print(
            f"{len(failed)} bench(es) failed: {', '.join(k for k, _ in failed)} (bench/out/<bench>.stderr)",
            file=sys.stderr,
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
