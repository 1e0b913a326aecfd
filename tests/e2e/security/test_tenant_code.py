"""Tenant code against a real `ftq api` started with the operator's secrets (API tokens of several owners,
HF_TOKEN, WANDB_API_KEY in its environment): issue 48's red-team attacks, sent by bob over HTTP as python
graders (`POST /graders/run` and its `/v1` twin). Each grader hunts for every secret the service holds,
reports what it found in its own error message (so bob would read it back), and returns how many it found;
none is found, no port of the host answers, nothing outlives it, and no answer is a 5xx."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.e2e.security.common import HF_TOKEN, TOKENS, WANDB_KEY
from tests.harness import Deployment

BOB = TOKENS["bob"]
# What bob must never learn: another owner's token, the operator's hub and tracker keys.
SECRETS = (TOKENS["alice"], TOKENS["sec"], HF_TOKEN, WANDB_KEY)


@pytest.fixture(scope="module")
def server(shared: Deployment) -> Deployment:
    return shared


def _grade(server: Deployment, body: str, *, v1: bool = False) -> dict[str, Any]:
    source = "import os, sys\ndef grade(sample, item):\n" + "".join(
        f"    {line}\n" for line in body.splitlines()
    )
    grader = {"type": "python", "name": "bob", "source": source}
    path = "/v1/fine_tuning/alpha/graders/run" if v1 else "/graders/run"
    with server.client(BOB) as c:
        r = c.post(path, json={"grader": grader, "model_sample": "x"}, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _hunt(secrets: tuple[str, ...]) -> str:
    """A grader body that reads everything a process could read secrets from, and reports it."""
    return f"""
secrets = {list(secrets)!r}
seen = [repr(dict(os.environ))]
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['self', str(os.getppid())]:
    for name in ('environ', 'cmdline'):
        try:
            seen.append(open('/proc/%s/%s' % (pid, name), 'rb').read().decode(errors='replace'))
        except OSError as e:
            seen.append(repr(e))
for folder in ('/', '/tmp', '/root', '/work', '/home', '/etc'):
    try:
        seen.append(repr(os.listdir(folder)))
    except OSError as e:
        seen.append(repr(e))
text = ' | '.join(seen).replace(chr(10), ' ')
found = sum(s in text for s in secrets)
raise RuntimeError('FOUND %d; SAW %s' % (found, text[:4000]))
"""


@pytest.mark.parametrize("v1", [False, True])
def test_no_secret_of_the_service_is_readable_by_a_grader(server: Deployment, v1: bool) -> None:
    body = _grade(server, _hunt(SECRETS), v1=v1)
    message = body["metadata"]["errors"]["message"]
    assert "FOUND 0; SAW" in message, message
    for secret in SECRETS:
        assert secret not in message
        assert base64.b64encode(secret.encode()).decode()[:16] not in message
    # Nothing of the host's tree: no data dir, no checkout, no other process.
    assert str(server.data_dir) not in message
    assert "FTQ_" not in message


def test_the_hook_cannot_be_switched_off_and_programs_do_not_run(server: Deployment) -> None:
    body = """
main = sys.modules['__main__']
main._DENIED = ('zzzz',)
main.str = lambda x: 'zzzz'
return float(len(os.popen('cat /proc/1/environ; id').read()))
"""
    errors = _grade(server, body)["metadata"]["errors"]
    assert "the grader sandbox refuses" in errors["message"], errors


def test_no_port_on_the_host_answers(server: Deployment) -> None:
    port = urlparse(server.url).port
    body = f"""
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), 2)
    return 1.0
except OSError as e:
    raise RuntimeError('NOT CONNECTED: ' + repr(e))
"""
    # The audit hook refuses the socket first; the sandbox's network namespace is behind it.
    result = _grade(server, body)
    assert result["reward"] == 0.0, result
    assert (
        "NOT CONNECTED: PermissionError('the grader sandbox refuses socket"
        in result["metadata"]["errors"]["message"]
    )


def test_nothing_outlives_the_grader(server: Deployment) -> None:
    token = uuid.uuid4().hex
    body = f"open('/dev/shm/{token}', 'w').write('x')\nopen('/tmp/{token}', 'w').write('x')\nreturn 1.0"
    assert _grade(server, body)["reward"] == 1.0
    assert not Path(f"/dev/shm/{token}").exists() and not Path(f"/tmp/{token}").exists()


@pytest.mark.parametrize(
    "fake", ['{"rewards": [null]}', '{"rewards": [[1]]}', '{"kind": "memory"}', '{"rewards": [1e999]}']
)
def test_a_faked_answer_is_a_grader_error_not_a_5xx(server: Deployment, fake: str) -> None:
    body = f"sys.__stdout__.write({fake!r})\nsys.__stdout__.flush()\nos._exit(0)"
    result = _grade(server, body)
    assert result["reward"] == 0.0 and result["metadata"]["errors"]["code"] == "grader_error", result
