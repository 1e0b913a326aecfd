"""Real failing runs through a real `ftq up`: each ends `failed` with the contract's error code and a
message that says what to change.

Produced for real on a CPU machine: a dataset without its text field, a model folder without weights,
a LoRA target the model lacks, the kernel's OOM killer under a cgroup memory limit, a SIGKILL that was
not the OOM killer, and a full disk (a 1 MiB tmpfs). GPU and cluster failures are in test_classifier.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Deployment, no_text_field_folder, run_pids, tiny_spec
from tests.integration.preflight.conftest import TRACKER_PASSWORD
from tests.integration.preflight.deployments import running_up


@pytest.fixture(scope="module")
def early(quick_up: Deployment, tiny_dir: Path) -> dict[str, str]:
    """The jobs that fail on their own, posted together so they run side by side."""
    no_field = tiny_spec(tiny_dir, name="no-text-field")
    no_field["dataset"]["name_or_path"] = str(no_text_field_folder(quick_up.data_dir))
    bad_target = tiny_spec(tiny_dir, name="bad-lora-target")
    bad_target["lora"]["target_modules"] = ["q_proj", "query_key_value"]
    tracked = tiny_spec(tiny_dir, name="tracker-down")
    tracked["integrations"] = {"mlflow": {"experiment": "down"}}
    return {
        "dataset": quick_up.post_job(no_field)["id"],
        "lora": quick_up.post_job(bad_target)["id"],
        "tracker": quick_up.post_job(tracked)["id"],
    }


def test_dataset_without_its_text_field(quick_up: Deployment, early: dict[str, str]) -> None:
    job = quick_up.wait_terminal(early["dataset"])
    assert job["status"] == "failed", job
    err = job["error"]
    assert err["code"] == "dataset_error", err
    # Names the missing field, what the data has instead, and the spec field to set.
    assert "'text'" in err["message"] and "body" in err["message"], err
    assert "dataset.text_field" in err["message"], err
    assert err["exit_code"] != 0


def test_a_tracker_that_is_down_fails_the_job_in_seconds_with_tracker_error(
    quick_up: Deployment, early: dict[str, str]
) -> None:
    """Issue 28, finding 6 (FTQ_TRACKER_FAILURE=fail): the trainer's check, before the model loads,
    finds the MLflow port closed; the job fails with `tracker_error`, not `unknown` after minutes of
    retries. Finding 3: the operator's password is in no answer, log line or event."""
    job = quick_up.wait_terminal(early["tracker"])
    assert job["status"] == "failed", job
    err = job["error"]
    assert err["code"] == "tracker_error", (err, quick_up.train_log(early["tracker"])[-2000:])
    assert "FTQ_MLFLOW_TRACKING_URI" in err["message"] and "FTQ_TRACKER_FAILURE=fail" in err["message"]
    assert "http://127.0.0.1:" in err["message"]
    events = quick_up.get(f"/jobs/{early['tracker']}/events")
    for text in (str(job), str(events), quick_up.train_log(early["tracker"])):
        assert TRACKER_PASSWORD not in text and "ftq-op" not in text
    # Failed before the launch was set up and the model loaded (the `strategy ...` line comes after).
    assert "process(es), device" not in quick_up.train_log(early["tracker"])


def test_model_folder_without_weights_is_refused_at_post(quick_up: Deployment, tiny_dir: Path) -> None:
    spec = tiny_spec(tiny_dir, name="no-weights")
    spec["model"]["name_or_path"] = str(tiny_dir / "model-no-weights")
    r = quick_up.http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    err = next(e for e in r.json()["detail"] if e["loc"] == ["body", "model", "name_or_path"])
    assert "has no weights" in err["msg"] and "model.safetensors" in err["msg"]


def test_lora_target_module_that_does_not_exist(quick_up: Deployment, early: dict[str, str]) -> None:
    job = quick_up.wait_terminal(early["lora"])
    assert job["status"] == "failed", job
    err = job["error"]
    assert err["code"] == "model_error", err
    assert "query_key_value" in err["message"] and "not found" in err["message"]
    # The remedy: the names the model does have.
    assert "q_proj" in err["message"] and "all-linear" in err["message"]


def _trainer_pid(job_id: str, timeout: float = 180) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in run_pids(job_id):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"trainer" in argv and b"accelerate.commands.launch" not in argv:
                    return pid
        time.sleep(0.2)
    raise AssertionError(f"no trainer process for {job_id}")


def test_sigkill_that_was_not_the_oom_killer_is_not_called_oom(quick_up: Deployment, tiny_dir: Path) -> None:
    job = quick_up.post_job(tiny_spec(tiny_dir, max_steps=10_000, name="killed"))
    os.kill(_trainer_pid(job["id"]), signal.SIGKILL)
    ended = quick_up.wait_terminal(job["id"])
    assert ended["status"] == "failed"
    err = ended["error"]
    if os.access("/dev/kmsg", os.R_OK):
        assert err["code"] == "unknown", err
        assert "SIGKILL" in err["message"] and "no out-of-memory kill" in err["message"]
    else:  # without the kernel log the classifier can only say what is most likely
        assert err["code"] == "out_of_memory" and "could not be read" in err["message"]


@contextlib.contextmanager
def memory_cgroup(name: str, limit_bytes: int) -> Iterator[Path]:
    """A memory cgroup (v1 or v2) with a hard limit; yields the file that moves a process into it."""
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        group = v1 / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    elif "memory" in (v2 / "cgroup.controllers").read_text():
        group = v2 / name
        group.mkdir()
        (group / "memory.max").write_text(str(limit_bytes))
        (group / "memory.swap.max").write_text("0")
    else:
        raise AssertionError("no writable memory cgroup on this machine (v1 memory or v2 with memory)")
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def test_kernel_oom_kill_under_a_memory_limit(quick_up: Deployment, tiny_dir: Path) -> None:
    job = quick_up.post_job(tiny_spec(tiny_dir, max_steps=10_000, name="oom"))
    with memory_cgroup(f"ftq-oom-{job['id']}", 96 * 1024 * 1024) as procs:
        pid = _trainer_pid(job["id"])
        # The trainer goes into a 96 MiB cgroup while it starts: what it allocates from then on (torch,
        # transformers, the model, the batches) is counted against the limit, and the kernel's OOM killer
        # ends it, as on a host or a SLURM node with a memory limit.
        with contextlib.suppress(OSError):
            procs.write_text(str(pid))
        ended = quick_up.wait_terminal(job["id"])
    assert ended["status"] == "failed"
    err = ended["error"]
    assert err["code"] == "out_of_memory", (err, quick_up.train_log(job["id"])[-2000:])
    assert f"process {pid}" in err["message"] and "out-of-memory killer" in err["message"]
    assert "per_device_train_batch_size" in err["message"]


@pytest.mark.slow
def test_full_disk(tmp_path: Path, tiny_dir: Path) -> None:
    data = tmp_path / "data"
    runs = data / "runs"
    runs.mkdir(parents=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(runs)], capture_output=True, text=True
    )
    assert res.returncode == 0, f"this test needs root to mount a 1 MiB tmpfs: {res.stderr}"
    try:
        # The operator lets allow_oversubscribe skip the disk check, so the run can hit the wall.
        with running_up(tmp_path, tiny_dir, data_dir=data, allow_oversubscribe="true") as stack:
            spec: dict[str, Any] = tiny_spec(tiny_dir, max_steps=4, name="disk-full", save_steps=1)
            spec["lora"] = None  # full fine-tuning: the first checkpoint (weights + Adam) needs ~1.6 MB
            # Preflight would refuse it (that is its job); launch anyway to see the run hit the wall.
            assert stack.http.post("/jobs", json=spec).status_code == 422
            job = stack.post_job({**spec, "allow_oversubscribe": True})
            ended = stack.wait_terminal(job["id"])
            assert ended["status"] == "failed", ended
            err = ended["error"]
            assert err["code"] == "disk_full", (err, stack.train_log(job["id"])[-2000:])
            assert "save_total_limit" in err["message"]
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)
