"""The server commands' Celery workers: `ftq up` runs the webhook sender as a worker of its own on its
own queue (issue 28, finding 2); `ftq worker --queues` chooses what a worker consumes."""

from __future__ import annotations

from typer.testing import CliRunner

from ftq.cli.server import server_app, worker_argv
from ftq.runtime.queue import DEFAULT_QUEUE, TASK_WEBHOOKS, WEBHOOK_QUEUE, make_celery


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_webhook_task_has_a_queue_of_its_own() -> None:
    app = make_celery()
    assert app.conf.task_routes[TASK_WEBHOOKS] == {"queue": WEBHOOK_QUEUE}
    assert app.conf.task_default_queue == DEFAULT_QUEUE != WEBHOOK_QUEUE


def test_worker_argv_names_its_queues_and_node() -> None:
    both = worker_argv(beat=True, concurrency=4)
    assert _after(both, "--queues") == f"{DEFAULT_QUEUE},{WEBHOOK_QUEUE}" and "--hostname" not in both
    sender = worker_argv(beat=False, concurrency=2, queues=(WEBHOOK_QUEUE,), node="webhooks@%h")
    assert _after(sender, "--queues") == WEBHOOK_QUEUE and _after(sender, "--hostname") == "webhooks@%h"
    assert "--beat" not in sender


def test_an_unknown_queue_is_refused_naming_the_choices() -> None:
    got = CliRunner().invoke(server_app, ["worker", "--queues", "celery,nope"])
    assert got.exit_code == 2
    assert "ftq.webhooks" in got.output and "nope" in got.output
