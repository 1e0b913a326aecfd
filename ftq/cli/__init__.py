"""The `ftq` command: the client commands (submit, ls, status, logs, files, ...) and, where the server is
installed, the server's (up, api, worker, migrate).

`ftq up` (`ftq.cli.server`) is the composition root: the one place that starts the API
(`service.app:create_app`) and the worker (`worker.celery_app`) as processes, by module name. The client
distribution ships without `ftq.cli.server`, so its `ftq` has the client commands only.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

from ftq.cli.client import client_app
from ftq.cli.files import files_app

# What the help of the client install says in place of the server's commands: where they are.
CLIENT_ONLY = (
    "This is the client install (ftq-client): the server's commands (up, api, worker, migrate) come with "
    "the server package, `pip install .` in an ftq checkout."
)


def _server_app() -> typer.Typer | None:
    """The server's commands where the server is installed (the client distribution has no ftq.cli.server)."""
    if importlib.util.find_spec("ftq.cli.server") is None:
        return None
    server: typer.Typer = importlib.import_module("ftq.cli.server").server_app
    return server


_server = _server_app()
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ftq: fine-tuning jobs as a service.",
    epilog=None if _server is not None else CLIENT_ONLY,
)
if _server is not None:
    app.registered_commands += _server.registered_commands
app.registered_commands += client_app.registered_commands
app.add_typer(files_app, name="files", help="Uploaded dataset files: upload, ls, show, rm.")
