"""A folder streams as a tar through a real `ftq api` in bounded memory: 200 MB of files (sparse, so the
disk is not what is measured) grow the API process's RSS by far less than the folder (bench/artifacts_tar.py
measures the 2 GB case). A liveness and memory property, not a speed one."""

from __future__ import annotations

from pathlib import Path

from bench.artifacts_tar import api_deployment, job_with_final, measure

MB = 1024**2


def test_a_200_mb_folder_streams_in_bounded_memory(tmp_path: Path) -> None:
    with api_deployment(tmp_path) as dep:
        job_id = job_with_final(dep, 200 * MB, files=4, random=False)
        m = measure(dep, job_id)
        assert m.bytes_streamed > 200 * MB
        # A copy of the folder (or of one file) in memory would be 50-200 MB; a stream holds a few chunks.
        assert m.growth_mb < 64, (m, dep.log_tail())
        # The API still answers after the stream.
        assert dep.http.get("/healthz").status_code == 200
