"""The worker runtime on the production setup: `ftq api` and `ftq worker` as separate processes on
PostgreSQL and Redis. Real processes throughout, including stopping Redis and SIGKILLing the worker."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.worker.conftest import Stack, proc_groups, redis_cli, redis_up, run_pids, start_redis, tiny_spec

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def all_steps(stack: Stack, job_id: str) -> list[int]:
    r = stack.http.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000})
    assert r.status_code == 200 and r.json()["complete"], r.text
    return [p["step"] for p in r.json()["data"]]


SURVIVOR_STEPS = 80


@pytest.fixture(scope="module")
def wave(production: Stack, tiny_dir: Path) -> dict[str, str]:
    """Two jobs posted together so that their slow start-ups overlap."""
    plain = production.post_job(tiny_spec(tiny_dir, max_steps=6))
    survivor = production.post_job(tiny_spec(tiny_dir, max_steps=SURVIVOR_STEPS, name="survivor"))
    return {"plain": plain["id"], "survivor": survivor["id"]}


def test_kill9_worker_mid_training_then_restart(production: Stack, wave: dict[str, str]) -> None:
    job_id = wave["survivor"]
    production.wait_for(job_id, lambda j: (j["progress"]["step"] or 0) >= 1, 180, "first point")
    pgid = production.pgid_of(job_id)
    production.kill9("worker")
    # The run does not depend on the worker: it keeps going (or has just finished on its own).
    assert pgid in proc_groups() or (production.run_dir(job_id) / "exit_status").exists()
    time.sleep(2)
    production.start_worker()
    done = production.wait_terminal(job_id, timeout=180)
    assert done["status"] == "succeeded", production.log_tail(job_id)
    assert all_steps(production, job_id) == list(range(1, SURVIVOR_STEPS + 1))
    assert done["progress"]["step"] == SURVIVOR_STEPS and done["progress"]["eta_seconds"] == 0
    assert run_pids(job_id) == []


def test_job_runs_on_postgres_and_redis(production: Stack, wave: dict[str, str]) -> None:
    job_id = wave["plain"]
    # Points come through after_step polls, each page only newer than asked for.
    seen: list[int] = []
    after = 0
    deadline = time.time() + 240
    while time.time() < deadline:
        r = production.http.get(f"/jobs/{job_id}/metrics", params={"after_step": after, "limit": 2})
        page = r.json()
        assert all(p["step"] > after for p in page["data"])
        seen += [p["step"] for p in page["data"]]
        after = page["next_after_step"]
        if page["complete"]:
            break
        if not page["data"]:
            time.sleep(0.3)
    done = production.job(job_id)
    assert done["status"] == "succeeded", production.log_tail(job_id)
    assert seen == list(range(1, 7)) and done["progress"]["step"] == 6
    assert done["latest_metrics"]["loss"] is not None
    assert run_pids(job_id) == []


def test_post_while_redis_is_down_runs_exactly_once(production: Stack, tiny_dir: Path) -> None:
    assert redis_up()
    try:
        redis_cli("shutdown", "nosave")
        deadline = time.time() + 10
        while time.time() < deadline and redis_up():
            time.sleep(0.1)
        assert not redis_up()
        # The job row and its dispatch record commit together; the send fails and is left for the relay.
        job = production.post_job(tiny_spec(tiny_dir, max_steps=4, name="outbox"))
        assert job["status"] == "queued"
        time.sleep(3)
        assert production.job(job["id"])["status"] == "queued"
    finally:
        start_redis()
    done = production.wait_terminal(job["id"], timeout=240)
    assert done["status"] == "succeeded", production.log_tail(job["id"])
    log_text = (production.run_dir(job["id"]) / "train.log").read_text(errors="replace")
    # Exactly one launch: one trainer start, one finish, one set of points.
    assert log_text.count("trained to step 4") == 1, log_text[-2000:]
    assert log_text.count("trainer INFO strategy") == 1
    metrics_lines = (production.run_dir(job["id"]) / "metrics.jsonl").read_text().splitlines()
    assert len(metrics_lines) == 4
    assert all_steps(production, job["id"]) == [1, 2, 3, 4]
    # The relay sent the dispatch once Redis was back.
    with psycopg.connect(production.env["FTQ_DATABASE_URL"]) as conn:
        rows = conn.execute("SELECT sent_at FROM dispatches WHERE job_id = %s", (job["id"],)).fetchall()
    assert rows and all(r[0] is not None for r in rows)


def test_api_and_workers_starting_together_migrate_once(tmp_path: Path) -> None:
    """`ftq api` and `ftq worker`s started at once on a fresh database: one migrates, the others wait."""
    import os
    import secrets
    import subprocess

    from tests.worker.conftest import FTQ_BIN, PG_ADMIN, REPO, drop_database

    name = f"ftq_test_mig_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {
            **os.environ,
            "FTQ_DATA_DIR": str(tmp_path),
            "FTQ_ENV": "test",
            "FTQ_DATABASE_URL": f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}",
        }
        procs = [
            subprocess.Popen(
                [FTQ_BIN, "migrate"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for _ in range(3)
        ]
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
    finally:
        drop_database(name)
