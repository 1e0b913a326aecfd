"""The benches' store and deployments: jobs and metric points written straight into PostgreSQL with COPY
and generate_series (millions of rows in seconds), the plans PostgreSQL picks for the polls, a real
`ftq api` serving it; `ftq up` or the production stack for benches that train the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import scratch
from tests.harness import Deployment


def api_server(database_url: str, data_dir: Path | None = None) -> Deployment:
    """A real `ftq api` on the database (its logs under bench/out/api-*); use it with `with`."""
    root = scratch("api-")
    return Deployment(root, mode="api", store="postgres", database_url=database_url, data_dir=data_dir)


def tiny_deployment(
    prefix: str,
    tiny: Path,
    *,
    production: bool,
    tokens: dict[str, str] | None = None,
    **settings: object,
) -> Deployment:
    """`ftq up`, or (`production`) `ftq api` + `ftq worker` on PostgreSQL and a private Redis, in a new
    scratch folder: runs may read the tiny model's folder and the data dir, on 4 CPU slots; `settings`
    add to or replace those."""
    root = scratch(prefix)
    settings = {"local_roots": f"{tiny}:{root / 'data'}", "cpu_slots": 4, **settings}
    if production:
        return Deployment(
            root, mode="api+worker", store="postgres", broker="redis", tokens=tokens, settings=settings
        )
    return Deployment(root, tokens=tokens, settings=settings)


def spec_json(name: str = "bench") -> str:
    from ftq.contract.spec import JobSpec

    spec = JobSpec.model_validate(
        {
            "name": name,
            "model": {"name_or_path": "org/model-7b"},
            "dataset": {"name_or_path": "org/chat-data", "text_field": "text"},
            "training": {"max_steps": 100_000, "logging_steps": 1},
            "resources": {"device": "cpu", "processes_per_node": 1},
        }
    )
    return spec.model_dump_json()


_JOB_COLUMNS = (
    "id",
    "name",
    "owner",
    "status",
    "spec",
    "plan",
    "launcher",
    "device",
    "created_at",
    "updated_at",
    "started_at",
    "attempt",
    "metrics_offset",
    "progress_step",
    "progress_max_steps",
    "latest_metrics",
)


def copy_jobs(
    url: str, jobs: Iterable[tuple[str, str]], *, owner: str = "local", max_steps: int = 100_000
) -> None:
    """Insert jobs given as (id, status) in one COPY; seq follows the order given (newest last)."""
    import psycopg

    spec = spec_json()
    plan = json.dumps(
        {
            "accelerate_config": {},
            "accelerate_config_yaml": "",
            "command": ["accelerate", "launch"],
            "sbatch_script": None,
            "trainer_args": {},
            "estimate": None,
        }
    )
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY jobs ({', '.join(_JOB_COLUMNS)}) FROM STDIN") as copy:
            for i, (job_id, status) in enumerate(jobs):
                at = t0 + timedelta(seconds=i)
                copy.write_row(
                    (
                        job_id,
                        "bench",
                        owner,
                        status,
                        spec,
                        plan,
                        "local",
                        "cpu",
                        at,
                        at,
                        at,
                        0,
                        0,
                        None,
                        max_steps,
                        None,
                    )
                )
        conn.commit()


def copy_points(url: str, job_ids: Iterable[str], steps: int, *, start: int = 1) -> int:
    """`steps` points (start..start+steps-1) per job, every field set. Returns rows written.

    Rows are generated inside PostgreSQL (generate_series), which loads millions in seconds where
    sending them from Python would take a minute.
    """
    import psycopg

    ids = list(job_ids)
    bulk = len(ids) * steps > 200_000
    with psycopg.connect(url) as conn:
        if bulk:
            # Building the key afterwards (one sort) and skipping the per-row foreign key check halves
            # the load; both constraints come back under the names the migration gave them.
            conn.execute("ALTER TABLE metric_points DROP CONSTRAINT metric_points_pkey")
            conn.execute("ALTER TABLE metric_points DROP CONSTRAINT metric_points_job_id_fkey")
        conn.execute(
            "INSERT INTO metric_points (job_id, step, epoch, loss, learning_rate, grad_norm, eval_loss, "
            "tokens_per_second, time) "
            "SELECT j, s, s / 1000.0, 3.0 - s * 1e-5, 0.0002, 1.25, "
            "CASE WHEN s %% 100 = 0 THEN 2.0 - s * 1e-5 END, 5120.5, 1700000000.0 + s "
            "FROM unnest(%s::text[]) AS j, generate_series(%s::int, %s::int) AS s",
            (ids, start, start + steps - 1),
        )
        if bulk:
            conn.execute(
                "ALTER TABLE metric_points ADD CONSTRAINT metric_points_pkey PRIMARY KEY (job_id, step)"
            )
            conn.execute(
                "ALTER TABLE metric_points ADD CONSTRAINT metric_points_job_id_fkey FOREIGN KEY (job_id) "
                "REFERENCES jobs (id) ON DELETE CASCADE"
            )
        conn.commit()
    return len(ids) * steps


def analyze(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def explain(url: str, sql: str, params: tuple[Any, ...] = ()) -> str:
    """The plan PostgreSQL picks for a statement (EXPLAIN, no ANALYZE)."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("EXPLAIN " + sql, params).fetchall()
    return " | ".join(r[0].strip() for r in rows)


def job_ids(n: int, tag: str = "") -> list[str]:
    return [f"job_{tag}{i:0{16 - len(tag)}x}" for i in range(n)]
