"""The local launcher with FTQ_RUN_AS_USER, as root (as CI runs): a run starts as its owner's user in a
run directory opened to that user's group alone, and another owner's run cannot pass its processes off
as this run's by setting its marker (FTQ_JOB_ID): the worker neither waits for them nor signals them."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ftq.runtime.settings import Settings
from tests.harness.launching import launch_request
from tests.harness.users import RUN_USERS
from tests.harness.users import run_users as harness_run_users
from worker.launchers.base import RunPhase, RunRef
from worker.launchers.local import LocalLauncher, RunUser, cannot_run


@pytest.fixture(scope="module")
def users() -> dict[str, pwd.struct_passwd]:
    return harness_run_users()


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not under pytest's tmp (root's, 0700): a run user must be able to reach its run directory.
    base = Path(tempfile.mkdtemp(prefix="ftq-runuser-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_run_starts_as_its_owners_user_and_a_planted_marker_is_ignored(
    users: dict[str, pwd.struct_passwd], data_dir: Path
) -> None:
    alice, bob = users["alice"], users["bob"]
    # launch.sh is the test's own: FTQ_PYTHON need only be something the run user may run.
    mapping = ",".join(f"{o}:{u}" for o, u in RUN_USERS.items())
    launcher = LocalLauncher(Settings(data_dir=data_dir, run_as_user=mapping, python="/bin/sh"))
    run_dir = data_dir / "job_victim"
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text('id -u > whoami\nsleep 1\nprintf "0\\n" > exit_status\n')
    handle = launcher.submit(replace(launch_request("job_victim", run_dir), owner="alice"))
    mode = run_dir.stat()
    assert (stat.S_IMODE(mode.st_mode), mode.st_gid) == (0o1770, alice.pw_gid)
    # Bob's run starts a process that carries Alice's run's marker.
    squatter = subprocess.Popen(
        ["sleep", "120"],
        env={"PATH": os.environ["PATH"], "FTQ_JOB_ID": "job_victim"},
        user=bob.pw_uid,
        group=bob.pw_gid,
        extra_groups=[],
        start_new_session=True,
    )
    try:
        ref = RunRef("job_victim", run_dir, None, handle.pid, handle.pid_start_ticks)
        deadline = time.monotonic() + 20
        while launcher.poll([ref])["job_victim"].phase != RunPhase.exited and time.monotonic() < deadline:
            time.sleep(0.1)
        state = launcher.poll([ref])["job_victim"]
        assert (state.phase, state.exit_code) == (RunPhase.exited, 0), state
        assert (run_dir / "whoami").read_text().strip() == str(alice.pw_uid)
        launcher.kill_leftovers(ref)
        time.sleep(0.2)
        assert squatter.poll() is None, "the worker signalled another user's process"
    finally:
        squatter.kill()
        squatter.wait()


def test_an_owner_without_a_run_user_is_not_launched(
    users: dict[str, pwd.struct_passwd], data_dir: Path
) -> None:
    launcher = LocalLauncher(Settings(data_dir=data_dir, run_as_user="alice:ftq-run-test-a"))
    run_dir = data_dir / "job_carol"
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text("touch started\n")
    with pytest.raises(LookupError, match="carol"):
        launcher.submit(replace(launch_request("job_carol", run_dir), owner="carol"))
    assert not (run_dir / "started").exists()


def test_an_interpreter_the_run_user_cannot_run_is_a_clear_launch_error(
    users: dict[str, pwd.struct_passwd], data_dir: Path
) -> None:
    # As a venv under root's home (0700) is: every run would otherwise end in a bare "Permission denied".
    private = data_dir / "private"
    private.mkdir(mode=0o700)
    python = private / "python"
    python.write_text("#!/bin/sh\ntouch started\n")
    python.chmod(0o755)
    launcher = LocalLauncher(Settings(data_dir=data_dir, run_as_user="ftq-run-test-a", python=str(python)))
    run_dir = data_dir / "job_python"
    run_dir.mkdir()
    (run_dir / "launch.sh").write_text(f"{python}\n")
    with pytest.raises(PermissionError, match=f"FTQ_PYTHON {python} .*{private} is mode 700"):
        launcher.submit(replace(launch_request("job_python", run_dir), owner="alice"))
    assert not (run_dir / "started").exists()


def test_a_non_dumpable_leftover_of_a_run_is_still_its_own(
    users: dict[str, pwd.struct_passwd], data_dir: Path
) -> None:
    """A leftover of a run user's run (its own session, non-dumpable, which some kernels show as root's in
    /proc/<pid>) is still counted by its real uid: the run is not taken for ended while it lives, and the
    cleanup kills it across users."""
    alice = users["alice"]
    user = RunUser("ftq-run-test-a", alice.pw_uid, alice.pw_gid, alice.pw_dir)
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    python = next(
        (
            p
            for p in (sys.executable, f"/usr/bin/python{want}", "/usr/bin/python3")
            if not cannot_run(p, user)
        ),
        None,
    )
    assert python is not None, "no python the run user may run"
    launcher = LocalLauncher(Settings(data_dir=data_dir, run_as_user="ftq-run-test-a", python=python))
    run_dir = data_dir / "job_daemon"
    run_dir.mkdir()
    daemon = (
        "import ctypes, os, time; ctypes.CDLL(None).prctl(4, 0); "
        "open('daemon.pid', 'w').write(str(os.getpid())); time.sleep(120)"
    )
    (run_dir / "launch.sh").write_text(f'setsid {python} -c "{daemon}" &\nprintf "0\\n" > exit_status\n')
    handle = launcher.submit(replace(launch_request("job_daemon", run_dir), owner="alice"))
    ref = RunRef("job_daemon", run_dir, None, handle.pid, handle.pid_start_ticks)
    deadline = time.monotonic() + 20
    while not (run_dir / "daemon.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int((run_dir / "daemon.pid").read_text())
    try:
        time.sleep(0.5)  # launch.sh has ended; its daemon has not
        assert launcher.poll([ref])["job_daemon"].phase == RunPhase.running
        launcher.kill_leftovers(ref)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, "the run's leftover survived the cleanup"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def test_the_worker_says_at_start_what_would_stop_a_launch(
    users: dict[str, pwd.struct_passwd], data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mapping = "alice:ftq-run-test-a,bob:ftq-no-such-user,*:root"
    with caplog.at_level(logging.ERROR, logger="worker.launchers.local"):
        LocalLauncher(Settings(data_dir=data_dir, run_as_user=mapping, python="/bin/sh"))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "'ftq-no-such-user', who does not exist" in said[0]
    assert "'root' is root" in said[1]
