"""Launchers by name: `local` (a process group on this machine) and `slurm` (sbatch)."""

from __future__ import annotations

from collections.abc import Callable

from ftq.runtime.settings import Settings, get_settings
from worker.launchers.base import Launcher


def make_launcher(
    name: str, settings: Settings | None = None, on_exit: Callable[[], None] | None = None
) -> Launcher:
    """`on_exit`: called when a local run this process started ends (SLURM's end is learned by polling)."""
    settings = settings or get_settings()
    if name == "local":
        from worker.launchers.local import LocalLauncher

        return LocalLauncher(settings, on_exit=on_exit)
    if name == "slurm":
        from worker.launchers.slurm import SlurmLauncher

        return SlurmLauncher(settings)
    raise ValueError(f"unknown launcher {name!r}")
