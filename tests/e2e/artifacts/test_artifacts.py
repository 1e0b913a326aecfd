"""Getting the model out, through HTTP only, on the session's `ftq up` and its finished tiny job
(examples/tiny-cpu.yaml: LoRA, checkpoints at steps 20 and 40).

The list names the adapter and both checkpoints with their sizes and sha256; the adapter downloaded
through the API loads with PEFT on the tiny base and generates; Range, ETag and If-Range behave as RFC
9110 says; a folder streams as a tar that extracts to the same bytes; `..`, absolute paths, the run's
own files and symlinks planted in the run are a 404; `ftq download` resumes a cut-off download and
refuses bytes that do not match the listed sha256.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftq.client import Client
from tests.e2e.session import FinishedJob
from tests.harness import TINY, Deployment, run_ftq

ADAPTER = "final/adapter_model.safetensors"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _listing(server: Deployment, job_id: str, timeout: float = 120) -> dict[str, dict[str, Any]]:
    """The artifact list by path, once every sha256 is computed (big files are hashed in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        data = server.get(f"/jobs/{job_id}/artifacts")["data"]
        if all(a["sha256"] for a in data) or time.monotonic() > deadline:
            return {a["path"]: a for a in data}
        time.sleep(0.5)


@pytest.fixture(scope="module")
def job_id(finished_job: FinishedJob) -> str:
    assert finished_job.result.returncode == 0, finished_job.result.stdout + finished_job.result.stderr
    return finished_job.job_id


@pytest.fixture(scope="module")
def listing(server: Deployment, job_id: str) -> dict[str, dict[str, Any]]:
    return _listing(server, job_id)


def test_the_list_holds_the_adapter_checkpoints_and_logs(
    server: Deployment, job_id: str, listing: dict[str, dict[str, Any]]
) -> None:
    run = server.run_dir(job_id)
    assert listing[ADAPTER]["kind"] == "adapter"
    assert listing["final/adapter_config.json"]["kind"] == "adapter"
    assert any(a["kind"] == "tokenizer" for p, a in listing.items() if p.startswith("final/"))
    assert listing["train.log"]["kind"] == "log" and listing["metrics.jsonl"]["kind"] == "log"
    steps = {p.split("/")[1] for p in listing if p.startswith("checkpoints/")}
    assert steps == {"checkpoint-20", "checkpoint-40"}
    assert all(a["kind"] == "checkpoint" for p, a in listing.items() if p.startswith("checkpoints/"))
    # Sizes and sha256 are those of the files on disk (nothing in this run holds a secret to mask).
    for path, a in listing.items():
        data = (run / path).read_bytes()
        assert a["size"] == len(data), path
        assert a["sha256"] == _sha(data), path
    # The run's own records are not artifacts.
    for own in ("spec.json", "launch.sh", "exit_status", "launch.json", "accelerate_config.yaml"):
        assert (run / own).exists() or own == "launch.json"
        assert own not in listing
    assert not any(p.startswith(".") or "/." in p for p in listing if not p.startswith("checkpoints/"))


def test_the_adapter_downloaded_through_the_api_loads_with_peft_and_generates(
    server: Deployment, job_id: str, listing: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    with Client(server.url, "") as client:
        files = client.jobs.download(job_id, "final", tmp_path)
    assert {f.artifact.path for f in files} == {p for p in listing if p.startswith("final/")}
    assert all(f.verified for f in files)
    final = tmp_path / "final"
    assert _sha((final / "adapter_model.safetensors").read_bytes()) == listing[ADAPTER]["sha256"]

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(TINY / "model")
    model = PeftModel.from_pretrained(base, final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    # The trained LoRA weights are there: B matrices start at zero and training moved them.
    assert any(float(p.abs().sum()) > 0 for n, p in model.named_parameters() if "lora_B" in n), (
        "the downloaded adapter holds untrained (zero) LoRA B weights"
    )
    inputs = tokenizer("the quick brown", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_range_etag_and_if_range(server: Deployment, job_id: str, listing: dict[str, dict[str, Any]]) -> None:
    url = f"/jobs/{job_id}/artifacts/{ADAPTER}"
    whole = server.http.get(url)
    assert whole.status_code == 200
    data = whole.content
    size = len(data)
    assert _sha(data) == listing[ADAPTER]["sha256"] and size == listing[ADAPTER]["size"]
    etag = whole.headers["etag"]
    assert whole.headers["accept-ranges"] == "bytes"
    assert whole.headers["content-length"] == str(size)
    assert whole.headers["content-type"] == "application/octet-stream"
    assert whole.headers["content-disposition"].startswith('attachment; filename="adapter_model.safetensors"')
    assert whole.headers["x-content-type-options"] == "nosniff"

    def get(**headers: str) -> httpx.Response:
        return server.http.get(url, headers=headers)

    r = get(Range="bytes=0-9")
    assert r.status_code == 206 and r.content == data[:10]
    assert r.headers["content-range"] == f"bytes 0-9/{size}"
    assert r.headers["content-length"] == "10"
    r = get(Range="bytes=100-")
    assert r.status_code == 206 and r.content == data[100:]
    r = get(Range="bytes=-7")
    assert r.status_code == 206 and r.content == data[-7:]
    r = get(Range=f"bytes=10-{size * 2}")  # past the end: cut to the end
    assert r.status_code == 206 and r.content == data[10:]
    for unsatisfiable in (f"bytes={size}-", f"bytes={size + 5}-{size + 9}", "bytes=-0"):
        r = get(Range=unsatisfiable)
        assert r.status_code == 416, unsatisfiable
        assert r.headers["content-range"] == f"bytes */{size}"
    # Several ranges, another unit, nonsense: the whole file (a server may ignore a Range it does not do).
    for ignored in ("bytes=0-1,5-6", "items=0-1", "bytes=5-2", "bytes=x-y"):
        r = get(Range=ignored)
        assert r.status_code == 200 and r.content == data, ignored
    # ETag: a cached copy is not sent again; another tag is.
    r = get(**{"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
    assert get(**{"If-None-Match": f'W/{etag}, "other"'}).status_code == 304
    assert get(**{"If-None-Match": '"other"'}).status_code == 200
    # If-Range: the range only while the client holds this version; else the whole (new) file.
    r = get(Range="bytes=0-9", **{"If-Range": etag})
    assert r.status_code == 206 and r.content == data[:10]
    r = get(Range="bytes=0-9", **{"If-Range": '"an-older-version"'})
    assert r.status_code == 200 and r.content == data
    r = get(Range="bytes=0-9", **{"If-Range": whole.headers["last-modified"]})
    assert r.status_code == 206


def test_folders_stream_as_tars_that_extract_to_the_same_bytes(
    server: Deployment, job_id: str, listing: dict[str, dict[str, Any]]
) -> None:
    for folder in ("final", "checkpoints/checkpoint-20", "checkpoints/checkpoint-40"):
        base = folder.rsplit("/", 1)[-1]
        with server.http.stream("GET", f"/jobs/{job_id}/artifacts/{folder}.tar") as r:
            assert r.status_code == 200, folder
            assert r.headers["content-type"] == "application/x-tar"
            assert r.headers["content-disposition"].startswith(f'attachment; filename="{base}.tar"')
            body = r.read()
        assert int(r.headers["content-length"]) == len(body)
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            members = tar.getmembers()
            assert all(m.isfile() for m in members)
            got = {m.name: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
        want = {p: a for p, a in listing.items() if p.startswith(folder + "/")}
        assert set(got) == {base + p[len(folder) :] for p in want}, folder
        for path, a in want.items():
            content = got[base + path[len(folder) :]]
            assert len(content) == a["size"] and _sha(content) == a["sha256"], path
    # A file that happens to end in .tar is not a folder; a folder that is no artifact is a 404.
    for missing in ("nothing.tar", "checkpoints/checkpoint-99.tar", "final/nothing.tar", ".tar", "runs.tar"):
        assert server.http.get(f"/jobs/{job_id}/artifacts/{missing}").status_code == 404, missing


def _raw_get(server: Deployment, path: str) -> int:
    """GET with the path sent exactly as written (httpx would resolve `..` itself)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.fixture
def planted(server: Deployment, job_id: str) -> Iterator[Path]:
    """Symlinks the run could plant: in final/, in a checkpoint, a whole exports/ folder, a log."""
    run = server.run_dir(job_id)
    links = {
        run / "final" / "passwd.json": Path("/etc/passwd"),
        run / "final" / "spec.json": run / "spec.json",
        run / "checkpoints" / "checkpoint-20" / "up": Path(".."),
        run / "exports": Path("/etc"),
        run / "samples.jsonl": run / "launch.sh",
        run / "checkpoints" / "checkpoint-77": run / "final",
    }
    aside = []
    for link in links:
        if link.exists() or link.is_symlink():  # samples.jsonl, when the run wrote samples
            link.rename(link.with_name(link.name + ".aside"))
            aside.append(link)
    for link, target in links.items():
        link.symlink_to(target)
    try:
        yield run
    finally:
        for link in links:
            link.unlink()
        for link in aside:
            link.with_name(link.name + ".aside").rename(link)


def test_nothing_outside_the_artifacts_is_reachable(server: Deployment, job_id: str, planted: Path) -> None:
    base = f"/jobs/{job_id}/artifacts"
    listed = [a["path"] for a in server.get(base)["data"]]
    for name in ("final/passwd.json", "final/spec.json", "samples.jsonl"):
        assert name not in listed
    assert not any(
        p.startswith(("exports/", "checkpoints/checkpoint-77", "checkpoints/checkpoint-20/up"))
        for p in listed
    )
    refused = [
        "final/passwd.json",
        "final/spec.json",
        "samples.jsonl",
        "exports/passwd",
        "exports.tar",
        "checkpoints/checkpoint-77/adapter_model.safetensors",
        "checkpoints/checkpoint-77.tar",
        "checkpoints/checkpoint-20/up/spec.json",
        "checkpoints/checkpoint-20/up.tar",
        "spec.json",
        "launch.sh",
        "exit_status",
        "accelerate_config.yaml",
        "checkpoints/../spec.json",
        "final/../spec.json",
        "%2Fetc%2Fpasswd",
        "/etc/passwd",
        "final%2F..%2F..%2F..%2Fftq.db",
        "..%2F..%2Fftq.db",
        "final%00.tar",
    ]
    for path in refused:
        r = server.http.get(f"{base}/{path}")
        assert r.status_code == 404, (path, r.status_code)
    # httpx resolves `.` and `..` before sending: these go out exactly as written.
    assert _raw_get(server, base + "/final/adapter_config.json") == 200
    for raw in (
        "/final/../spec.json",
        "/../../ftq.db",
        "/final/../../../ftq.db",
        "/checkpoints/..",
        "/final/./adapter_config.json",
        "/final//adapter_config.json",
        "/./train.log",
    ):
        assert _raw_get(server, base + raw) == 404, raw
    # The planted links are not in any tar either.
    with tarfile.open(fileobj=io.BytesIO(server.http.get(f"{base}/final.tar").content)) as tar:
        names = tar.getnames()
    assert "final/passwd.json" not in names and "final/spec.json" not in names
    with tarfile.open(
        fileobj=io.BytesIO(server.http.get(f"{base}/checkpoints/checkpoint-20.tar").content)
    ) as tar:
        assert not any("/up" in n for n in tar.getnames())


def test_cli_download_resumes_and_verifies(
    server: Deployment, job_id: str, listing: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    table = run_ftq("artifacts", job_id, url=server.url)
    assert table.returncode == 0, table.stderr
    assert ADAPTER in table.stdout and "checkpoints/checkpoint-20/" in table.stdout

    data = server.http.get(f"/jobs/{job_id}/artifacts/{ADAPTER}").content
    etag = server.http.get(f"/jobs/{job_id}/artifacts/{ADAPTER}", headers={"Range": "bytes=0-0"}).headers[
        "etag"
    ]
    # An interrupted download: the first half is in the .part file, with the version it belongs to.
    out = tmp_path / "out"
    out.mkdir()
    half = len(data) // 2
    (out / "adapter_model.safetensors.part").write_bytes(data[:half])
    (out / "adapter_model.safetensors.part.etag").write_text(etag)
    r = run_ftq("download", job_id, ADAPTER, "--out", str(out), url=server.url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumed at {half} B" in r.stdout or "resumed at" in r.stdout, r.stdout
    assert "sha256 ok" in r.stdout
    assert (out / "adapter_model.safetensors").read_bytes() == data
    assert not (out / "adapter_model.safetensors.part").exists()
    assert not (out / "adapter_model.safetensors.part.etag").exists()

    # A partial file that does not hold the start of this file: the sha256 check refuses the result.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_model.safetensors.part").write_bytes(b"\xff" * half)
    (bad / "adapter_model.safetensors.part.etag").write_text(etag)
    r = run_ftq("download", job_id, ADAPTER, "--out", str(bad), url=server.url)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "does not match" in r.stderr and listing[ADAPTER]["sha256"] in r.stderr
    assert not (bad / "adapter_model.safetensors").exists()
    assert not (bad / "adapter_model.safetensors.part").exists()
    # Run again, it starts over and succeeds.
    r = run_ftq("download", job_id, ADAPTER, "--out", str(bad), url=server.url)
    assert r.returncode == 0 and (bad / "adapter_model.safetensors").read_bytes() == data

    # A folder, file by file, with a progress bar on stderr.
    r = run_ftq(
        "download", job_id, "checkpoints/checkpoint-20", "--out", str(tmp_path / "ck"), url=server.url
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for path, a in listing.items():
        if path.startswith("checkpoints/checkpoint-20/"):
            got = (
                tmp_path / "ck" / "checkpoint-20" / path.removeprefix("checkpoints/checkpoint-20/")
            ).read_bytes()
            assert _sha(got) == a["sha256"], path
    assert "100%" in r.stderr
    # Unknown paths name themselves.
    r = run_ftq("download", job_id, "final/nothing.bin", "--out", str(tmp_path), url=server.url)
    assert r.returncode == 1 and "not found (404): job" in r.stderr and "final/nothing.bin" in r.stderr
    assert os.listdir(tmp_path / "ck") == ["checkpoint-20"]


def test_async_sdk_downloads_a_checkpoint_and_skips_what_is_already_there(
    server: Deployment, job_id: str, listing: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    import asyncio

    from ftq.client import AsyncClient

    seen: list[tuple[int, int]] = []

    async def fetch() -> list[Any]:
        async with AsyncClient(server.url, "") as client:
            listed = await client.jobs.artifacts(job_id)
            assert {a.path for a in listed} == set(listing)
            return await client.jobs.download(
                job_id, "checkpoints/checkpoint-40", tmp_path, progress=lambda n, t: seen.append((n, t))
            )

    files = asyncio.run(fetch())
    want = {p: a for p, a in listing.items() if p.startswith("checkpoints/checkpoint-40/")}
    assert {f.artifact.path for f in files} == set(want)
    for f in files:
        assert f.verified and f.path == tmp_path / "checkpoint-40" / f.artifact.path.split("/", 2)[2]
        assert _sha(f.path.read_bytes()) == want[f.artifact.path]["sha256"]
    total = sum(a["size"] for a in want.values())
    assert sum(n for n, _ in seen) == total and {t for _, t in seen} == {total}
    # A second download finds every file in place with its sha256 and fetches nothing.
    before = {f.path: f.path.stat().st_mtime_ns for f in files}
    again = asyncio.run(fetch())
    assert {f.path: f.path.stat().st_mtime_ns for f in again} == before


def test_a_download_killed_midway_resumes_where_it_stopped(tmp_path: Path) -> None:
    """A real interruption: `ftq download` of a 300 MB file is SIGKILLed once its .part holds some of it;
    run again, it asks for the rest only (Range + If-Range) and checks the whole file's sha256, which
    the server computes in the background (the file is past what a listing hashes itself)."""
    import signal
    import subprocess

    from bench.artifacts_tar import api_deployment, job_with_final
    from tests.harness import FTQ, REPO, clean_env

    with api_deployment(tmp_path / "srv") as dep:
        job = job_with_final(dep, 300 * 1024**2, files=1, random=False)
        name = "model-00001-of-00001.safetensors"
        path = f"final/{name}"
        out = tmp_path / "out"
        part = out / f"{name}.part"
        proc = subprocess.Popen(
            [FTQ, "download", job, path, "--out", str(out)],
            cwd=REPO,
            env=clean_env(FTQ_URL=dep.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if part.exists() and part.stat().st_size > 20 * 1024**2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the download ended before it could be interrupted"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        have = part.stat().st_size
        assert 0 < have < 300 * 1024**2
        assert not (out / name).exists()

        r = run_ftq("download", job, path, "--out", str(out), url=dep.url, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "resumed at" in r.stdout and "sha256 ok" in r.stdout, r.stdout
        listed = {a["path"]: a for a in dep.get(f"/jobs/{job}/artifacts")["data"]}
        assert listed[path]["sha256"] == _sha((dep.run_dir(job) / path).read_bytes())
        assert _sha((out / name).read_bytes()) == listed[path]["sha256"]
        assert not part.exists()
