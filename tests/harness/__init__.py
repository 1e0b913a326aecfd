"""The one test harness, shared by tests/ and bench/ (`from tests.harness import Deployment, tiny_spec`).

- Deployment (deployment.py): ftq as real processes, `ftq up` or `ftq api` + `ftq worker`, on SQLite or
  PostgreSQL + Redis; its URL, tokens, data dir, run dirs, logs and processes.
- JobsApi (api.py): the harness's own API calls (submit, wait, cancel), through the SDK `ftq.client`.
- assets.py: the tiny model and data (`tiny_assets()`, examples/tiny), `tiny_spec()`, the shipped examples,
  config-only models.
- postgres.py: throwaway databases, and stopping/starting the server for fault tests.
- redis.py: PrivateRedis, a redis-server of the harness's own (a fault test may stop it).
- procs.py: free_port(), /proc readers (pids of a run, process groups), stopping process groups, Paced (a
  run kept training slowly through a fault).
- cli.py: run_ftq(), the CLI as a user runs it.
- inprocess.py: settings for code run inside the test process.
- rows.py: job and export rows written straight into the store, and the controller's sweep until a row
  reaches a status (in-process controller tests).
- disk.py: small_tmpfs(), a small disk of a test's own (as root), for what a full disk does.
- launching.py: launch requests for launcher tests that run scripts of their own.
- sdk.py: sdk_client(), the sync or the async SDK client for one scenario written for both (SDK_STYLES).
- users.py: the unprivileged run users (FTQ_RUN_AS_USER) of the run-isolation tests, made on first use.
- groups.py: which tests share a pytest-xdist worker (`make test` and `make test-fast` run three:
  XDIST and FAST_XDIST, "-n 3 --dist loadgroup"), and the scheduler that hands the groups out, heaviest first.
"""

from tests.harness.api import Job, JobsApi
from tests.harness.assets import (
    EXAMPLES,
    MODEL_CONFIGS,
    TINY,
    TINY_RELATIVE,
    config_only_model,
    example_spec,
    model_config,
    no_text_field_folder,
    one_process_example,
    text_dataset,
    tiny_assets,
    tiny_spec,
)
from tests.harness.cli import CliResult, run_ftq
from tests.harness.deployment import QUICK_SETTINGS, Deployment
from tests.harness.env import ARTIFACTS, FTQ, LEAN_PRELUDE, REPO, clean_env
from tests.harness.procs import (
    Paced,
    free_port,
    marked_pids,
    pid_alive,
    proc_children,
    proc_groups,
    procs_with,
    run_pids,
    wait_gone,
    wait_until,
)
from tests.harness.redis import PrivateRedis
from tests.harness.sdk import SDK_STYLES, sdk_client

__all__ = [
    "ARTIFACTS",
    "EXAMPLES",
    "FTQ",
    "LEAN_PRELUDE",
    "MODEL_CONFIGS",
    "QUICK_SETTINGS",
    "REPO",
    "SDK_STYLES",
    "TINY",
    "TINY_RELATIVE",
    "CliResult",
    "Deployment",
    "Job",
    "JobsApi",
    "Paced",
    "PrivateRedis",
    "clean_env",
    "config_only_model",
    "example_spec",
    "free_port",
    "marked_pids",
    "model_config",
    "no_text_field_folder",
    "one_process_example",
    "pid_alive",
    "proc_children",
    "proc_groups",
    "procs_with",
    "run_ftq",
    "run_pids",
    "sdk_client",
    "text_dataset",
    "tiny_assets",
    "tiny_spec",
    "wait_gone",
    "wait_until",
]
