"""Stop before the end with a checkpoint: on SLURM's warning before the time limit (SIGUSR1) or on SIGTERM.

How a signal gets here: SLURM sends `--signal=B:USR1@<grace>` to the batch script alone; job.sbatch
passes it to srun, which forwards it to each node's `accelerate launch`; torch's elastic agent passes it
on to its ranks (job.sbatch lists SIGUSR1 in PET_SIGNALS_TO_HANDLE and gives the agent the grace as its
shutdown timeout). A cancel sends SIGTERM: locally to every rank (not to torch's agent, which ends by
itself once its ranks have), on SLURM to every step. A signal reaches the ranks at different moments, or
only some of them, so no rank acts
on its own: at each step boundary the ranks agree (one all-reduce of a small integer) and all of them
save the same checkpoint and stop after the same step. The trainer then exits with EXIT_CHECKPOINTED and
one `ftq-error:` line naming the checkpoint, and the service queues it again (`time_limit` with
`resources.slurm.requeue_on_timeout`); after a cancel (the worker's `cancel.json` is in the run directory)
every rank exits 0 with no `ftq-error:` line, and the worker ends the log with one line of its own.

Before training starts there is nothing to save: SIGTERM then ends the process as it always did. A
SIGUSR1 that comes during loading is remembered and acted on at the first step boundary.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from ftq.contract import runs
from ftq.contract.errors import USER_ERROR_PREFIX, ErrorCode

log = logging.getLogger("trainer")

# EX_TEMPFAIL: "try again later", which is what a run stopped with a checkpoint asks for.
EXIT_CHECKPOINTED = 75

# What each signal means to the service, and the message it shows the user.
_MEANING = {
    signal.SIGUSR1: (
        ErrorCode.time_limit,
        "the SLURM time limit was near (SIGUSR1)",
        "with resources.slurm.requeue_on_timeout the job is queued again and resumes there; otherwise "
        "submit it again with resume_from, or raise resources.slurm.time_limit",
    ),
    signal.SIGTERM: (
        ErrorCode.preempted,
        "the run was asked to stop (SIGTERM: a cancel, a preemption or the time limit)",
        "submit it again with resume_from to continue there",
    ),
}


class StopOnSignal:
    """The state of one process: which stop signal it received, and what all ranks agreed on."""

    def __init__(self) -> None:
        self.received: int = 0  # a signal number; 0: none
        self.agreed: int = 0  # what the ranks agreed on at a step boundary; 0: train on
        self.step: int | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A handler only records: the step in progress finishes, and the ranks decide together.
        if signum > self.received:
            self.received = signum

    def listen(self, *signals: signal.Signals) -> None:
        for sig in signals:
            if sig not in self._previous:
                self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def stop_listening(self) -> None:
        """After training: SIGTERM ends the process again (a cancel during the final save must not
        wait for a step that never comes); a late SIGUSR1 is ignored, the run being about to end."""
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if sig == signal.SIGUSR1 else previous)
        self._previous.clear()

    def agree(self, device: Any) -> int:
        """The largest signal any rank received (SIGTERM over SIGUSR1): every rank gets the same answer."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.received
        flag = torch.tensor([self.received], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


def stop_callback(stop: StopOnSignal) -> Any:
    """A TrainerCallback acting on `stop` at step boundaries; built here so importing stays light."""
    from transformers import TrainerCallback

    class StopOnSignalCallback(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stop.listen(signal.SIGTERM)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            agreed = stop.agree(args.device)
            # At the last step the run ends anyway, with its final save: let it.
            if agreed and state.global_step < state.max_steps:
                stop.agreed, stop.step = agreed, state.global_step
                control.should_save = True
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stop.stop_listening()

    return StopOnSignalCallback()


def start(stop: StopOnSignal | None = None) -> StopOnSignal:
    """Listen for SLURM's SIGUSR1 from now on (SIGTERM only once training begins)."""
    stop = stop or StopOnSignal()
    stop.listen(signal.SIGUSR1)
    return stop


def exit_if_stopped(stop: StopOnSignal, trainer: Any, out: Path) -> None:
    """After `trainer.train()`: if the ranks agreed to stop, report the checkpoint and exit every rank.

    Exits with `os._exit` after leaving the process group, as a finished run does (trainer/__main__.py):
    interpreter teardown can abort on torch's threads and turn the saved checkpoint into a crash.
    """
    if not stop.agreed:
        return
    code, why, then = _MEANING.get(signal.Signals(stop.agreed), _MEANING[signal.SIGTERM])
    ckpt = out / runs.CHECKPOINTS / f"{runs.CHECKPOINT_PREFIX}{stop.step}"
    line = (
        f"{USER_ERROR_PREFIX} {code.value}: stopped after step {stop.step} because {why}, with a "
        f"checkpoint at {ckpt.relative_to(out)}; {then}"
    )
    # A cancel (the worker wrote its record before signalling) is what the user asked for: the ranks
    # end with status 0, so the launcher (torch's agent, or accelerate's single-process launch) ends
    # quietly instead of reporting failed ranks in a page of traceback; the worker knows it cancelled.
    # Only the record's presence is looked at (the run user may not read it); SLURM's time limit and
    # a preemption leave no record and keep EXIT_CHECKPOINTED, which their requeue relies on.
    cancelled = stop.agreed == signal.SIGTERM and (out / runs.CANCEL_RECORD).exists()
    if trainer.accelerator.is_main_process:
        log.warning(
            "%s after step %s with a checkpoint at %s",
            "cancelled" if cancelled else "stopped",
            stop.step,
            ckpt,
        )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        trainer.accelerator.wait_for_everyone()
        dist.destroy_process_group()
    if trainer.accelerator.is_main_process and not cancelled:
        print(line, file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if cancelled else EXIT_CHECKPOINTED)
