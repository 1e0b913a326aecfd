"""Issue 18, item 2: a run cannot reach the service's secrets or other runs, remote code or not.

A job's code stands in for what a run may execute (remote code, a pickle in a checkpoint, a compromised
package): the interpreter of `accelerate launch` (FTQ_PYTHON) is replaced by a script, so each job goes
through the real stack: `POST /jobs`, the worker's launch of `launch.sh` by the local launcher.

- Without a run user (today's deployments): the launch gets an allowlisted environment (no API tokens,
  database or broker URL, no operator variable FTQ_PASS_ENV does not name) and what the service writes
  (the store, spec.json, train.log, the run directory) is owner-only.
- With FTQ_RUN_AS_USER (one user per owner, as root in CI): a job that tries to read the worker's
  /proc/<pid>/environ, the SQLite store, the data dir and another owner's run directory is refused each
  one, and its log (served by the API) says so; the service still reads its log and ends or cancels it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.security.common import HF_TOKEN, TOKENS, WANDB_KEY, base_spec
from tests.harness import Deployment, config_only_model, text_dataset
from tests.harness.api import JobsApi
from tests.harness.deployment import Mode
from tests.harness.env import REPO
from tests.harness.procs import wait_gone, wait_until
from tests.harness.users import RUN_USERS
from tests.harness.users import run_users as harness_run_users

OWNER_TOKENS = {"alice": "iso-alice-token-5a1c", "bob": "iso-bob-token-7b0e"}
# In the worker's environment only: no run may see it.
OPERATOR_SECRET = "opsecret-3f9d2c81e4b7a605"
PROBES = ("worker-environ", "store", "data-listing", "runs-listing", "other-run", "other-spec", "other-log")

# The job's code, run as its run user. `probe` prints DENIED with the error, or READ and keeps what it read
# in loot.txt; every /proc/*/environ it can read is added to loot.txt too.
JOB_CODE = r"""#!/bin/bash
spec= prev=
for arg in "$@"; do [ "$prev" = --spec ] && spec=$arg; prev=$arg; done
name=$(sed -n 's/^  "name": "\(.*\)",*$/\1/p' "$spec")
echo "$name ran as $(id -un)"
case "$name" in
victim)
  echo "victim-private-notes" > notes.txt
  echo '{"step": 1, "epoch": 0.5, "loss": 4.2424}' > metrics.jsonl ;;
sleeper)
  sleep 600 ;;
uploaded)
  # The run's copy of an uploaded dataset (dataset.file_id), as the trainer would open it.
  data=$(sed -n 's/^    "name_or_path": "\(.*\)",*$/\1/p' "$spec" | head -n 1)  # dataset sorts before model
  if head -c 24 "$data" > head.txt 2>&1; then echo "uploaded read: $(cat head.txt)"
  else echo "uploaded DENIED: $(cat head.txt)"; fi ;;
jam)
  # FIFOs where the worker reads this run's metrics and end (an open of either would never return),
  # and launch.sh killed so that it cannot replace them.
  mkfifo metrics.jsonl exit_status
  kill -9 "$PPID" ;;
attack)
  data=$(cd ../.. && pwd)
  target=$(cat "$(dirname "$0")/target")
  worker=$(awk '{print $4}' "/proc/$PPID/stat")  # launch.sh's parent: the worker
  probe() {
    local what=$1 out; shift
    if out=$("$@" 2>&1); then echo "READ $what"; printf '%s\n' "$out" >> loot.txt
    else echo "DENIED $what: $out"; fi
  }
  probe worker-environ cat "/proc/$worker/environ"
  probe store head -c 100 "$data/ftq.db"
  probe data-listing ls "$data"
  probe runs-listing ls "$data/runs"
  probe other-run ls "$target"
  probe other-spec cat "$target/spec.json"
  probe other-log cat "$target/train.log"
  for f in /proc/[0-9]*/environ; do tr '\0' '\n' 2>/dev/null < "$f" >> loot.txt; done
  env > env.txt
  # The worker (root) reads this run's metrics: let it read the other run's instead.
  ln -s "$target/metrics.jsonl" metrics.jsonl ;;
*)
  # Any other job: the real `accelerate launch` and trainer, on an interpreter the run user may run.
  PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}@SITE@" exec @INTERPRETER@ "$@" ;;
esac
"""

# Code from a model repo (model.trust_remote_code, allowed for bob): imported by transformers in the rank
# that loads the model. It tries each read, and prints what it read re-encoded, as an attacker would.
REMOTE_CODE = """
import base64, os
from pathlib import Path

from transformers import LlamaForCausalLM


def _worker():
    pid, me = os.getpid(), os.getuid()
    while pid > 1:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if os.stat(f"/proc/{parent}").st_uid != me:
            return parent
        pid = parent
    return 1


def _probe(what, read):
    try:
        data = read()
    except OSError as exc:
        print(f"DENIED {what}: {exc!r}", flush=True)
    else:
        print(f"READ {what} " + base64.b64encode(repr(data).encode()).decode(), flush=True)


DATA, VICTIM = Path.cwd().parent.parent, Path(@VICTIM@)
_probe("worker-environ", lambda: Path(f"/proc/{_worker()}/environ").read_bytes())
_probe("store", lambda: (DATA / "ftq.db").read_bytes()[:100])
_probe("data-listing", lambda: os.listdir(DATA))
_probe("runs-listing", lambda: os.listdir(DATA / "runs"))
_probe("other-run", lambda: os.listdir(VICTIM))
_probe("other-spec", lambda: (VICTIM / "spec.json").read_text())
_probe("other-log", lambda: (VICTIM / "train.log").read_text())
print(f"remote code ran as uid {os.getuid()}", flush=True)


class AttackForCausalLM(LlamaForCausalLM):
    pass
"""


def _interpreter(user: pwd.struct_passwd) -> str | None:
    """An interpreter of this Python version that the run user may execute (this venv's may sit under
    root's 0700 home); the venv's packages come through PYTHONPATH. None: this machine has none."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, f"/usr/bin/python{want}", f"/usr/local/bin/python{want}"):
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                user=user.pw_uid,
                group=user.pw_gid,
                extra_groups=[],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        if out.stdout.strip() == want:
            return candidate
    return None


def _real_launch_blocked(run_users: dict[str, pwd.struct_passwd]) -> str | None:
    """Why a real training run cannot start as a run user on this machine (the checkout or the packages
    out of its reach, no interpreter it may run), or None."""
    if _interpreter(run_users["bob"]) is None:
        return f"no python{sys.version_info[0]}.{sys.version_info[1]} that a run user may run"
    user = run_users["bob"]
    for path in (REPO / "trainer" / "__main__.py", Path(sysconfig.get_paths()["purelib"]) / "torch"):
        result = subprocess.run(["test", "-r", str(path)], user=user.pw_uid, group=user.pw_gid, check=False)
        if result.returncode != 0:
            return f"{path} is out of a run user's reach (the checkout or the venv sits in a private folder)"
    return None


def _private(mode: int) -> bool:
    return mode & 0o077 == 0


@pytest.mark.slow
def test_without_a_run_user_the_launch_gets_no_service_secret_and_files_are_owner_only(
    shared_up: Deployment,
) -> None:
    spec = base_spec()
    spec["name"] = "envdump"  # the stand-in interpreter writes its environment to env.json
    with shared_up.client(TOKENS["sec"]) as c:
        r = c.post("/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    job = JobsApi(shared_up.url, TOKENS["sec"]).wait_terminal(job_id, timeout=120)
    assert job["status"] == "succeeded", shared_up.report(job_id)
    run = shared_up.run_dir(job_id)
    env = json.loads((run / "env.json").read_text())
    assert not {"FTQ_API_TOKENS", "FTQ_DATABASE_URL", "FTQ_BROKER_URL"} & set(env)
    assert env["HF_TOKEN"] == HF_TOKEN  # named in FTQ_PASS_ENV
    assert "WANDB_API_KEY" not in env  # in the worker's environment, but FTQ_PASS_ENV does not name it
    values = "\n".join(env.values())
    assert not [t for t in TOKENS.values() if t in values] and WANDB_KEY not in values
    data = shared_up.data_dir
    for path in (run, data / "ftq.db", *(run / n for n in ("spec.json", "train.log", "launch.sh"))):
        assert _private(path.stat().st_mode), f"{path} is {oct(path.stat().st_mode)}"
    # The data dir and runs/ (made 0755 by the harness) keep at most search for others: nothing listed.
    for path in (data, data / "runs"):
        assert path.stat().st_mode & 0o066 == 0, f"{path} is {oct(path.stat().st_mode)}"
    # What the run itself wrote, too (its umask).
    assert _private((run / "env.json").stat().st_mode)


@pytest.fixture(scope="module")
def run_users() -> dict[str, pwd.struct_passwd]:
    return harness_run_users()


@contextmanager
def _isolated(run_users: dict[str, pwd.struct_passwd], mode: Mode) -> Iterator[Deployment]:
    """A deployment as root with a run user per owner. Its folders are outside pytest's tmp (root's,
    0700), so that a run user can reach its run directory at all."""
    base = Path(tempfile.mkdtemp(prefix="ftq-runas-"))
    base.chmod(0o711)
    logs = base / "logs"
    logs.mkdir(mode=0o700)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    bin_dir.chmod(0o755)
    stub = bin_dir / "python"
    site = sysconfig.get_paths()["purelib"]
    interpreter = _interpreter(run_users["bob"]) or "false"  # then only the stand-in jobs run
    stub.write_text(JOB_CODE.replace("@INTERPRETER@", interpreter).replace("@SITE@", site))
    stub.chmod(0o755)
    assets = base / "assets"
    config_only_model(assets / "model")
    text_dataset(assets / "data" / "train.jsonl")
    data = base / "data"
    dep = Deployment(
        logs,
        mode=mode,
        data_dir=data,
        tokens=OWNER_TOKENS,
        env={"HF_TOKEN": HF_TOKEN, "OPERATOR_DB_PASSWORD": OPERATOR_SECRET},
        settings={
            "run_as_user": ",".join(f"{o}:{u}" for o, u in RUN_USERS.items()),
            "python": stub,
            "local_roots": assets,
            "pass_env": "HF_TOKEN",
            "database_url": f"sqlite:///{data / 'ftq.db'}",
            "broker_url": "filesystem://",
            "cancel_grace_seconds": 5,
            "allow_remote_code": "bob",
        },
    )
    try:
        with dep:
            yield dep
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def isolated(run_users: dict[str, pwd.struct_passwd]) -> Iterator[Deployment]:
    """`ftq up`: API, worker and scheduler in one command."""
    with _isolated(run_users, "up") as dep:
        yield dep


@pytest.fixture(scope="module")
def isolated_split(run_users: dict[str, pwd.struct_passwd]) -> Iterator[Deployment]:
    """`ftq api` and `ftq worker` as two processes: the API's environment is a second one to reach."""
    with _isolated(run_users, "api+worker") as dep:
        yield dep


def _run(dep: Deployment, owner: str, name: str) -> str:
    spec = base_spec()
    spec["name"] = name
    return str(JobsApi(dep.url, OWNER_TOKENS[owner]).post_job(spec)["id"])


def _served_log(dep: Deployment, owner: str, job_id: str) -> str:
    with dep.client(OWNER_TOKENS[owner]) as c:
        r = c.get(f"/jobs/{job_id}/logs", params={"offset": 0, "limit": 1_048_576})
        assert r.status_code == 200, r.text
        return str(r.json()["text"])


@pytest.mark.slow
@pytest.mark.parametrize("deployment", ["isolated", "isolated_split"])
def test_a_run_as_its_run_user_reads_no_secret_no_store_and_no_other_run(
    deployment: str, request: pytest.FixtureRequest, run_users: dict[str, pwd.struct_passwd]
) -> None:
    dep: Deployment = request.getfixturevalue(deployment)
    alice, bob = JobsApi(dep.url, OWNER_TOKENS["alice"]), JobsApi(dep.url, OWNER_TOKENS["bob"])
    victim = _run(dep, "alice", "victim")
    assert alice.wait_terminal(victim, timeout=120)["status"] == "succeeded", dep.report(victim)
    # The API and the worker still read what a run user's run wrote, and the run wrote as that user.
    assert f"victim ran as {RUN_USERS['alice']}" in _served_log(dep, "alice", victim)
    notes = dep.run_dir(victim) / "notes.txt"
    assert notes.stat().st_uid == run_users["alice"].pw_uid
    (dep.data_dir.parent / "bin" / "target").write_text(str(dep.run_dir(victim)))

    attack = _run(dep, "bob", "attack")
    assert bob.wait_terminal(attack, timeout=120)["status"] == "succeeded", dep.report(attack)
    log = _served_log(dep, "bob", attack)
    assert f"attack ran as {RUN_USERS['bob']}" in log, log
    lines = {line.split(":", 1)[0]: line for line in log.splitlines()}
    for probe in PROBES:
        assert f"DENIED {probe}" in lines, (probe, log)
        assert "Permission denied" in lines[f"DENIED {probe}"], (probe, log)
    assert "READ " not in log, log
    # The worker read the victim's metrics (a run user's file) but not through the attacker's symlink.
    with dep.client(OWNER_TOKENS["alice"]) as c:
        assert [p["loss"] for p in c.get(f"/jobs/{victim}/metrics").json()["data"]] == [4.2424]
    with dep.client(OWNER_TOKENS["bob"]) as c:
        assert c.get(f"/jobs/{attack}/metrics").json()["data"] == []
    run = dep.run_dir(attack)
    loot = (run / "loot.txt").read_text() if (run / "loot.txt").exists() else ""
    own_env = (run / "env.txt").read_text()
    for text in (log, loot, own_env):
        for secret in (*OWNER_TOKENS.values(), OPERATOR_SECRET, "victim-private-notes"):
            assert secret not in text
    assert not {"FTQ_API_TOKENS", "FTQ_DATABASE_URL", "FTQ_BROKER_URL", "OPERATOR_DB_PASSWORD"} & {
        line.split("=", 1)[0] for line in own_env.splitlines()
    }
    for path in (dep.data_dir / "ftq.db", dep.run_dir(victim), run, run / "spec.json", run / "train.log"):
        assert path.stat().st_mode & 0o007 == 0, f"{path} is {oct(path.stat().st_mode)}"


@pytest.mark.slow
def test_a_run_user_reads_the_uploaded_dataset_of_its_own_job(isolated: Deployment) -> None:
    # Uploads live in the data dir, which a run user cannot enter: the job gets a copy in its run dir.
    rows = b'{"text": "uploaded rows for alice"}\n' * 4
    with isolated.client(OWNER_TOKENS["alice"]) as c:
        r = c.post("/files", content=rows, headers={"Content-Type": "application/jsonl"})
        assert r.status_code == 201, r.text
        file_id = r.json()["id"]
        wait_until("the upload validated", lambda: c.get(f"/files/{file_id}").json()["status"] == "ready")
    spec = base_spec()
    spec["name"] = "uploaded"
    spec["dataset"] = {"file_id": file_id, "text_field": "text"}
    alice = JobsApi(isolated.url, OWNER_TOKENS["alice"])
    job_id = str(alice.post_job(spec)["id"])
    assert alice.wait_terminal(job_id, timeout=120)["status"] == "succeeded", isolated.report(job_id)
    log = _served_log(isolated, "alice", job_id)
    assert 'uploaded read: {"text": "uploaded rows' in log, log


@pytest.mark.slow
def test_a_run_users_run_is_cancelled_by_the_worker(
    isolated: Deployment, run_users: dict[str, pwd.struct_passwd]
) -> None:
    """Signals cross users (the worker is root): cancel stops the run and every process of it."""
    bob = JobsApi(isolated.url, OWNER_TOKENS["bob"])
    job_id = _run(isolated, "bob", "sleeper")
    bob.wait_for(job_id, lambda j: j["status"] == "running", timeout=60, what="running")
    pgid = isolated.pgid_of(job_id)

    def members() -> list[int]:
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat[stat.rfind(")") + 2 :].split()[2]) == pgid:
                    out.append(int(entry))
        return out

    sleeping = wait_until("the sleeper", lambda: [p for p in members() if Path(f"/proc/{p}/comm").exists()])
    uids = {Path(f"/proc/{p}/status").read_text().split("\nUid:")[1].split()[0] for p in sleeping}
    assert uids == {str(run_users["bob"].pw_uid)}, uids
    assert bob.cancel(job_id)["status"] in ("cancelling", "cancelled")
    assert bob.wait_terminal(job_id, timeout=60)["status"] == "cancelled"
    wait_gone(sleeping, timeout=30)


@pytest.mark.slow
def test_fifos_left_by_a_run_do_not_stall_the_worker(isolated: Deployment) -> None:
    bob, alice = JobsApi(isolated.url, OWNER_TOKENS["bob"]), JobsApi(isolated.url, OWNER_TOKENS["alice"])
    jam = _run(isolated, "bob", "jam")
    assert bob.wait_terminal(jam, timeout=60)["status"] == "failed", isolated.report(jam)
    # The sweeps go on: the next job is launched, ingested and settled.
    after = _run(isolated, "alice", "victim")
    assert alice.wait_terminal(after, timeout=60)["status"] == "succeeded", isolated.report(after)


@pytest.mark.slow
def test_remote_code_as_a_run_user_reads_nothing_and_the_job_trains(
    isolated: Deployment, run_users: dict[str, pwd.struct_passwd]
) -> None:
    """What the attack on issue 18 did, for real: a model repo whose code the operator allowed for bob
    runs inside bob's launch (the real accelerate and trainer) and tries every read."""
    blocked = _real_launch_blocked(run_users)
    # The machine must let a run user reach the checkout and its venv (.ci/run sees to it); a skip here
    # would leave run isolation proven only by stand-in jobs.
    assert blocked is None, (
        f"a real training run cannot start as a run user here: {blocked}; "
        "give the folders above the checkout the search bit for others (chmod o+x), as .ci/run does"
    )
    dep = isolated
    victim = _run(dep, "alice", "victim")
    assert JobsApi(dep.url, OWNER_TOKENS["alice"]).wait_terminal(victim, timeout=120)["status"] == "succeeded"
    assets = dep.data_dir.parent / "assets"
    model = assets / "remote-model"
    shutil.copytree(REPO / "examples" / "tiny" / "model", model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "attack.AttackForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "attack.py").write_text(REMOTE_CODE.replace("@VICTIM@", repr(str(dep.run_dir(victim)))))
    shutil.copy(REPO / "examples" / "tiny" / "data" / "train.jsonl", assets / "data" / "tiny.jsonl")
    # The run user reads the model and the data (make install saves the tiny weights 0600).
    for path in (*model.iterdir(), assets / "data" / "tiny.jsonl"):
        path.chmod(0o644)
    spec = {
        "name": "remote",
        "model": {"name_or_path": "./remote-model", "trust_remote_code": True},
        "dataset": {"name_or_path": "./data/tiny.jsonl", "text_field": "text"},
        "training": {
            "max_steps": 4,
            "max_seq_len": 64,
            "per_device_train_batch_size": 2,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "mixed_precision": "no",
        },
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "resources": {"device": "cpu", "processes_per_node": 1},
    }
    bob = JobsApi(dep.url, OWNER_TOKENS["bob"])
    job_id = str(bob.post_job(spec)["id"])
    job = bob.wait_terminal(job_id, timeout=480)
    log = _served_log(dep, "bob", job_id)
    assert job["status"] == "succeeded", (job, log[-4000:])
    assert f"remote code ran as uid {run_users['bob'].pw_uid}" in log, log[-4000:]
    lines = {line.split(":", 1)[0]: line for line in log.splitlines() if line.startswith(("DENIED", "READ"))}
    for probe in PROBES:
        assert "PermissionError" in lines.get(f"DENIED {probe}", ""), (probe, lines)
    assert not [line for line in lines if line.startswith("READ")], lines
    # The run trained as bob: its points reached the API and its adapter is bob's.
    with dep.client(OWNER_TOKENS["bob"]) as c:
        points = c.get(f"/jobs/{job_id}/metrics").json()["data"]
    assert [p["step"] for p in points if p["loss"] is not None] == [1, 2, 3, 4], points
    final = dep.run_dir(job_id) / "final"
    assert final.is_dir() and final.stat().st_uid == run_users["bob"].pw_uid
