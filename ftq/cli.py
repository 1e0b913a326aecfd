"""The `ftq` command: server commands (up, api, worker, migrate) and client commands (submit, ls, ...)."""

from __future__ import annotations

import typer

from ftq.client_cli import client_app
from ftq.files_cli import files_app
from ftq.server_cli import server_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="ftq: fine-tuning jobs as a service.")
app.registered_commands += server_app.registered_commands
app.registered_commands += client_app.registered_commands
app.add_typer(files_app, name="files", help="Uploaded dataset files: upload, ls, show, rm.")
