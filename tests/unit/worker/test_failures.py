"""The failure classifier on the exact text PyTorch, NCCL, SLURM and the kernel print (logs/ here).

These are the failures that need GPUs or a cluster to produce; the ones a CPU machine can produce for
real (dataset, model, LoRA targets, a kernel OOM kill under a cgroup limit, a full disk) run through
the service in tests/integration/preflight/test_failures.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker import failures

LOGS = Path(__file__).parent / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.mark.parametrize(
    ("fixture", "exit_code", "code", "remedy"),
    [
        # One rank's CUDA OOM makes the others time out in NCCL: the root cause wins.
        ("cuda_oom.log", 1, "out_of_memory", "gradient_checkpointing"),
        ("nccl_timeout.log", 1, "nccl_timeout", "NCCL_SOCKET_IFNAME"),
        ("rendezvous_addr_in_use.log", 1, "rendezvous_error", "port"),
        ("rendezvous_timeout.log", 1, "rendezvous_error", "reach each other"),
        ("disk_full.log", 1, "disk_full", "save_total_limit"),
        ("disk_full_safetensors.log", 1, "disk_full", "save_steps"),
        # SLURM's own line wins over the SIGTERM noise the kill causes.
        ("slurm_time_limit.log", 1, "time_limit", "resources.slurm.time_limit"),
        ("slurm_preempted.log", 1, "preempted", "resume_from"),
        ("slurm_node_failure.log", 1, "node_failure", "resume_from"),
    ],
)
def test_real_log_excerpts_map_to_their_code_and_remedy(
    fixture: str, exit_code: int, code: str, remedy: str
) -> None:
    f = failures.classify(exit_code=exit_code, log_tail=log(fixture))
    assert f.code == code, f
    assert remedy in f.message


def test_benign_rendezvous_and_nccl_lines_do_not_mislabel_an_ordinary_error() -> None:
    f = failures.classify(exit_code=1, log_tail=log("benign_rendezvous_then_value_error.log"))
    assert f.code == "unknown"
    assert "ValueError: tokenizer has no chat template" in f.message and "exited with code 1" in f.message


def test_a_sigkill_is_out_of_memory_when_the_kernel_log_names_the_killed_rank() -> None:
    tail = log("host_sigkill.log")
    f = failures.classify(exit_code=1, log_tail=tail, kernel_log=log("dmesg_oom_4151.log"))
    assert f.code == "out_of_memory"
    assert "process 4151 (python3)" in f.message and "per_device_train_batch_size" in f.message


def test_a_sigkill_the_kernel_log_does_not_explain_is_not_called_oom() -> None:
    tail = log("host_sigkill.log")
    # Another process's OOM kill (a different pid) is no evidence about this run.
    f = failures.classify(exit_code=1, log_tail=tail, kernel_log=log("dmesg_oom_other.log"))
    assert f.code == "unknown" and "SIGKILL" in f.message and "no out-of-memory kill" in f.message
    f = failures.classify(exit_code=137, log_tail="", kernel_log="")
    assert f.code == "unknown"


def test_kernel_messages_from_before_the_run_are_ignored() -> None:
    kernel = log("dmesg_oom_4151.log")
    assert failures.classify(exit_code=137, log_tail="", kernel_log=kernel).code == "out_of_memory"
    later = failures.classify(exit_code=137, log_tail="", kernel_log=kernel, since_uptime=2000.0)
    assert later.code == "unknown"


def test_without_a_readable_kernel_log_a_sigkill_is_a_probable_oom() -> None:
    f = failures.classify(exit_code=137, log_tail="")
    assert f.code == "out_of_memory" and "could not be read" in f.message


def test_scheduler_reasons_and_the_trainers_own_word() -> None:
    assert failures.classify(exit_code=None, log_tail="", reason="TIMEOUT").code == "time_limit"
    assert failures.classify(exit_code=None, log_tail="", reason="PREEMPTED").code == "preempted"
    assert failures.classify(exit_code=None, log_tail="", reason="NODE_FAIL").code == "node_failure"
    tail = log("nccl_timeout.log") + "\nftq-error: dataset_error: no column text; set dataset.text_field\n"
    f = failures.classify(exit_code=2, log_tail=tail)
    assert f == failures.Failure("dataset_error", "no column text; set dataset.text_field")


def test_a_full_disk_explains_a_run_that_could_not_log_its_error() -> None:
    f = failures.classify(exit_code=1, log_tail="{'loss': '2.0'}\n", disk_free=4096)
    assert f.code == "disk_full" and "4.0 KiB free when it ended" in f.message
    assert failures.classify(exit_code=1, log_tail="", disk_free=10 * 1024**3).code == "unknown"


def test_the_kernel_log_of_this_host_parses() -> None:
    text = failures.read_kernel_log()
    if text is None:
        assert not os.access("/dev/kmsg", os.R_OK)
        return
    for when, pid, comm in failures.kernel_oom_kills(text):
        assert when is None or when >= 0
        assert pid > 0 and comm
    assert failures.kernel_oom_kills(log("dmesg_oom_4151.log")) == [(1762.414093, 4151, "python3")]


# Classification from a log tail, an exit code and the scheduler's reason ------------------------------


@pytest.mark.parametrize(
    ("tail", "code", "reason", "exit_code"),
    [
        (
            "x\nftq-error: dataset_error: column 'text' not found; set dataset.text_field\n",
            "dataset_error",
            None,
            1,
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out_of_memory", None, 1),
        ("", "out_of_memory", None, 137),
        ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(5)", "nccl_timeout", None, 1),
        ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "rendezvous_error", None, 1),
        ("OSError: [Errno 28] No space left on device", "disk_full", None, 1),
        ("slurmstepd: error: *** JOB 12 CANCELLED DUE TO TIME LIMIT ***", "time_limit", "TIMEOUT", 0),
        ("", "preempted", "PREEMPTED", None),
        ("", "node_failure", "NODE_FAIL", None),
        ("ValueError: something odd", "unknown", None, 3),
    ],
)
def test_failures_are_classified(tail: str, code: str, reason: str | None, exit_code: int | None) -> None:
    f = failures.classify(exit_code=exit_code, log_tail=tail, reason=reason)
    assert f.code == code
    assert len(f.message) > 20
    if code == "dataset_error":
        assert f.message == "column 'text' not found; set dataset.text_field"
    if code == "unknown":
        assert "exited with code 3" in f.message and "ValueError: something odd" in f.message
