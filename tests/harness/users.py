"""Unprivileged system users that runs start as (FTQ_RUN_AS_USER), made on first use.

Starting a process as another user needs root: CI runs as root, so do these machines. The users are
system accounts without a home or a login shell, one per owner, so one owner's run cannot read another's.
"""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

RUN_USERS = {"alice": "ftq-run-test-a", "bob": "ftq-run-test-b"}


def run_users() -> dict[str, pwd.struct_passwd]:
    """RUN_USERS by owner, created where this machine lacks them.

    Starting a run as another user needs root. Not root is a failure, not a skip: a skipped test would
    leave FTQ_RUN_AS_USER unproven. Run the suite as root, as CI does.
    """
    if os.geteuid() != 0:
        pytest.fail("the run-isolation tests start runs as other users, which needs root: run them as root")
    for user in RUN_USERS.values():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--user-group",
                    "--shell",
                    "/usr/sbin/nologin",
                    user,
                ],
                check=False,
                capture_output=True,
            )
    return {owner: pwd.getpwnam(user) for owner, user in RUN_USERS.items()}
