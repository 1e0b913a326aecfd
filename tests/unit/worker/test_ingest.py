"""Tailing metrics.jsonl and samples.jsonl (worker/ingest.py): only whole lines, points parsed leniently,
samples strictly and once per (step, prompt)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from worker import ingest


def test_only_complete_lines_are_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    lines, offset = ingest.read_new_lines(path, 0)
    assert lines == [b'{"step": 1, "loss": 2.0}'] and offset == 25
    assert ingest.read_new_lines(path, offset) == ([], offset)
    with path.open("ab") as f:
        f.write(b'ss": NaN, "max_steps": 9}\n')
    lines, offset2 = ingest.read_new_lines(path, offset)
    point = ingest.parse_point(lines[0])
    assert point is not None and point["step"] == 2 and point["loss"] is None and point["max_steps"] == 9
    assert offset2 == path.stat().st_size
    assert ingest.parse_point(b"not json") is None and ingest.parse_point(b'{"loss": 1}') is None


def test_run_directory_events_are_recorded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints (complete ones only), warnings.jsonl and samples.jsonl become events, keyed: a pass
    that reads them again, in this process or a fresh one, records nothing twice."""
    import json

    from ftq.contract import runs
    from ftq.store import repository
    from ftq.store.db import session_scope
    from ftq.store.models import Job, JobEvent
    from tests.harness.assets import checkpoint_dir
    from tests.harness.inprocess import migrate, use_settings
    from tests.harness.rows import job_row

    (tmp_path / "data").mkdir()
    monkeypatch.setenv("FTQ_TEST_SECRET", "hf_ingestsecret42")
    use_settings(monkeypatch, data_dir=tmp_path / "data", pass_env="FTQ_TEST_SECRET")
    migrate()
    with session_scope() as session:
        job = job_row("job_x", name="x", owner="o", status="running")
        repository.JobRepository(session, "o").add_with_dispatch(job)
    run_dir = tmp_path / "data" / "runs" / "job_x"
    run_dir.mkdir(parents=True)
    checkpoint_dir(run_dir, 2, ranks=1)
    (run_dir / runs.CHECKPOINTS / "checkpoint-4").mkdir()  # being written: not yet an event
    (run_dir / runs.WARNINGS).write_text(json.dumps({"kind": "loss_spike", "step": 3, "message": "m"}) + "\n")
    # A completion that echoes the operator's secret (issue 28, finding 8): an event shows it masked.
    sample = {"step": 2, "prompt": "p", "completion": "token hf_ingestsecret42"}
    (run_dir / runs.SAMPLES).write_text(json.dumps(sample) + "\n{torn")
    (run_dir / runs.METRICS).write_text(json.dumps({"step": 2, "eval_loss": 1.5}) + "\n")

    def types() -> list[tuple[str, object]]:
        with session_scope() as session:
            rows = session.query(JobEvent).filter(JobEvent.job_id == "job_x").order_by(JobEvent.id)
            return [(e.type, e.data.get("step")) for e in rows if e.type not in ("job.created", "job.queued")]

    ingest.ingest_job("job_x")
    first = types()
    with session_scope() as session:
        texts = [str(e.data) for e in session.query(JobEvent).filter(JobEvent.job_id == "job_x")]
    assert "hf_ingestsecret42" not in "".join(texts) and any("token ***" in t for t in texts)
    assert sorted(first) == sorted(
        [("job.eval", 2), ("job.checkpoint", 2), ("job.warning", 3), ("job.sample", 2)]
    )
    ingest._seen.clear()  # as a fresh worker would: the keys alone keep it to one event each
    with session_scope() as session:
        session.query(Job).filter(Job.id == "job_x").update({"metrics_offset": 0})
    ingest.ingest_job("job_x")
    assert types() == first
    checkpoint_dir(run_dir, 4, ranks=1)
    with (run_dir / runs.WARNINGS).open("a") as f:
        f.write(json.dumps({"kind": "straggler", "step": 5, "message": "slow"}) + "\n")
    ingest.ingest_job("job_x")
    assert types()[len(first) :] == [("job.checkpoint", 4), ("job.warning", 5)]


def test_sample_lines_are_parsed_strictly() -> None:
    ok = ingest.parse_sample(b'{"step": 4, "index": 1, "prompt": "a", "completion": "b\\u0000c", "time": 5}')
    assert ok == {"step": 4, "index": 1, "prompt": "a", "completion": "bc", "time": 5.0, "reward": None}
    rollout = ingest.parse_sample(b'{"step": 4, "index": 8, "prompt": "a", "completion": "b", "reward": 0.5}')
    assert rollout is not None and rollout["reward"] == 0.5  # a GRPO rollout's
    odd = ingest.parse_sample(b'{"step": 4, "index": 8, "prompt": "a", "completion": "b", "reward": "high"}')
    assert odd is not None and odd["reward"] is None
    long = ingest.parse_sample(
        ('{"step": 1, "index": 0, "prompt": "a", "completion": "%s"}' % ("x" * 20000)).encode()
    )
    assert long is not None and len(long["completion"]) == ingest.SAMPLE_TEXT_LIMIT
    for bad in (
        b"[]",
        b'{"step": 1, "prompt": "a", "completion": "b"}',
        b'{"step": -1, "index": 0, "prompt": "a", "completion": "b"}',
        b'{"step": 1, "index": true, "prompt": "a", "completion": "b"}',
        b'{"step": 1, "index": 5000, "prompt": "a", "completion": "b"}',
        b'{"step": 1, "index": 0, "prompt": "a", "completion": null}',
        b'{"step": 1.5, "index": 0, "prompt": "a", "completion": "b"}',
    ):
        assert ingest.parse_sample(bad) is None, bad


def test_samples_are_ingested_once_by_step_and_prompt(
    make_client: Callable[..., Any], ftq_env: dict[str, str], tiny_job: dict[str, Any]
) -> None:
    import json

    from ftq.store import repository
    from ftq.store.db import session_scope
    from ftq.store.models import Sample

    client = make_client()
    job_id = client.post("/jobs", json=tiny_job).json()["id"]
    run = Path(ftq_env["FTQ_DATA_DIR"]) / "runs" / job_id
    run.mkdir(parents=True)
    lines = [
        {"step": s, "index": i, "prompt": f"p{i}", "completion": f"c{s}.{i}", "time": 1.0}
        for s in (2, 4)
        for i in (0, 1)
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    (run / "samples.jsonl").write_text(text + '{"step": 6, "ind')  # the last line is still being written
    ingest.ingest_job(job_id)
    ingest.ingest_job(job_id)  # a second pass changes nothing
    with session_scope() as s:
        rows = s.query(Sample).filter_by(job_id=job_id).order_by(Sample.step, Sample.prompt_index).all()
        assert [(r.step, r.prompt_index, r.completion) for r in rows] == [
            (2, 0, "c2.0"),
            (2, 1, "c2.1"),
            (4, 0, "c4.0"),
            (4, 1, "c4.1"),
        ]
        job = repository.get_job(s, job_id)
        assert job is not None and job.samples_offset == len(text.encode())
    with (run / "samples.jsonl").open("a") as f:
        f.write('ex": 0, "prompt": "p0", "completion": "c6.0"}\n')
    ingest.ingest_job(job_id)
    with session_scope() as s:
        assert s.query(Sample).filter_by(job_id=job_id).count() == 5
