"""Tailing metrics.jsonl and samples.jsonl (worker/ingest.py): only whole lines, points parsed leniently,
samples strictly and once per (step, prompt)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_sample_lines_are_parsed_strictly() -> None:
    ok = ingest.parse_sample(b'{"step": 4, "index": 1, "prompt": "a", "completion": "b\\u0000c", "time": 5}')
    assert ok == {"step": 4, "index": 1, "prompt": "a", "completion": "bc", "time": 5.0}
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
