"""The rendered launch.sh and job.sbatch run for real with bash, a stand-in interpreter that records its
argv, and stand-ins for srun and scontrol: quoting that survives hostile values, exit statuses recorded,
SIGTERM handling, one launch per node with its rank, and resuming when requeued."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ftq.contract.plans import Plan
from ftq.planning.render import default_port, launch_argv, render_plan
from tests.unit.ftq.planning.test_render import example, settings, spec_for

# Quoting ----------

HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "a; touch PWNED",
    "a' ; touch PWNED; '",
    'a" ; touch PWNED; "',
    "a && touch PWNED #",
    "${IFS}touch${IFS}PWNED",
    "a\\",
    "spaced out name",
    "-rf",
    "%j%%N",
]


def _sbatch_tokens(script: str) -> list[str]:
    """The options sbatch reads from `#SBATCH` lines (SLURM's rules: blanks split words, `"` quotes,
    backslash escapes the next character, an unescaped `#` ends the line), up to the first command."""
    out = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#SBATCH"):
            if line.strip() and not line.startswith("#"):
                break
            continue
        rest, word, quoted, escaped, started = line[len("#SBATCH") :], "", False, False, False
        for ch in rest:
            if escaped:
                word, escaped, started = word + ch, False, True
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted, started = not quoted, True
            elif ch == "#" and not quoted:
                break
            elif ch.isspace() and not quoted:
                if started:
                    out.append(word)
                word, started = "", False
            else:
                word, started = word + ch, True
        if started:
            out.append(word)
    return out


def _bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "check.sh"
    path.write_text(script)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("evil", HOSTILE)
def test_hostile_strings_never_become_script_lines(evil: str, tmp_path: Path) -> None:
    """Values the spec cannot carry here (it allowlists these fields) are forced in anyway: the scripts must
    still parse, and each value must come back as one whole word."""
    spec = example("falcon-180b-lora-zero3")
    spec.resources.slurm.partition = evil
    spec.resources.slurm.account = evil
    spec.resources.slurm.time_limit = evil
    run_dir = tmp_path / evil.replace("/", "_")
    plan = render_plan(
        spec,
        job_id="j-" + evil,
        run_dir=run_dir,
        resume_from_checkpoint=evil,
        settings=settings(python="/opt/py " + evil),
    )
    assert plan.sbatch_script is not None
    for script in (plan.launch_script, plan.sbatch_script):
        _bash_n(script, tmp_path)
    # launch.sh: the command words, as bash will split them, are exactly the one-host argv (the plan's
    # command is the per-node launch of job.sbatch, which tests/unit/ftq/planning/test_render.py reads back).
    lines = plan.launch_script.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "-m accelerate.commands.launch" in line)
    command = "".join(lines[start:]).split(" \\\n  >>")[0]
    launch_words = shlex.split(command.replace(" \\\n  ", " "))
    one_host = launch_argv(
        spec,
        run_dir=run_dir,
        settings=settings(python="/opt/py " + evil),
        port=default_port("j-" + evil),
        resume_from_checkpoint=evil,
    )
    assert launch_words == one_host
    assert evil in plan.command and "/opt/py " + evil == plan.command[0]
    # job.sbatch: every #SBATCH value is read back whole by sbatch's rules.
    tokens = _sbatch_tokens(plan.sbatch_script)
    for opt, value in (
        ("--partition", evil),
        ("--account", evil),
        ("--time", evil),
        ("--job-name", "ftq-j-" + evil),
        ("--chdir", str(run_dir)),
        ("--output", str(run_dir / "train.log").replace("%", "%%")),
    ):
        assert f"{opt}={value}" in tokens, (opt, tokens)


# launch.sh, run for real ----------

FAKE_PYTHON = """#!/usr/bin/env bash
# Stand-in interpreter: records its argv, then behaves as FAKE_MODE says. The fetch step (a spec that
# names a hub model) succeeds at once and records its argv apart.
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "trainer.fetch" ]; then
  printf '%s\\0' "$@" > fetch.argv.bin; exit 0
fi
printf '%s\\0' "$@" > "argv.${SLURM_NODEID:-local}.bin"
echo "fake launch started on ${SLURM_NODEID:-local}"
case "${FAKE_MODE:-ok}" in
  ok) echo "fake launch done"; exit 0 ;;
  fail) echo "fake launch failing" >&2; exit 3 ;;
  term)
    trap 'echo "fake launch got SIGTERM"; exit 7' TERM
    echo ready > ready
    while :; do sleep 0.05; done ;;
esac
"""


def fake_python(tmp_path: Path) -> Path:
    path = tmp_path / "bin dir" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_PYTHON)
    path.chmod(0o755)
    return path


def argv_file(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def _local_plan(tmp_path: Path, resume: str | None = None) -> tuple[Plan, Path]:
    run_dir = tmp_path / "runs" / "job 1 $(x)"
    run_dir.mkdir(parents=True)
    spec = spec_for(resources={"device": "cpu", "processes_per_node": 2}, distributed={"strategy": "ddp"})
    plan = render_plan(
        spec,
        job_id="job1",
        run_dir=run_dir,
        settings=settings(python=str(fake_python(tmp_path))),
        resume_from_checkpoint=resume,
    )
    (run_dir / "launch.sh").write_text(plan.launch_script)
    return plan, run_dir


def _start(run_dir: Path, mode: str) -> subprocess.Popen[bytes]:
    """As the local launcher starts it: its own session, output appended to train.log."""
    env = {**os.environ, "FAKE_MODE": mode}
    with open(run_dir / "train.log", "ab") as log:
        return subprocess.Popen(
            ["bash", str(run_dir / "launch.sh")],
            cwd="/",
            env=env,
            start_new_session=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_launch_sh_runs_the_argv_logs_and_records_success(tmp_path: Path) -> None:
    plan, run_dir = _local_plan(tmp_path, resume="/ck pt/checkpoint-5")
    (run_dir / "exit_status").write_text("99\n")  # a stale status from an earlier attempt is removed
    proc = _start(run_dir, "ok")
    assert proc.wait(timeout=20) == 0
    assert (run_dir / "exit_status").read_text() == "0\n"
    assert argv_file(run_dir / "argv.local.bin") == plan.command[1:]
    log = (run_dir / "train.log").read_text()
    assert "fake launch started on local" in log and "fake launch done" in log
    assert not list(run_dir.glob(".exit_status*"))


def test_launch_sh_records_a_failure_and_appends_to_the_log(tmp_path: Path) -> None:
    _plan, run_dir = _local_plan(tmp_path)
    (run_dir / "train.log").write_text("earlier attempt\n")
    proc = _start(run_dir, "fail")
    assert proc.wait(timeout=20) == 3
    assert (run_dir / "exit_status").read_text() == "3\n"
    log = (run_dir / "train.log").read_text()
    assert log.startswith("earlier attempt\n") and "fake launch failing" in log


def _wait_ready(run_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.time() + 20
    while not (run_dir / "ready").exists():
        assert time.time() < deadline and proc.poll() is None, "fake launch did not start"
        time.sleep(0.05)


@pytest.mark.parametrize("attempt", range(3))
def test_launch_sh_survives_a_group_sigterm_and_records_the_launchs_status(
    tmp_path: Path, attempt: int
) -> None:
    """What the local launcher's cancel does: SIGTERM to the process group. Repeated: the status is
    read as the launch ends, the moment a race would show."""
    _plan, run_dir = _local_plan(tmp_path)
    proc = _start(run_dir, "term")
    _wait_ready(run_dir, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 7
    # The status is the launch's own (its TERM handler exits 7), not the shell's 143.
    assert (run_dir / "exit_status").read_text() == "7\n"
    log = (run_dir / "train.log").read_text()
    assert "fake launch got SIGTERM" in log and "ftq: SIGTERM received" in log


def test_launch_sh_outlives_a_sigterm_to_itself_until_the_launch_ends(tmp_path: Path) -> None:
    _plan, run_dir = _local_plan(tmp_path)
    proc = _start(run_dir, "term")
    _wait_ready(run_dir, proc)
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None and not (run_dir / "exit_status").exists()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 7
    assert (run_dir / "exit_status").read_text() == "7\n"


# job.sbatch, run with stand-ins for srun and scontrol ----------

FAKE_SRUN = """#!/usr/bin/env bash
# srun stand-in: drop srun's options, run the command once per node (in parallel) with SLURM_NODEID set.
while [[ "${1:-}" == -* ]]; do shift; done
pids=()
for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do
  SLURM_NODEID=$n "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && printf 'node-a\\nnode-b\\n'
"""


def _sbatch_env(tmp_path: Path, restart: int, mode: str = "ok") -> dict[str, str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_RESTART_COUNT": str(restart),
        "FAKE_MODE": mode,
    }


def _sbatch_plan(tmp_path: Path, resume: str | None = None) -> tuple[Plan, Path]:
    run_dir = tmp_path / "shared" / "job 2 'q'"
    run_dir.mkdir(parents=True)
    plan = render_plan(
        example("falcon-180b-lora-zero3"),
        job_id="job2",
        run_dir=run_dir,
        settings=settings(python=str(fake_python(tmp_path)), slurm_setup="export SITE_SETUP=done"),
        resume_from_checkpoint=resume,
    )
    assert plan.sbatch_script is not None
    (run_dir / "job.sbatch").write_text(plan.sbatch_script)
    return plan, run_dir


def _expected_node_argv(plan: Plan, run_dir: Path, node: int) -> list[str]:
    port = plan.command[plan.command.index("--main_process_port") + 1]
    return [
        "-m",
        "accelerate.commands.launch",
        "--machine_rank",
        str(node),
        "--config_file",
        str(run_dir / "accelerate_config.yaml"),
        "--num_processes",
        "16",
        "--num_machines",
        "2",
        "--main_process_ip",
        "node-a",
        "--main_process_port",
        port,
        "--rdzv_backend",
        "static",
        "--same_network",
        "-m",
        "trainer",
        "--spec",
        str(run_dir / "spec.json"),
        "--output_dir",
        str(run_dir),
    ]


def test_sbatch_script_runs_one_launch_per_node_with_its_rank(tmp_path: Path) -> None:
    plan, run_dir = _sbatch_plan(tmp_path)
    r = subprocess.run(
        ["bash", str(run_dir / "job.sbatch")],
        cwd=run_dir,
        env=_sbatch_env(tmp_path, 0),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    for node in (0, 1):
        assert argv_file(run_dir / f"argv.{node}.bin") == _expected_node_argv(plan, run_dir, node)
    assert (run_dir / "exit_status").read_text() == "0\n"


def test_sbatch_script_records_failure_and_resumes_when_requeued(tmp_path: Path) -> None:
    plan, run_dir = _sbatch_plan(tmp_path, resume="/other run/checkpoint-7")
    env = _sbatch_env(tmp_path, 0, mode="fail")
    r = subprocess.run(
        ["bash", str(run_dir / "job.sbatch")], cwd=run_dir, env=env, capture_output=True, timeout=30
    )
    assert r.returncode == 3
    assert (run_dir / "exit_status").read_text() == "3\n"
    resume = ["--resume_from_checkpoint", "/other run/checkpoint-7"]
    assert argv_file(run_dir / "argv.0.bin") == _expected_node_argv(plan, run_dir, 0) + resume
    # Requeued with no checkpoint of its own yet: still the given one. With one: `latest`.
    env = _sbatch_env(tmp_path, 1)
    subprocess.run(["bash", str(run_dir / "job.sbatch")], cwd=run_dir, env=env, check=True, timeout=30)
    assert argv_file(run_dir / "argv.1.bin") == _expected_node_argv(plan, run_dir, 1) + resume
    (run_dir / "checkpoints" / "checkpoint-100").mkdir(parents=True)
    subprocess.run(["bash", str(run_dir / "job.sbatch")], cwd=run_dir, env=env, check=True, timeout=30)
    latest = ["--resume_from_checkpoint", "latest"]
    assert argv_file(run_dir / "argv.1.bin") == _expected_node_argv(plan, run_dir, 1) + latest
    assert (run_dir / "exit_status").read_text() == "0\n"


def test_sbatch_script_records_status_when_setup_fails(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    plan = render_plan(
        example("falcon-180b-lora-zero3"),
        job_id="j",
        run_dir=run_dir,
        settings=settings(slurm_setup="module load does-not-exist-here"),
    )
    assert plan.sbatch_script is not None
    env = _sbatch_env(tmp_path, 0)
    env["PATH"] = f"{tmp_path / 'stubs'}:/usr/bin:/bin"
    r = subprocess.run(
        ["bash", "-c", plan.sbatch_script], cwd=run_dir, env=env, capture_output=True, timeout=30
    )
    assert r.returncode == 127
    assert (run_dir / "exit_status").read_text() == "127\n"


# SLURM's warning before the time limit ----------

FORWARDING_SRUN = """#!/usr/bin/env bash
# srun stand-in that, like srun, passes a SIGUSR1 it receives on to every node's task.
while [[ "${1:-}" == -* ]]; do shift; done
pids=()
trap 'kill -USR1 "${pids[@]}"' USR1
for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do
  SLURM_NODEID=$n "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  while :; do
    wait "$p" && s=0 || s=$?
    kill -0 "$p" 2> /dev/null || break
  done
  [ "$s" = 0 ] || status=$s
done
exit $status
"""
# A Python stand-in: bash cannot trap a signal it was started with ignored, and the per-node command
# ignores SIGUSR1 for the launcher (the real trainer installs its own handler, as this does).
SIGNALLED_PYTHON = """#!/usr/bin/env python3
import os, signal, sys, time
if sys.argv[1:3] == ["-m", "trainer.fetch"] or "ftq.planning.nccl_check" in sys.argv:
    sys.exit(0)  # the fetch step (the spec names a hub model), the fabric's check: done at once
if sys.argv[1:2] == ["-c"]:
    sys.exit(1)  # the script's probes (`import pynvml`: not installed here)
node = os.environ.get("SLURM_NODEID", "local")
def stop(signum, frame):
    print(f"fake launch {node} got SIGUSR1", flush=True)
    sys.exit(75)
signal.signal(signal.SIGUSR1, stop)
open(f"ready.{node}", "w").close()
time.sleep(120)
sys.exit(1)
"""


def test_sbatch_script_passes_the_time_limit_warning_to_every_node_and_records_the_status(
    tmp_path: Path,
) -> None:
    """SLURM sends `--signal=B:USR1` to the batch shell alone, while srun runs: the script must act at once
    (not after srun ends, as a trap on a foreground command would), pass it on, and still record the
    launch's own status."""
    run_dir = tmp_path / "shared" / "job 3"
    run_dir.mkdir(parents=True)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(SIGNALLED_PYTHON)
    python.chmod(0o755)
    plan = render_plan(
        example("falcon-180b-lora-zero3"),
        job_id="job3",
        run_dir=run_dir,
        settings=settings(python=str(python), slurm_setup=""),
    )
    assert plan.sbatch_script is not None and "#SBATCH --signal=B:USR1@300" in plan.sbatch_script
    env = _sbatch_env(tmp_path, 0)
    (tmp_path / "stubs" / "srun").write_text(FORWARDING_SRUN)
    with open(run_dir / "train.log", "ab") as out:
        proc = subprocess.Popen(
            ["bash", "-c", plan.sbatch_script],
            cwd=run_dir,
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.time() + 20
    while not all((run_dir / f"ready.{n}").exists() for n in (0, 1)):
        assert time.time() < deadline and proc.poll() is None, (run_dir / "train.log").read_text()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)  # the batch shell only, as B: does
    assert proc.wait(timeout=20) == 75
    assert (run_dir / "exit_status").read_text() == "75\n"
    log = (run_dir / "train.log").read_text()
    assert "asking the trainer to checkpoint and stop" in log
    assert "fake launch 0 got SIGUSR1" in log and "fake launch 1 got SIGUSR1" in log
