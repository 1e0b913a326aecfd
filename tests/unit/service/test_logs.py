"""The API's log reader (service/jobs/logs.py) in process, on a run dir of the test's own: chunks of whole
UTF-8 characters, secrets masked however a chunk cuts them, the limits on a chunk."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftq.contract.status import JobStatus
from ftq.runtime.redact import mask
from ftq.runtime.settings import Settings
from ftq.store.models import Job
from service.jobs.logs import LOG_CHUNK_MAX, read_log

SECRET = "hf_SECRETXYZ"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


def job_with_log(settings: Settings, data: bytes, status: JobStatus = JobStatus.running) -> Job:
    job = Job(id="job_logs00000000001", status=str(status))
    run = settings.runs_dir / job.id
    run.mkdir(parents=True)
    (run / "train.log").write_bytes(data)
    return job


def read_all(job: Job, settings: Settings, limit: int, secrets: list[str] | None = None) -> list[str]:
    """Every chunk from offset 0 until the reader stops moving, as a poller reads them."""
    texts: list[str] = []
    offset = 0
    for _ in range(100_000):
        chunk = read_log(job, settings, offset=offset, limit=limit, secrets_=secrets or [])
        assert chunk.offset == offset
        assert chunk.next_offset >= offset
        if chunk.next_offset == offset:
            return texts
        texts.append(chunk.text)
        offset = chunk.next_offset
    raise AssertionError("the reader never stopped")


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 64, 4096])
def test_chunks_add_up_to_the_log_and_never_split_a_character(settings: Settings, limit: int) -> None:
    text = "".join(f"step {i} ✓ día 𝄞\n" for i in range(40))
    job = job_with_log(settings, text.encode(), JobStatus.succeeded)
    chunks = read_all(job, settings, limit)
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    # A chunk holds at most `limit` bytes, unless one character alone is longer (then exactly it).
    assert all(len(c.encode()) <= max(limit, 4) for c in chunks)


def test_complete_only_once_a_terminal_job_was_read_to_its_end(settings: Settings) -> None:
    running = job_with_log(settings, b"abc\n")
    first = read_log(running, settings, offset=0, limit=100, secrets_=[])
    assert first.text == "abc\n" and first.next_offset == 4 and first.complete is False
    done = Job(id=running.id, status="succeeded")
    assert read_log(done, settings, offset=0, limit=2, secrets_=[]).complete is False
    end = read_log(done, settings, offset=2, limit=2, secrets_=[])
    assert end.text == "c\n" and end.complete is True


def test_a_missing_log_is_an_empty_chunk_at_the_same_offset(settings: Settings) -> None:
    job = Job(id="job_nolog000000001", status="queued")
    chunk = read_log(job, settings, offset=7, limit=10, secrets_=[])
    assert (chunk.text, chunk.next_offset, chunk.complete) == ("", 7, False)
    ended = Job(id=job.id, status="failed")
    assert read_log(ended, settings, offset=0, limit=10, secrets_=[]).complete is True


def test_partial_utf8_at_the_end_of_a_live_log_is_held_back(settings: Settings) -> None:
    clef = "𝄞".encode()  # 4 bytes
    job = job_with_log(settings, b"ok " + clef[:2])
    chunk = read_log(job, settings, offset=0, limit=100, secrets_=[])
    assert chunk.text == "ok " and chunk.next_offset == 3
    # The trainer writes the rest of the character: the next poll starts on its first byte.
    with (settings.runs_dir / job.id / "train.log").open("ab") as f:
        f.write(clef[2:] + b"\n")
    again = read_log(job, settings, offset=chunk.next_offset, limit=100, secrets_=[])
    assert again.text == "𝄞\n" and again.next_offset == 3 + 5


def test_a_chunk_ending_inside_a_character_stops_before_it(settings: Settings) -> None:
    job = job_with_log(settings, "aé".encode(), JobStatus.succeeded)  # a, then 2 bytes
    chunk = read_log(job, settings, offset=0, limit=2, secrets_=[])
    assert chunk.text == "a" and chunk.next_offset == 1


def test_a_terminal_log_that_ends_inside_a_character_is_read_to_its_end(settings: Settings) -> None:
    # Nothing more will be written: the broken character is shown as one replacement, and the end reached.
    job = job_with_log(settings, b"end " + "é".encode()[:1], JobStatus.failed)
    chunk = read_log(job, settings, offset=0, limit=100, secrets_=[])
    assert chunk.text == "end \ufffd" and chunk.next_offset == 5 and chunk.complete is True


def test_limits_are_clamped(settings: Settings) -> None:
    big = b"x" * (LOG_CHUNK_MAX + 10)
    job = job_with_log(settings, big, JobStatus.succeeded)
    capped = read_log(job, settings, offset=0, limit=10 * LOG_CHUNK_MAX, secrets_=[])
    assert capped.next_offset == LOG_CHUNK_MAX and capped.complete is False
    for tiny in (0, -5):
        chunk = read_log(job, settings, offset=0, limit=tiny, secrets_=[])
        assert chunk.text == "x" and chunk.next_offset == 1  # a limit below 1 still moves on
    past = read_log(job, settings, offset=len(big) + 100, limit=10, secrets_=[])
    assert past.text == "" and past.next_offset == len(big) + 100


def test_limit_1_on_a_multibyte_character_returns_the_whole_character(settings: Settings) -> None:
    job = job_with_log(settings, "✓✓".encode(), JobStatus.succeeded)
    assert read_all(job, settings, 1) == ["✓", "✓"]


# Secrets ----------------------------------------------------------------------------------------------


def secret_log() -> bytes:
    # Only characters that are not in the secret around it: any of its letters in a chunk is a leak.
    return (f"aa {SECRET} bb\n" * 3 + f"{SECRET}{SECRET}\n" + "b" * 5 + SECRET).encode()


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 6, 11, 12, 13, 17, 40, 4096])
def test_a_secret_cut_by_any_chunk_boundary_is_masked(settings: Settings, limit: int) -> None:
    job = job_with_log(settings, secret_log(), JobStatus.succeeded)
    chunks = read_all(job, settings, limit, secrets=[SECRET])
    for text in chunks:
        assert not set(text) & set(SECRET), (limit, text)
    assert "aa *" in "".join(chunks)


@pytest.mark.parametrize("offset", range(len("aa ") + 1, len("aa ") + len(SECRET)))
def test_a_read_starting_inside_a_secret_is_masked(settings: Settings, offset: int) -> None:
    job = job_with_log(settings, secret_log(), JobStatus.succeeded)
    for limit in (1, 4, 100):
        text = read_log(job, settings, offset=offset, limit=limit, secrets_=[SECRET]).text
        assert text.startswith("***") and not set(text) & set(SECRET), (offset, limit, text)


def test_empty_secret_values_mask_nothing(settings: Settings) -> None:
    job = job_with_log(settings, b"plain text\n", JobStatus.succeeded)
    assert read_log(job, settings, offset=0, limit=100, secrets_=["", ""]).text == "plain text\n"


def test_mask_merges_overlapping_and_adjacent_secrets() -> None:
    window = b"xx abcdef yy abc"
    assert mask(window, 0, len(window), [b"abcd", b"cdef"]) == b"xx *** yy abc"
    assert mask(window, 0, len(window), [b"abc", b"def"]) == b"xx *** yy ***"
    # Only the chunk [at, at+length) comes back; a secret reaching into it from the window is masked.
    assert mask(window, 5, 6, [b"abcdef"]) == b"*** y"
    assert mask(window, 0, 3, [b"abcdef"]) == b"xx "
    assert mask(window, 0, len(window), []) == window
