"""What a side run's entry point shares (`trainer.export`, `trainer.evaluate`: one process the worker
launches in the run's own folder, from the request file it wrote there): the command line, the one-line
report of a user's error, and the job's spec read from its run directory."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.spec import JobSpec

from .errors import FtqError, ModelError, report_and_exit
from .lean import start_up


def main_of(
    module: str, doc: str, request_file: str, run: Callable[[Path], object], argv: list[str] | None
) -> None:
    """`python -m <module> --request <folder>/<request_file>`: `run` the request; a user's error ends as
    one `ftq-error: <code>: <message>` line and exit status 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)  # train.quiet_bitsandbytes
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    parser.add_argument("--request", type=Path, required=True, help=f"the {request_file} the worker wrote")
    request = parser.parse_args(argv).request
    try:
        run(request)
    except FtqError as err:
        report_and_exit(err)


def read_spec(
    run_dir: Path, trust_remote_code: bool, describe: Callable[[BaseException], str] = str
) -> tuple[dict[str, Any], JobSpec]:
    """The job's spec.json (as written, and validated), with remote code off unless the job's rendered
    plan allowed it (`trust_remote_code`); a ModelError (`describe`: how it names the cause) when it
    cannot be read."""
    try:
        spec_dict = json.loads((run_dir / runs.SPEC).read_text())
        spec = JobSpec.model_validate(spec_dict)
    except (OSError, ValueError) as err:
        raise ModelError(f"the job's {runs.SPEC} cannot be read: {describe(err)}") from err
    if not trust_remote_code and spec.model.trust_remote_code:
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"trust_remote_code": False})})
    # Read before torch: what the job did not use, its side run does not either, nor its trackers.
    with start_up(spec, side_run=True):
        import peft  # noqa: F401  (with torch and transformers: the bulk of a side run's imports)
    return spec_dict, spec


def request_fields(data: dict[str, Any]) -> dict[str, Any]:
    """What every side run's request file holds (paths the server chose, never a client), for its `read`:
    its job, the job's run directory, the folder it writes into, and whether the job's plan let remote
    code run."""
    return {
        "job_id": str(data["job_id"]),
        "run_dir": Path(data["run_dir"]),
        "out_dir": Path(data["out_dir"]),
        "trust_remote_code": bool(data.get("trust_remote_code", False)),
    }
