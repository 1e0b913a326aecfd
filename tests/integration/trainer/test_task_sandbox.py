"""An lm_eval suite's own task folder runs in the sandbox (trainer.task_sandbox), not in the evaluation
process: issue 48's finding 4, a task whose `doc_to_text: !function pwn.doc_to_text` imported a Python
file from the owner's folder and ran as the evaluation's user with the network open and its secrets in
the environment. The same task here scores as the shipped one does and finds none of that."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from ftq.contract.evaluation import LmEvalSuite
from ftq.contract.spec import JobSpec
from tests.harness import REPO
from trainer import task_sandbox
from trainer.errors import ModelError

TASKS = REPO / "examples" / "evaluation" / "tasks"
MODEL = REPO / "examples" / "tiny" / "model"

PWN = """
import os, socket, sys

def doc_to_text(doc):
    seen = []
    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
        try:
            seen.append(open('/proc/%s/environ' % pid).read())
        except OSError:
            pass
    seen.append(repr(dict(os.environ)))
    try:
        socket.create_connection(('127.0.0.1', {port}), 2)
        seen.append('NETWORK-REACHED')
    except OSError:
        pass
    for path in ({model!r} + '/pwned', {tasks!r} + '/pwned', {marker!r}):
        try:
            open(path, 'w').write('x')
            seen.append('WROTE ' + path)
        except OSError:
            pass
    sys.stderr.write('PWN-SAW ' + ' | '.join(seen).replace(chr(10), ' ') + chr(10))
    return doc['question']
"""


def _spec() -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"name_or_path": str(MODEL)},
            "dataset": {"name_or_path": str(REPO / "examples/tiny/data/train.jsonl"), "format": "text"},
            "training": {"max_steps": 1},
        }
    )


def _hostile_tasks(folder: Path, port: int, marker: Path) -> LmEvalSuite:
    folder.mkdir()
    (folder / "tiny_mc.jsonl").write_text((TASKS / "tiny_mc.jsonl").read_text())
    yaml = (
        (TASKS / "tiny_mc.yaml")
        .read_text()
        .replace('doc_to_text: "{{question}}"', "doc_to_text: !function pwn.doc_to_text")
    )
    assert "!function" in yaml
    (folder / "tiny_mc.yaml").write_text(yaml)
    (folder / "pwn.py").write_text(
        PWN.format(port=port, model=str(MODEL), tasks=str(folder), marker=str(marker))
    )
    return LmEvalSuite.model_validate(
        {"name": "bench", "type": "lm_eval", "tasks": ["tiny_mc"], "task_dir": str(folder)}
    )


def test_a_task_folders_code_sees_no_secret_no_network_and_writes_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = uuid.uuid4().hex
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secret)
    marker = tmp_path / "marker"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        suite = _hostile_tasks(tmp_path / "tasks", server.getsockname()[1], marker)
        metrics, detail = task_sandbox.run_lm_eval(suite, _spec(), MODEL, tmp_path / "out")
    err = capfd.readouterr().err
    assert "PWN-SAW" in err, err[-3000:]  # the task's code ran, in the sandbox
    assert secret not in err and "MLFLOW" not in err
    assert "NETWORK-REACHED" not in err
    # The folders it may read are read-only; a path under /tmp lands in its private /tmp, gone with it.
    assert f"WROTE {MODEL}" not in err and f"WROTE {tmp_path / 'tasks'}" not in err
    assert not marker.exists() and not (MODEL / "pwned").exists()
    assert set(metrics) == {"bench/tiny_mc/acc", "bench/tiny_mc/sample_len"} and detail["tasks"] == [
        "tiny_mc"
    ]
    assert not (tmp_path / "out" / ".sandbox-bench").exists()


def test_without_the_sandbox_the_task_folder_is_refused_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTQ_SANDBOX_BWRAP", "/nonexistent/bwrap")
    marker = tmp_path / "marker"
    suite = _hostile_tasks(tmp_path / "tasks", 9, marker)
    with pytest.raises(ModelError, match=r"task_dir runs only in the sandbox.*apt-get install bubblewrap"):
        task_sandbox.run_lm_eval(suite, _spec(), MODEL, tmp_path / "out")
    assert not marker.exists()
