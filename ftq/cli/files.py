"""`ftq files upload|ls|show|rm`, `ftq submit --upload`'s rewrite, and the dry run's dataset section."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from ftq.cli.output import (
    EXIT_INPUT,
    EXIT_REFUSED,
    api,
    err,
    fail,
    fmt_age,
    fmt_bytes,
    one_line_errors,
    out,
)
from ftq.client import Client
from ftq.contract import specyaml
from ftq.contract.plans import DatasetPreflight
from ftq.contract.schemas import FilePublic
from ftq.contract.spec import looks_local

files_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Uploaded dataset files.")

FileIdArg = Annotated[
    str, typer.Argument(help="File id, e.g. file_0123456789abcdef01234567", show_default=False)
]


def _files_command(name: str) -> Any:
    def register(fn: Any) -> Any:
        safe = one_line_errors(fn)
        files_app.command(name)(safe)
        return safe

    return register


def upload_with_progress(client: Client, path: Path) -> FilePublic:
    """Upload one file with a progress bar on stderr."""
    if not path.is_file():
        fail(f"{path} is not a file", EXIT_INPUT)
    columns = (
        TextColumn("uploading {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(escape(path.name), total=path.stat().st_size)
        return client.files.upload(path, progress=lambda sent, total: bar.update(task, completed=sent))


def report_file(f: FilePublic) -> None:
    status = {"ready": "[green]ready[/]", "invalid": "[red]invalid[/]"}.get(str(f.status), str(f.status))
    out.print(f"{f.id}  {escape(f.filename)}  {fmt_bytes(f.bytes)}  {status}")
    if f.rows is not None:
        out.print(f"  rows: {f.rows}  columns: {escape(', '.join(f.columns)) or '-'}")
        out.print(f"  formats: {', '.join(f.formats) or '-'}  methods: {', '.join(f.methods) or '-'}")
    out.print(f"  sha256: {f.sha256}")
    for e in f.errors:
        out.print(f"  [red]line {e.line}[/]: {escape(e.message)}", soft_wrap=True)
    if f.error_count > len(f.errors):
        out.print(f"  ... and {f.error_count - len(f.errors)} more")


@_files_command("upload")
def upload(
    path: Annotated[Path, typer.Argument(help="A JSON Lines dataset file.", show_default=False)],
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Do not wait for the validation.")] = False,
) -> None:
    """Upload a dataset file; waits for its validation and prints the result (exit 1 when invalid)."""
    with api() as client:
        f = upload_with_progress(client, path)
        if not no_wait:
            f = client.files.wait(f.id)
        report_file(f)
        if str(f.status) == "invalid":
            raise typer.Exit(EXIT_REFUSED)


@_files_command("ls")
def ls() -> None:
    """Your uploaded files, newest first."""
    with api() as client:
        table = Table(box=None, pad_edge=False)
        for col in ("ID", "FILENAME", "SIZE", "STATUS", "ROWS", "FORMATS", "CREATED"):
            table.add_column(col)
        for f in client.files.list():
            table.add_row(
                f.id,
                escape(f.filename),
                fmt_bytes(f.bytes),
                str(f.status),
                "-" if f.rows is None else str(f.rows),
                ",".join(f.formats) or "-",
                fmt_age(f.created_at),
            )
        out.print(table)


@_files_command("show")
def show(file_id: FileIdArg) -> None:
    """A file's status, rows, columns, formats and first errors."""
    with api() as client:
        report_file(client.files.get(file_id))


@_files_command("rm")
def rm(file_id: FileIdArg) -> None:
    """Delete a file and its bytes (refused while a queued or running job uses it)."""
    with api() as client:
        client.files.delete(file_id)
        out.print(f"deleted {file_id}")


def upload_spec_files(client: Client, spec_path: Path) -> dict[str, Any]:
    """The spec with the local .jsonl data it names uploaded and replaced by file ids: a .jsonl
    `dataset.name_or_path` becomes `dataset.file_id`; a local folder holding `<train_split>.jsonl` (and
    `<eval_split>.jsonl`) becomes `file_id` (and `eval_file_id`). Waits for the validations; a file that
    is not ready stops here with its errors."""
    try:
        spec = specyaml.load(spec_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"{spec_path}: {exc}", EXIT_INPUT)
    if not isinstance(spec, dict) or not isinstance(spec.get("dataset"), dict):
        fail(f"{spec_path} has no dataset section", EXIT_INPUT)
    dataset = spec["dataset"]
    name = dataset.get("name_or_path")
    if not isinstance(name, str) or not looks_local(name):
        fail(
            f"{spec_path}: dataset.name_or_path is not a local .jsonl file or folder; nothing to upload",
            EXIT_INPUT,
        )
    local = Path(name)
    if not local.is_absolute():
        # As the user wrote it: relative to the spec file, else to where ftq runs.
        beside = spec_path.parent / local
        local = beside if beside.exists() else local
    uploads: dict[str, Path] = {}
    if local.is_dir():
        train = local / f"{dataset.get('train_split') or 'train'}.jsonl"
        if not train.is_file():
            fail(f"{local} holds no {train.name} to upload", EXIT_INPUT)
        uploads["file_id"] = train
        eval_split = dataset.get("eval_split")
        if eval_split and (local / f"{eval_split}.jsonl").is_file():
            uploads["eval_file_id"] = local / f"{eval_split}.jsonl"
    elif local.suffix.lower() == ".jsonl":
        uploads["file_id"] = local
    else:
        fail(
            f"{spec_path}: dataset.name_or_path is not a local .jsonl file or folder; nothing to upload",
            EXIT_INPUT,
        )
    for field, path in uploads.items():
        f = client.files.wait(upload_with_progress(client, path).id)
        report_file(f)
        if str(f.status) != "ready":
            fail(f"{path} is {f.status}; fix it and submit again")
        dataset[field] = f.id
    dataset.pop("name_or_path")
    dataset.pop("train_split", None)
    if "eval_file_id" in uploads:
        dataset.pop("eval_split", None)  # the eval file is the eval split
    return spec


def print_dataset(d: DatasetPreflight) -> None:
    rows = "-" if d.rows is None else f"{d.rows}" + ("" if d.rows_exact else " (estimated)")
    out.print(f"source: {escape(d.source)}  rows: {rows}")
    if d.sampled:
        out.print(f"sampled: the first {d.sample_rows} rows were tokenized; the rest is extrapolated")
    if d.tokens_per_sample is not None:
        t = d.tokens_per_sample
        out.print(f"tokens per sample: min {t.min}  median {t.median}  p95 {t.p95}  max {t.max}")
        out.print(
            f"longer than max_seq_len {d.max_seq_len} (truncated): {d.truncated_samples} "
            f"({(d.truncated_fraction or 0) * 100:.1f}%)"
        )
        out.print(f"total tokens: {d.total_tokens}  trained per epoch: {d.train_tokens_per_epoch}")
    if d.skipped:
        out.print(f"token statistics skipped: {escape(d.skipped)}")
    if d.steps_per_epoch is not None:
        out.print(f"steps per epoch: {d.steps_per_epoch} at effective batch {d.effective_batch_size}")
    else:
        out.print(f"effective batch: {d.effective_batch_size}")
    if d.run_tokens is not None:
        # The time these tokens take is the plan's one estimate, printed in its own section.
        out.print(f"tokens the run trains on: {d.run_tokens}")
