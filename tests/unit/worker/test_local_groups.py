"""A stored process-group id is signalled only while it is still the run's: pids go round (pid_max is
32768 on small hosts), and a kill sent to a reused group would hit another run."""

from __future__ import annotations

from pathlib import Path

from worker.launchers.base import RunRef
from worker.launchers.local import ProcInfo, _group_is_ours


def _ref(pid: int | None, ticks: int | None) -> RunRef:
    return RunRef("job_1", Path("/nonexistent"), None, pid, ticks)


def test_the_runs_own_group_with_or_without_its_leader_is_ours() -> None:
    leader = ProcInfo(pid=100, state="S", pgid=100, start_ticks=5)
    rank = ProcInfo(pid=101, state="R", pgid=100, start_ticks=6, ppid=100)
    assert _group_is_ours(_ref(100, 5), [leader, rank])
    assert _group_is_ours(_ref(100, 5), [rank])  # the leader ended, a rank is left over


def test_a_pid_that_went_round_to_another_process_is_not_ours() -> None:
    other = ProcInfo(pid=100, state="S", pgid=100, start_ticks=999)
    assert not _group_is_ours(_ref(100, 5), [other, ProcInfo(pid=7, state="S", pgid=100, start_ticks=1000)])
    assert not _group_is_ours(_ref(100, 5), [])
    assert not _group_is_ours(_ref(None, None), [other])
