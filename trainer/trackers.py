"""Experiment trackers (spec `integrations`): W&B, MLflow, TensorBoard, through transformers' own
reporting callbacks (`report_to`), which log on the main process only.

Where they log and with which credentials is the operator's, never the spec's: the worker puts WANDB_MODE,
WANDB_API_KEY (FTQ_PASS_ENV) and MLFLOW_TRACKING_URI into the launch environment. The spec names the
W&B project, entity and tags, and the MLflow experiment; this module turns them into the variables the
callbacks read. The run is named after the job (the run directory's name), and W&B files stay in the run
directory (`wandb/`), as do TensorBoard's (`tensorboard/`).

The main process writes what the trackers made of the run to `trackers.json` in the run directory once
training starts (`{"wandb": {"name", "id", "url", "project", "mode", "dir"}, "mlflow": {"experiment",
"experiment_id", "id", "name", "url"}, "tensorboard": {"dir"}}`, url null where there is none, e.g. W&B
offline); the API shows it as the job's `trackers`.

MLflow's run is started here, before training, and ended after the final evaluation: left to
transformers' callback, the run ends with training and the final evaluation's eval_loss would open a run
of its own.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ftq.contract import runs
from ftq.contract.spec import IntegrationsSpec

from .errors import TrackerError

log = logging.getLogger("trainer")

TENSORBOARD_DIR = "tensorboard"


def configure(integrations: IntegrationsSpec, out: Path) -> list[str]:
    """Set the variables the reporting callbacks read; returns `report_to`."""
    run_name = out.name
    if integrations.wandb is not None:
        wb = integrations.wandb
        os.environ["WANDB_PROJECT"] = wb.project
        if wb.entity:
            os.environ["WANDB_ENTITY"] = wb.entity
        if wb.tags:
            os.environ["WANDB_TAGS"] = ",".join(wb.tags)
        os.environ["WANDB_DIR"] = str(out)  # offline runs, logs and the run's files stay in the run dir
        os.environ.setdefault("WANDB_LOG_MODEL", "false")  # the model stays here; W&B gets metrics only
        os.environ.setdefault("WANDB_WATCH", "false")
        os.environ.setdefault("WANDB_SILENT", "true")
        if run_name.startswith("job_"):
            # A retried or requeued attempt continues the same W&B run instead of starting a second one.
            os.environ["WANDB_RUN_ID"] = run_name
            os.environ["WANDB_RESUME"] = "allow"
    if integrations.tensorboard:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(tensorboard_dir(out))
    if integrations.mlflow is not None:
        os.environ["MLFLOW_EXPERIMENT_NAME"] = integrations.mlflow.experiment
    return integrations.report_to


def check_reachable(integrations: IntegrationsSpec, out: Path) -> None:
    """Each tracker that sends over the network (W&B online, MLflow over HTTP) answers within
    FTQ_TRACKER_CHECK_SECONDS, or: with FTQ_TRACKER_FAILURE=fail the run ends now with `tracker_error`;
    with `continue` (the default) the tracker is dropped from this run (`integrations` changed in place)
    and a `tracker_unreachable` warning (a job.warning) says so. The metrics stay in ftq either way."""
    failure = os.environ.get("FTQ_TRACKER_FAILURE", "continue")
    seconds = float(os.environ.get("FTQ_TRACKER_CHECK_SECONDS", "5"))
    for name, setting, url in tracker_targets(integrations):
        problem = probe(url, seconds)
        if problem is None:
            continue
        what = f"the {name} tracker at {url} ({setting}) is unreachable: {problem}"
        if failure == "fail":
            raise TrackerError(
                f"{what}; FTQ_TRACKER_FAILURE=fail ends the job (continue trains on without it)"
            )
        setattr(integrations, name, None)
        message = (
            f"{what}; training goes on without it (FTQ_TRACKER_FAILURE=continue), its metrics are in ftq"
        )
        if os.environ.get("RANK", "0") == "0":
            from .watch import write_warnings

            write_warnings(
                out / runs.WARNINGS, [{"kind": "tracker_unreachable", "step": None, "message": message}]
            )


def tracker_targets(integrations: IntegrationsSpec) -> list[tuple[str, str, str]]:
    """(tracker, the setting naming where it is, URL) of each tracker this run would send to."""
    targets = []
    if integrations.mlflow is not None:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri.startswith(("http://", "https://")):
            targets.append(("mlflow", "FTQ_MLFLOW_TRACKING_URI", uri))
    if integrations.wandb is not None and os.environ.get("WANDB_MODE", "online") in ("", "online"):
        targets.append(
            ("wandb", "WANDB_BASE_URL", os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
        )
    return targets


def probe(url: str, seconds: float) -> str | None:
    """None when `url` answers HTTP (any status) within `seconds` in all, else what went wrong. The
    whole exchange runs on a thread waited for `seconds`: a server that accepts and then drips is as
    unreachable as a closed port."""
    parts = urlsplit(url)
    outcome: list[str | None] = []

    def ask() -> None:
        conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        try:
            conn = conn_type(parts.hostname or "", parts.port, timeout=seconds)
            try:
                conn.request("GET", (parts.path.rstrip("/") or "") + "/health")
                conn.getresponse().read(1024)
            finally:
                conn.close()
            outcome.append(None)
        except TimeoutError:
            # The socket's own timeout (the same `seconds`) can fire just before the join below gives up:
            # no answer, either way.
            return
        except (OSError, http.client.HTTPException, ValueError) as exc:
            outcome.append(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    started = time.monotonic()
    thread = threading.Thread(target=ask, name="tracker-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        return f"no answer within {seconds:g} s"
    if outcome[0] is not None:
        return f"{outcome[0]} (after {time.monotonic() - started:.1f} s)"
    return None


def tensorboard_dir(out: Path) -> Path:
    return out / TENSORBOARD_DIR


def start(integrations: IntegrationsSpec, out: Path, is_main: bool) -> None:
    """Start the MLflow run on the main process (see the module's note)."""
    if integrations.mlflow is None or not is_main:
        return
    import mlflow

    mlflow.set_experiment(integrations.mlflow.experiment)
    mlflow.start_run(run_name=out.name)


def finish(integrations: IntegrationsSpec, is_main: bool) -> None:
    """End the trackers' runs on the main process, so that everything is sent (or written) before exit."""
    if not is_main:
        return
    if integrations.mlflow is not None:
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.end_run()
    if integrations.wandb is not None:
        import wandb

        if wandb.run is not None:
            wandb.finish()


def recorder_callback(integrations: IntegrationsSpec, out: Path) -> Any:
    """A TrainerCallback that writes trackers.json once the trackers have started their runs."""
    from transformers import TrainerCallback

    class TrackerRecorder(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # transformers' reporting callbacks come before this one: their runs exist by now.
            if state.is_world_process_zero:
                write_record(out, describe(integrations, out))

    return TrackerRecorder()


def describe(integrations: IntegrationsSpec, out: Path) -> dict[str, Any]:
    """What each tracker made of this run: its name, id and URL (None where it has none)."""
    record: dict[str, Any] = {}
    if integrations.wandb is not None:
        import wandb

        run = wandb.run
        mode = os.environ.get("WANDB_MODE") or "online"
        record["wandb"] = {
            "project": integrations.wandb.project,
            "name": getattr(run, "name", None),
            "id": getattr(run, "id", None),
            "url": getattr(run, "url", None) if mode == "online" else None,
            "mode": mode,
            "dir": _relative(Path(run.dir).parent, out) if run is not None and run.dir else None,
        }
    if integrations.mlflow is not None:
        import mlflow

        active = mlflow.active_run()
        uri = mlflow.get_tracking_uri()
        run_id = active.info.run_id if active else None
        experiment_id = active.info.experiment_id if active else None
        url = None
        if run_id and uri.startswith(("http://", "https://")):
            url = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        record["mlflow"] = {
            "experiment": integrations.mlflow.experiment,
            "experiment_id": experiment_id,
            "id": run_id,
            "name": active.info.run_name if active else None,
            "url": url,
        }
    if integrations.tensorboard:
        record["tensorboard"] = {"dir": TENSORBOARD_DIR}
    return record


def write_record(out: Path, record: dict[str, Any]) -> None:
    path = out / runs.TRACKERS
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    for name, info in record.items():
        where = info.get("url") or info.get("dir") or ""
        log.info("tracker %s: %s %s", name, info.get("name") or info.get("id") or "", where)


def _relative(path: Path, out: Path) -> str:
    try:
        return str(path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)
