"""Issue 18, item 2: a run's environment is an allowlist of the worker's, and FTQ_RUN_AS_USER names who
each owner's runs start as."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ftq.runtime.settings import Settings
from worker.launchers.base import launch_environment

# What a run gets of the worker's environment: what a launch needs, and HF_TOKEN (FTQ_PASS_ENV names it
# in the test below).
PASSED = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/ftq",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "CUDA_HOME": "/usr/local/cuda",
    "NCCL_SOCKET_IFNAME": "ib0",
    "HF_HOME": "/srv/hf",
    "HF_HUB_OFFLINE": "1",
    "HF_TOKEN": "hf_operator_token",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "https_proxy": "http://proxy:3128",
    # The operator's own allocator setting wins over the launch's expandable_segments default.
    "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
}

WORKER_ENV = {
    # The service's own settings: never a run's.
    "FTQ_API_TOKENS": "tok-alice:alice,tok-bob:bob",
    "FTQ_DATABASE_URL": "postgresql://ftq:db-password@db/ftq",
    "FTQ_BROKER_URL": "redis://:broker-password@redis:6379/0",
    "FTQ_METRICS_TOKEN": "metrics-token",
    # The operator's other credentials and settings: not a run's unless FTQ_PASS_ENV names them.
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "PGPASSWORD": "pg-secret",
    "HUGGING_FACE_HUB_TOKEN": "hf_legacy_name",
    "HF_HUB_TOKEN_PATH": "/root/.cache/huggingface/token",
    "WANDB_API_KEY": "wandb-key",
    "MY_SITE_SETTING": "x",
    "MASTER_ADDR": "10.0.0.1",
    "SLURM_JOB_ID": "77",
    **PASSED,
}


def test_only_the_allowlist_and_the_named_secrets_pass() -> None:
    assert launch_environment(Settings(pass_env="HF_TOKEN"), WORKER_ENV) == PASSED


def test_pass_env_adds_names_but_never_the_service_settings() -> None:
    settings = Settings(pass_env="HF_TOKEN,WANDB_API_KEY,MY_SITE_SETTING,FTQ_API_TOKENS,FTQ_DATABASE_URL")
    env = launch_environment(settings, WORKER_ENV)
    assert env["WANDB_API_KEY"] == "wandb-key" and env["MY_SITE_SETTING"] == "x"
    assert not {k for k in env if k.startswith("FTQ_")}
    assert "HF_TOKEN" not in launch_environment(Settings(pass_env=""), WORKER_ENV)


@pytest.mark.parametrize(
    ("value", "users"),
    [
        ("", {}),
        ("ftq-run", {"*": "ftq-run"}),
        ("alice:ftq-alice, bob:ftq-bob", {"alice": "ftq-alice", "bob": "ftq-bob"}),
        ("alice:ftq-alice,*:ftq-run", {"alice": "ftq-alice", "*": "ftq-run"}),
    ],
)
def test_run_users_by_owner(value: str, users: dict[str, str]) -> None:
    settings = Settings(run_as_user=value)
    assert settings.run_users == users
    if not users:
        assert settings.run_user_for("alice") is None
    else:
        assert settings.run_user_for("alice") == users.get("alice", users.get("*"))


def test_an_owner_the_mapping_leaves_out_has_no_run_user_and_no_run() -> None:
    settings = Settings(run_as_user="alice:ftq-alice")
    with pytest.raises(LookupError, match="'bob'"):
        settings.run_user_for("bob")


@pytest.mark.parametrize("value", [":ftq-run", "alice:", "alice:ftq run", "alice:$(id)", "1000"])
def test_a_bad_run_user_setting_is_refused_at_start(value: str) -> None:
    with pytest.raises(ValidationError, match="FTQ_RUN_AS_USER"):
        Settings(run_as_user=value)


def test_trackers_get_the_operators_settings_and_only_when_the_spec_asks() -> None:
    from ftq.contract.spec import JobSpec
    from worker.launchers.base import tracker_environment

    base = {
        "model": {"name_or_path": "./tiny/model"},
        "dataset": {"name_or_path": "./tiny/data"},
        "training": {"max_steps": 1},
    }
    settings = Settings(wandb_mode="offline", mlflow_tracking_uri="http://127.0.0.1:5000")
    plain = JobSpec.model_validate(base)
    assert tracker_environment(settings, plain) == {}
    both = JobSpec.model_validate(
        {**base, "integrations": {"wandb": {"project": "p"}, "mlflow": {"experiment": "e"}}}
    )
    assert tracker_environment(settings, both) == {
        "WANDB_MODE": "offline",
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "FTQ_TRACKER_FAILURE": "continue",
        "FTQ_TRACKER_CHECK_SECONDS": "5",
    }
    # Issue 28, finding 3: credentials in the operator's URL reach the run only as MLflow's own
    # variables; the URL it prints and records has none, and the password is one of the masked secrets.
    secret = Settings(
        mlflow_tracking_uri="http://ftq-op:pa%3Ass@127.0.0.1:5000/prefix", tracker_failure="fail"
    )
    env = tracker_environment(secret, both)
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000/prefix"
    assert env["MLFLOW_TRACKING_USERNAME"] == "ftq-op" and env["MLFLOW_TRACKING_PASSWORD"] == "pa:ss"
    assert env["FTQ_TRACKER_FAILURE"] == "fail"
    assert "pa:ss" in secret.secret_values() and "pa%3Ass" in secret.secret_values()
    assert secret.mlflow_url == "http://127.0.0.1:5000/prefix"
    # The spec has no field for where or how to log: those are the operator's.
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**base, "integrations": {"mlflow": {"experiment": "e", "tracking_uri": "x"}}})
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**base, "integrations": {"wandb": {"project": "p", "api_key": "k"}}})


def test_the_operators_hub_token_reaches_runs_from_the_environment_and_the_cache_is_shared(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 27, item 2: FTQ_HF_TOKEN (the same setting as FTQ_HUB_TOKEN) reaches a run naming a hub model
    or dataset as HF_TOKEN, with the fetch step's shared cache (FTQ_HUB_CACHE, default data_dir/hub); the
    token is masked like the other secrets, and FTQ_HF_TOKEN itself is never passed."""
    from ftq.contract.spec import JobSpec
    from worker.launchers.base import hub_environment

    monkeypatch.setenv("FTQ_HF_TOKEN", "hf_from_ftq_hf_token")
    settings = Settings(data_dir=tmp_path)
    assert settings.hub_token == "hf_from_ftq_hf_token"
    assert "hf_from_ftq_hf_token" in settings.secret_values()
    base = {"dataset": {"name_or_path": "./tiny/data"}, "training": {"max_steps": 1}}
    local = JobSpec.model_validate({**base, "model": {"name_or_path": "./tiny/model"}})
    hub = JobSpec.model_validate({**base, "model": {"name_or_path": "meta-llama/Llama-3.1-8B"}})
    assert hub_environment(settings, local) == {}  # asks the Hub nothing: no token
    assert hub_environment(settings, hub) == {
        "HF_TOKEN": "hf_from_ftq_hf_token",
        "HF_HUB_CACHE": str(tmp_path.resolve() / "hub"),
    }
    # A hub dataset is fetched with the same token into the same cache, whatever the model is.
    hub_data = JobSpec.model_validate({**local.model_dump(), "dataset": {"name_or_path": "owner/rows"}})
    assert hub_environment(settings, hub_data) == hub_environment(settings, hub)
    shared = Settings(hub_token="t", hub_cache=tmp_path / "shared")
    assert hub_environment(shared, hub)["HF_HUB_CACHE"] == str(tmp_path / "shared")
    assert "HF_TOKEN" not in hub_environment(Settings(hub_token=""), hub)
    passed = launch_environment(Settings(pass_env="FTQ_HF_TOKEN"), {"FTQ_HF_TOKEN": "x", "PATH": "/bin"})
    assert passed == {"PATH": "/bin"}


def test_runs_that_score_graders_or_evaluate_get_the_operators_sandbox_settings() -> None:
    """Issue 48, finding 3: evaluation suites scored under the sandbox's defaults, not the operator's
    FTQ_GRADER_* limits; GRPO runs and evaluations get them now, with FTQ_SANDBOX_BWRAP."""
    from ftq.contract.spec import JobSpec
    from worker.launchers.base import grader_environment

    base = {
        "model": {"name_or_path": "./tiny/model"},
        "dataset": {"name_or_path": "./tiny/data"},
        "training": {"max_steps": 1},
    }
    settings = Settings(grader_cpu_seconds=3, grader_timeout_seconds=7.5, sandbox_bwrap="/opt/bwrap")
    assert grader_environment(settings, JobSpec.model_validate(base)) == {}
    suite = {"name": "bench", "type": "lm_eval", "tasks": ["tiny_mc"], "task_dir": "./evaluation/tasks"}
    evaluated = JobSpec.model_validate({**base, "eval": {"suites": [suite]}})
    env = grader_environment(settings, evaluated)
    assert env["FTQ_GRADER_CPU_SECONDS"] == "3" and env["FTQ_GRADER_TIMEOUT_SECONDS"] == "7.5"
    assert env["FTQ_SANDBOX_BWRAP"] == "/opt/bwrap"
