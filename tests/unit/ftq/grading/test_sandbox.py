"""A python grader's batch (ftq.grading.sandbox.run_python) against the red-team pass of issue 48: each
attack below succeeded against the in-process audit hook alone, and each is held now."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits, run_python
from ftq.sandbox import SandboxUnavailable

LIMITS = Limits(cpu_seconds=5, memory_mb=512, timeout_seconds=10, processes=16)


def _grade(body: str, limits: Limits = LIMITS) -> float:
    source = "import os, sys\ndef grade(sample, item):\n" + "".join(
        f"    {line}\n" for line in body.splitlines()
    )
    return run_python("hostile", source, [({"output_text": "x"}, {})], limits)[0]


def test_no_process_environment_is_readable() -> None:
    # Finding 1: the grader was the API's child and read FTQ_API_TOKENS from /proc/<ppid>/environ. The
    # caller here is a process started with the secret in its environment, as `ftq up` is.
    secret = uuid.uuid4().hex
    body = f"""
seen = ''
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['self', str(os.getppid())]:
    try:
        seen += open('/proc/%s/environ' % pid).read()
    except OSError:
        pass
return float({secret!r} in seen) + float(len(os.environ) > 2)
"""
    source = "import os, sys\ndef grade(sample, item):\n" + "".join(
        f"    {line}\n" for line in body.splitlines()
    )
    call = (
        "import json, sys\nfrom ftq.grading.sandbox import Limits, run_python\n"
        "print(run_python('hostile', sys.stdin.read(), [({}, {})], Limits())[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", call],
        input=source,
        capture_output=True,
        text=True,
        env={**os.environ, "FTQ_API_TOKENS": f"{secret}:alice"},
        check=True,
    )
    assert out.stdout.strip() == "0.0", out


def test_rebinding_the_hooks_names_does_not_switch_it_off() -> None:
    # Finding 2: the hook looked up _DENIED and str when it ran; two assignments disarmed it.
    body = """
main = sys.modules['__main__']
main._DENIED = ('zzzz',)
main.str = lambda x: 'zzzz'
return float(len(os.popen('id').read()))
"""
    with pytest.raises(GraderError) as err:
        _grade(body)
    assert "the grader sandbox refuses" in err.value.message, err.value.message


def test_the_deadline_holds_and_leaves_no_process() -> None:
    token = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(GraderError, match="wall-clock limit") as err:
        _grade(f"import time\nsys.argv[0] = {token!r}\ntime.sleep(300)", Limits(timeout_seconds=2))
    assert err.value.limit == "wall_clock"
    assert time.monotonic() - started < 20  # liveness, with room for a loaded machine
    alive = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).find(token) >= 0]
    assert alive == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_output_is_capped_while_it_streams() -> None:
    # Finding 5: 400 MiB on stderr was buffered whole in the API (114 MB -> 935 MB of RSS).
    limits = Limits(timeout_seconds=60, cpu_seconds=60, output_bytes=1 << 20)
    with pytest.raises(GraderError, match="output limit") as err:
        _grade("while True:\n    sys.stderr.write('y' * 65536)", limits)
    assert err.value.limit == "output"


def test_files_in_dev_shm_do_not_outlive_the_grader() -> None:
    token = uuid.uuid4().hex
    assert _grade(f"open('/dev/shm/{token}', 'w').write('x')\nreturn 1.0") == 1.0
    assert not Path(f"/dev/shm/{token}").exists()
    assert _grade(f"return float(os.path.exists('/dev/shm/{token}'))") == 0.0


@pytest.mark.parametrize(
    "fake",
    [
        '{"rewards": [null]}',
        '{"rewards": [[1]]}',
        '{"kind": "memory"}',
        '{"rewards": ["nan"]}',
        '{"rewards": [1e999]}',
        '{"rewards": [NaN]}',
        '{"rewards": [true]}',
        "[1]",
        '{"error": [1]}',
    ],
)
def test_a_faked_answer_is_the_graders_own_error(fake: str) -> None:
    # Finding 8: writing the child's answer to the real stdout gave a 500, or a 200 with reward null.
    body = f"sys.__stdout__.write({fake!r})\nsys.__stdout__.flush()\nos._exit(0)"
    with pytest.raises(GraderError) as err:
        _grade(body)
    assert err.value.grader == "hostile"


def test_a_missing_sandbox_refuses_the_grader() -> None:
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        _grade("return 1.0", Limits(bwrap="/nonexistent/bwrap"))
