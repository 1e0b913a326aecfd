"""The tenant-code boundary (ftq.sandbox) against the attacks of the red-team pass (issue 48): a sandboxed
command reads no secret of its caller (environment, /proc of the parent, the service's files), reaches no
network, leaves nothing behind in /tmp or /dev/shm, cannot make a user namespace to nsenter with, dies
with its whole tree at the deadline (a setsid grandchild included), and has its output capped while it
streams. Each attack runs as root (as CI does) and from an unprivileged caller (a run user)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ftq import sandbox
from ftq.sandbox.boundary import SANDBOX_ID, argv, interpreter_paths
from tests.harness.users import run_users

PYTHON, FOLDERS = interpreter_paths("/usr/bin/python3")


def _box(code: str, **kwargs: object) -> sandbox.Box:
    return sandbox.Box(argv=(PYTHON, "-I", "-S", "-c", code), read_only=tuple(FOLDERS), **kwargs)  # type: ignore[arg-type]


def _run(code: str, *, timeout: float = 30, **kwargs: object) -> sandbox.Outcome:
    return sandbox.run(_box(code, **kwargs), timeout=timeout)


@pytest.fixture(params=["root", "run user"])
def who(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Who starts bwrap: the service's own user (root here), or an unprivileged run user."""
    if request.param == "root":
        return {"uid": None, "gid": None}
    alice = run_users()["alice"]
    return {"uid": alice.pw_uid, "gid": alice.pw_gid}


def test_the_command_line_unshares_every_namespace_and_binds_only_what_it_is_given() -> None:
    box = sandbox.Box(argv=("/x/python", "-c", "pass"), read_only=("/opt/py",), writable=("/srv/out",))
    args = argv(box, root_entries=["--symlink", "usr/bin", "/bin"])
    for flag in ("--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-net", "--unshare-ipc"):
        assert flag in args
    assert args[args.index("--uid") + 1] == str(SANDBOX_ID)
    binds = [args[i + 1] for i, a in enumerate(args) if a in ("--ro-bind", "--bind", "--dev-bind")]
    assert binds == ["/usr", "/opt/py", "/srv/out"]
    assert args[args.index("--ro-bind", args.index("/opt/py") - 1) + 1] == "/opt/py"
    assert args[args.index("--bind") + 1] == "/srv/out"
    assert "--clearenv" in args and "--die-with-parent" in args
    assert args[args.index("--") + 1 :] == ["/x/python", "-c", "pass"]


def test_the_deadline_holds_inside_too() -> None:
    args = argv(sandbox.Box(argv=("/x/python",)), timeout=30, root_entries=[])
    assert args[args.index("--") :] == ["--", "/usr/bin/timeout", "--signal=KILL", "31", "/x/python"]


def test_no_secret_of_the_caller_is_readable(
    who: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("FTQ_API_TOKENS", f"{secret}:alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secret)
    (tmp_path / "ftq.db").write_text(secret)
    code = f"""
import os
seen = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for name in ('environ', 'cmdline'):
            try:
                seen.append(open('/proc/%s/%s' % (pid, name), 'rb').read().decode(errors='replace'))
            except OSError:
                pass
seen.append(repr(dict(os.environ)))
for path in ({str(tmp_path / "ftq.db")!r}, '/proc/%d/environ' % os.getppid(), '/etc/shadow', '/root'):
    try:
        seen.append(open(path).read())
    except OSError as e:
        seen.append(type(e).__name__)
print(os.getpid(), os.getuid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))
print('\\n'.join(seen))
"""
    out = _run(code, env={"LANG": "C.UTF-8"}, **who)
    text = out.stdout.decode()
    assert out.returncode == 0, out
    assert secret not in text
    assert "FTQ_" not in text and "MLFLOW" not in text
    first = text.splitlines()[0].split(maxsplit=2)
    # Its own pid namespace: bwrap's first process (1), the deadline's `timeout` (2) and the command (3),
    # nothing of the host's.
    assert first[1] == str(SANDBOX_ID) and first[2] == "['1', '2', '3']", first


def test_no_network_reaches_a_port_listening_on_the_host(who: dict[str, Any]) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = f"""
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), 2)
    print('CONNECTED')
except OSError as e:
    print('refused', e)
print(open('/proc/net/dev').read().count(':'))
"""
        out = _run(code, **who)
        with pytest.raises(OSError):
            server.accept()
    lines = out.stdout.decode().splitlines()
    assert lines[0].startswith("refused"), lines
    assert lines[1] == "1", "an interface besides the sandbox's own loopback"


def test_no_user_namespace_to_enter_the_callers_with(who: dict[str, Any]) -> None:
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
    print('UNSHARED')
else:
    print('refused', ctypes.get_errno())
if libc.setns(os.open('/proc/1/ns/net', os.O_RDONLY), 0) == 0:
    print('JOINED')
else:
    print('refused', ctypes.get_errno())
"""
    out = _run(code, **who).stdout.decode()
    assert "UNSHARED" not in out and "JOINED" not in out and out.count("refused") == 2, out


def test_tmp_and_shm_vanish_with_the_sandbox(who: dict[str, Any]) -> None:
    token = uuid.uuid4().hex
    write = f"open('/dev/shm/{token}', 'w').write('x'); open('/tmp/{token}', 'w').write('x'); print('ok')"
    assert _run(write, **who).stdout == b"ok\n"
    assert not Path(f"/dev/shm/{token}").exists() and not Path(f"/tmp/{token}").exists()
    look = f"import os; print(os.path.exists('/dev/shm/{token}') or os.path.exists('/tmp/{token}'))"
    assert _run(look, **who).stdout == b"False\n"
    # Bounded: a private /tmp of 1 MiB is full at 1 MiB, whatever the host has.
    fill = "open('/tmp/big', 'wb').write(b'x' * (4 << 20))"
    out = _run(fill, tmp_bytes=1 << 20, **who)
    assert out.returncode != 0 and b"No space left" in out.stderr, out


def test_the_deadline_kills_the_whole_tree(who: dict[str, Any]) -> None:
    token = uuid.uuid4().hex
    # A grandchild in a session of its own, holding stdout open, outliving its parent's sleep.
    code = f"""
import subprocess, sys, time
subprocess.Popen(['/bin/sh', '-c', 'exec -a {token} sleep 120'], start_new_session=True)
print('started', flush=True)
time.sleep(120)
"""
    started = time.monotonic()
    out = _run(code, timeout=2, **who)
    took = time.monotonic() - started
    assert out.timed_out and out.stdout == b"started\n", out
    assert took < 20, took  # liveness: the deadline is 2 s, the pipes are not waited on forever
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert token not in ps


def test_output_is_capped_while_it_streams(who: dict[str, Any]) -> None:
    code = "import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n"
    box = _box(code, **who)
    out = sandbox.run(box, timeout=60, max_output=4 << 20, stderr_tail=4096)
    assert out.output_exceeded and not out.timed_out
    assert len(out.stderr) <= 4096 and len(out.stdout) == 0


def test_a_missing_bwrap_is_refused_with_the_fix() -> None:
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox.run(sandbox.Box(argv=("/bin/true",), bwrap="/nonexistent/bwrap"), timeout=5)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox.check("/nonexistent/bwrap")


def test_an_unprivileged_caller_cannot_become_another_user() -> None:
    """The run user's switch needs root; a non-root service asking for another uid is refused."""
    alice = run_users()["alice"]
    code = (
        "import os\nfrom ftq import sandbox\n"
        "try:\n"
        "    sandbox.run(sandbox.Box(argv=('/bin/true',), uid=12345), timeout=5)\n"
        "except sandbox.SandboxUnavailable as e:\n"
        "    print('refused:', e.reason)\n"
    )
    out = subprocess.run(
        ["/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        user=alice.pw_uid,
        group=alice.pw_gid,
        extra_groups=[],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(Path.cwd())},
        check=False,
    )
    assert "refused: only root can start the sandbox as uid 12345" in out.stdout, out
