"""Launchers by name: `local` (a process group on this machine) and `slurm` (sbatch)."""

from __future__ import annotations

from ftq.settings import Settings, get_settings
from worker.launchers.base import Launcher


def get_launcher(name: str, settings: Settings | None = None) -> Launcher:
    settings = settings or get_settings()
    if name == "local":
        from worker.launchers.local import LocalLauncher

        return LocalLauncher(settings)
    if name == "slurm":
        from worker.launchers.slurm import SlurmLauncher

        return SlurmLauncher(settings)
    raise ValueError(f"unknown launcher {name!r}")
