"""The worker runtime on the production setup: `ftq api` and `ftq worker` as separate processes on
PostgreSQL and Redis. Real processes throughout, including stopping Redis and SIGKILLing the worker."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.harness import Deployment, postgres, proc_groups, run_pids, tiny_spec
from tests.harness.env import FTQ, REPO, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def all_steps(stack: Deployment, job_id: str) -> list[int]:
    r = stack.http.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000})
    assert r.status_code == 200 and r.json()["complete"], r.text
    return [p["step"] for p in r.json()["data"]]


SURVIVOR_STEPS = 80


@pytest.fixture(scope="module")
def wave(production: Deployment, tiny_dir: Path) -> dict[str, str]:
    """Two jobs posted together so that their slow start-ups overlap."""
    plain = production.post_job(tiny_spec(tiny_dir, max_steps=6))
    survivor = production.post_job(tiny_spec(tiny_dir, max_steps=SURVIVOR_STEPS, name="survivor"))
    return {"plain": plain["id"], "survivor": survivor["id"]}


def test_kill9_worker_mid_training_then_restart(production: Deployment, wave: dict[str, str]) -> None:
    job_id = wave["survivor"]
    production.wait_for(job_id, lambda j: (j["progress"]["step"] or 0) >= 1, 180, "first point")
    pgid = production.pgid_of(job_id)
    assert production.kill_worker() is not None
    # The run does not depend on the worker: it keeps going (or has just finished on its own).
    assert pgid in proc_groups() or (production.run_dir(job_id) / "exit_status").exists()
    time.sleep(2)
    production.start_worker()
    done = production.wait_terminal(job_id, timeout=180)
    assert done["status"] == "succeeded", production.report(job_id)
    assert all_steps(production, job_id) == list(range(1, SURVIVOR_STEPS + 1))
    assert done["progress"]["step"] == SURVIVOR_STEPS and done["progress"]["eta_seconds"] == 0
    assert run_pids(job_id) == []


def test_job_runs_on_postgres_and_redis(production: Deployment, wave: dict[str, str]) -> None:
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
    assert done["status"] == "succeeded", production.report(job_id)
    assert seen == list(range(1, 7)) and done["progress"]["step"] == 6
    assert done["latest_metrics"]["loss"] is not None
    assert run_pids(job_id) == []


def test_post_while_redis_is_down_runs_exactly_once(production: Deployment, tiny_dir: Path) -> None:
    redis = production.redis
    assert redis is not None and redis.is_up()
    try:
        redis.stop()
        # The job row and its dispatch record commit together; the send fails and is left for the relay.
        job = production.post_job(tiny_spec(tiny_dir, max_steps=4, name="outbox"))
        assert job["status"] == "queued"
        time.sleep(3)
        assert production.job(job["id"])["status"] == "queued"
    finally:
        redis.start()
    done = production.wait_terminal(job["id"], timeout=240)
    assert done["status"] == "succeeded", production.report(job["id"])
    log_text = (production.run_dir(job["id"]) / "train.log").read_text(errors="replace")
    # Exactly one launch: one trainer start, one finish, one set of points.
    assert log_text.count("trained to step 4") == 1, log_text[-2000:]
    assert log_text.count("trainer INFO strategy") == 1
    metrics_lines = (production.run_dir(job["id"]) / "metrics.jsonl").read_text().splitlines()
    assert len(metrics_lines) == 4
    assert all_steps(production, job["id"]) == [1, 2, 3, 4]
    # The relay sent the dispatch once Redis was back.
    assert production.database_url
    with psycopg.connect(production.database_url) as conn:
        rows = conn.execute("SELECT sent_at FROM dispatches WHERE job_id = %s", (job["id"],)).fetchall()
    assert rows and all(r[0] is not None for r in rows)


def test_api_and_workers_starting_together_migrate_once(tmp_path: Path) -> None:
    """`ftq migrate` started three times at once on a fresh database: one migrates, the others wait."""
    with postgres.database("ftq_test_mig") as url:
        env = clean_env(FTQ_DATA_DIR=str(tmp_path), FTQ_ENV="test", FTQ_DATABASE_URL=url)
        procs = [
            subprocess.Popen(
                [FTQ, "migrate"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for _ in range(3)
        ]
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outs
