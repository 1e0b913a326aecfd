"""The operating-system boundary around tenant code (python graders, an evaluation task's own code).

Tenant code runs only under bubblewrap (`bwrap`, the sandbox Flatpak uses), in fresh user, pid, network,
ipc, uts and mount namespaces: it sees a read-only `/usr`, the read-only paths the caller names (the
interpreter, the grader's or the task's inputs), a private `/proc` of its own pid namespace (never its
parent's), a `/dev` of the null devices, and a size-bounded private `/tmp` and `/dev/shm` that vanish
with it. The environment is the few variables the caller gives; the network is a loopback that is down.
One deadline holds for the whole process tree: when it passes, or when the output passes its cap, the
tree is killed (the namespace's first process dies, and the kernel kills every process in it).

Where bwrap cannot start (not installed, or user namespaces disabled), `SandboxUnavailable` says so and
names the fix: callers refuse tenant code then, they never run it weaker.

This package imports only the standard library, so the trainer (GRPO rewards, evaluation suites), the
worker and the API all use the same boundary.
"""

from ftq.sandbox.boundary import Box, Outcome, SandboxUnavailable, check, run

__all__ = ["Box", "Outcome", "SandboxUnavailable", "check", "run"]
