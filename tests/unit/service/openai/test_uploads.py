"""`/v1/uploads` under races and limits (a red-team finding: eight concurrent `complete`s of one upload
made eight files, losers answered 500 and left `.file_*.part` files past the quota, a wrong `md5` was
ignored, and a part over the upload's declared size was refused in the name of FTQ_MAX_FILE_BYTES).

The upload's state is in the store (ftq.store.uploads_repository); `complete` claims it by a
compare-and-set. Requests race in one event loop against the app in process (httpx's ASGI transport,
each handler's blocking work in the app's thread pool). Runs on SQLite here and on PostgreSQL in
tests/integration/store/test_uploads_on_postgres.py."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select, update

from tests.harness.inprocess import MakeClient

TOKENS = "tok-alice:alice,tok-bob:bob"
ALICE = {"Authorization": "Bearer tok-alice"}


def _sdk(client: Any, token: str = "tok-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=token, http_client=client, max_retries=0)


def _lines(n: int, width: int = 200) -> bytes:
    return b"".join(json.dumps({"text": f"{i:06d} " + "x" * width}).encode() + b"\n" for i in range(n))


def _create(sdk: openai.OpenAI, size: int, name: str = "a.jsonl") -> str:
    return sdk.uploads.create(
        bytes=size, filename=name, mime_type="application/jsonl", purpose="fine-tune"
    ).id


def _leftovers(data_dir: Path) -> list[str]:
    """What uploads may leave in the files folders: partial files, joined files, parts, their folders."""
    root = data_dir / "files"
    found = [p for p in root.rglob("*") if p.name.endswith((".part", ".joined")) or _is_part(p)]
    found += [p for p in root.rglob("upload_*") if p.is_dir()]
    return sorted(str(p.relative_to(root)) for p in found)


def _is_part(path: Path | str) -> bool:
    return Path(path).name.startswith("part_")


def _rows(upload_id: str) -> tuple[str, str | None, int]:
    """The upload's status, file id and how many part rows it has, from the store."""
    from ftq.store.db import session_scope
    from ftq.store.models import OpenAIUpload, OpenAIUploadPart

    with session_scope() as session:
        row = session.scalars(select(OpenAIUpload).where(OpenAIUpload.id == upload_id)).one()
        parts = session.scalars(select(OpenAIUploadPart).where(OpenAIUploadPart.upload_id == upload_id)).all()
        return row.status, row.file_id, len(parts)


async def _at_once(app: Any, requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """POST every (path, httpx keyword arguments) at once, in one event loop; an exception in the app is
    answered as a 500 and counted, not raised."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=ALICE) as http:
        return list(await asyncio.gather(*(http.post(path, **kw) for path, kw in requests)))


def _upload_in_parts(sdk: openai.OpenAI, content: bytes, parts: int) -> tuple[str, list[str]]:
    upload_id = _create(sdk, len(content), "big.jsonl")
    step = -(-len(content) // parts)
    chunks = [content[i : i + step] for i in range(0, len(content), step)]
    ids = [sdk.uploads.parts.create(upload_id, data=chunk).id for chunk in chunks]
    assert len(ids) == parts
    return upload_id, ids


def test_eight_concurrent_completes_make_one_file(
    make_client: MakeClient, store_url: str, ftq_env: dict[str, str]
) -> None:
    client = make_client(store_url, api_tokens=TOKENS, file_quota_bytes=str(5 * 1024 * 1024))
    sdk = _sdk(client)
    content = _lines(3000)  # ~620 KB in 30 parts
    upload_id, part_ids = _upload_in_parts(sdk, content, 30)

    body = {"json": {"part_ids": part_ids}}
    answers = asyncio.run(_at_once(client.app, [(f"/v1/uploads/{upload_id}/complete", body)] * 8))

    codes = sorted(r.status_code for r in answers)
    assert codes == [200] + [409] * 7, [(r.status_code, r.text[:200]) for r in answers]
    for lost in (r for r in answers if r.status_code == 409):
        error = lost.json()["error"]
        assert error["param"] == "upload_id" and "already" in error["message"], error
    [won] = [r.json() for r in answers if r.status_code == 200]
    assert won["status"] == "completed" and won["file"]["bytes"] == len(content)
    assert [f.id for f in sdk.files.list()] == [won["file"]["id"]]
    assert sdk.files.content(won["file"]["id"]).content == content
    assert _leftovers(Path(ftq_env["FTQ_DATA_DIR"])) == []
    assert _rows(upload_id) == ("completed", "file_" + won["file"]["id"].removeprefix("file-"), 0)

    # Once completed: another complete, a part and a cancel are refused or answered as it is, no 500.
    with pytest.raises(openai.ConflictError, match="already completed"):
        sdk.uploads.complete(upload_id, part_ids=part_ids)
    with pytest.raises(openai.ConflictError, match="parts go to a pending upload only"):
        sdk.uploads.parts.create(upload_id, data=b"{}\n")
    assert sdk.uploads.cancel(upload_id).status == "completed"
    assert len(sdk.files.list().data) == 1 and _leftovers(Path(ftq_env["FTQ_DATA_DIR"])) == []


def test_concurrent_parts_never_take_an_upload_past_its_declared_bytes(
    make_client: MakeClient, store_url: str, ftq_env: dict[str, str]
) -> None:
    client = make_client(store_url, api_tokens=TOKENS)
    sdk = _sdk(client)
    up = _create(sdk, 10_000, "a.jsonl")
    part = {"files": {"data": ("blob", b"x" * 6000, "application/octet-stream")}}
    answers = asyncio.run(_at_once(client.app, [(f"/v1/uploads/{up}/parts", part)] * 4))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 413, 413, 413], [(r.status_code, r.text[:200]) for r in answers]
    for refused in (r for r in answers if r.status_code == 413):
        assert "10000 bytes it was created for" in refused.json()["error"]["message"], refused.text
    assert _rows(up)[2] == 1
    # Only the accepted part is on disk: the refused ones left nothing.
    on_disk = _leftovers(Path(ftq_env["FTQ_DATA_DIR"]))
    assert len([p for p in on_disk if _is_part(p)]) == 1 and not [p for p in on_disk if p.endswith(".part")]


def test_a_part_over_the_declared_size_is_a_413_naming_the_upload_bytes(make_client: MakeClient) -> None:
    sdk = _sdk(make_client(api_tokens=TOKENS))
    up = _create(sdk, 10, "s.jsonl")
    with pytest.raises(openai.APIStatusError) as err:
        sdk.uploads.parts.create(up, data=b"x" * 100)
    assert err.value.status_code == 413
    message = err.value.message
    assert "10 bytes it was created for" in message and "`bytes`" in message, message
    assert "FTQ_MAX_FILE_BYTES" not in message, message
    # After 6 bytes, 4 are left: the message says so.
    sdk.uploads.parts.create(up, data=b"x" * 6)
    with pytest.raises(openai.APIStatusError, match="6 received") as err:
        sdk.uploads.parts.create(up, data=b"x" * 5)
    assert err.value.status_code == 413


def test_parts_count_in_the_owner_quota(
    make_client: MakeClient, store_url: str, ftq_env: dict[str, str]
) -> None:
    client = make_client(store_url, api_tokens=TOKENS, file_quota_bytes="10000")
    sdk = _sdk(client)
    a = _create(sdk, 8000, "a.jsonl")
    b = _create(sdk, 8000, "b.jsonl")
    sdk.uploads.parts.create(a, data=b"x" * 6000)
    # Another upload's part that would pass the quota with the parts received before it.
    with pytest.raises(openai.RateLimitError, match="FTQ_FILE_QUOTA_BYTES"):
        sdk.uploads.parts.create(b, data=b"x" * 6000)
    # A file through either API counts them too (the native `POST /files` did not).
    row = b'{"text": "' + b"y" * 5988 + b'"}\n'
    native = client.post("/files", content=row, headers={**ALICE, "Content-Type": "application/jsonl"})
    assert native.status_code == 429 and "FTQ_FILE_QUOTA_BYTES" in native.json()["detail"], native.text
    with pytest.raises(openai.RateLimitError):
        sdk.files.create(file=("c.jsonl", io.BytesIO(row)), purpose="fine-tune")
    assert [p for p in _leftovers(Path(ftq_env["FTQ_DATA_DIR"])) if p.endswith(".part")] == []
    # Another owner's quota is its own.
    assert _sdk(client, "tok-bob").files.create(file=("c.jsonl", io.BytesIO(row)), purpose="fine-tune").bytes

    assert sdk.uploads.cancel(a).status == "cancelled"  # its parts go: the room is back
    assert _rows(a) == ("cancelled", None, 0)
    with pytest.raises(openai.ConflictError, match="cancelled"):
        sdk.uploads.parts.create(a, data=b"x")
    with pytest.raises(openai.ConflictError, match="cancelled"):
        sdk.uploads.complete(a, part_ids=[])
    native = client.post("/files", content=row, headers={**ALICE, "Content-Type": "application/jsonl"})
    assert native.status_code == 201, native.text
    assert _leftovers(Path(ftq_env["FTQ_DATA_DIR"])) == []


def test_a_wrong_md5_is_refused_and_nothing_kept(
    make_client: MakeClient, store_url: str, ftq_env: dict[str, str]
) -> None:
    sdk = _sdk(make_client(store_url, api_tokens=TOKENS))
    content = _lines(40)
    upload_id, part_ids = _upload_in_parts(sdk, content, 3)
    right = hashlib.md5(content, usedforsecurity=False).hexdigest()
    backwards = hashlib.md5(content[::-1], usedforsecurity=False).hexdigest()

    with pytest.raises(openai.BadRequestError) as err:
        sdk.uploads.complete(upload_id, part_ids=part_ids, md5=backwards)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "md5" and right in body["message"], body
    with pytest.raises(openai.BadRequestError) as err:  # the parts out of order
        sdk.uploads.complete(upload_id, part_ids=part_ids[::-1], md5=right)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "md5"
    assert sdk.files.list().data == []
    left = _leftovers(Path(ftq_env["FTQ_DATA_DIR"]))
    assert not [p for p in left if p.endswith((".part", ".joined"))], left
    assert _rows(upload_id) == ("pending", None, 3)

    done = sdk.uploads.complete(upload_id, part_ids=part_ids, md5=right.upper())
    assert done.status == "completed" and done.file is not None
    assert sdk.files.content(done.file.id).content == content
    assert _leftovers(Path(ftq_env["FTQ_DATA_DIR"])) == []

    empty = _create(sdk, 0, "empty.jsonl")  # no part at all: no folder until the join
    assert sdk.uploads.complete(empty, part_ids=[]).status == "completed"
    assert _leftovers(Path(ftq_env["FTQ_DATA_DIR"])) == []


def test_expired_uploads_parts_are_swept(
    make_client: MakeClient, store_url: str, ftq_env: dict[str, str]
) -> None:
    from ftq.store.db import session_scope
    from ftq.store.models import OpenAIUpload
    from ftq.store.uploads_repository import utcnow
    from worker import files as worker_files

    client = make_client(store_url, api_tokens=TOKENS, file_quota_bytes="10000")
    alice, bob = _sdk(client), _sdk(client, "tok-bob")
    data = Path(ftq_env["FTQ_DATA_DIR"])
    old = _create(alice, 8000, "a.jsonl")
    alice.uploads.parts.create(old, data=b"x" * 6000)
    bobs = _create(bob, 8000, "b.jsonl")
    bob.uploads.parts.create(bobs, data=b"x" * 6000)
    kept = _create(alice, 100, "k.jsonl")
    alice.uploads.parts.create(kept, data=b"x" * 10)
    # A folder of no upload in the store (the JSON-state uploads of before, a crash after a commit).
    stray = data / "files" / hashlib.sha256(b"alice").hexdigest()[:32] / "uploads" / ("upload_" + "0" * 24)
    stray.mkdir(parents=True)
    (stray / "upload.json").write_text("{}")

    # One whose `complete` died mid-join (left `completing`), an hour and more past its expiry.
    stuck = _create(alice, 100, "s.jsonl")
    alice.uploads.parts.create(stuck, data=b"x" * 10)
    past = utcnow() - timedelta(seconds=1)
    with session_scope() as session:
        long_ago = past - timedelta(hours=1)
        died = {"status": "completing", "expires_at": long_ago}
        session.execute(update(OpenAIUpload).where(OpenAIUpload.id == stuck).values(**died))
        session.execute(update(OpenAIUpload).where(OpenAIUpload.id.in_([old, bobs])).values(expires_at=past))

    # An expired upload refuses parts and complete (409, not 500), and reads as expired.
    with pytest.raises(openai.ConflictError, match="expired"):
        alice.uploads.complete(old, part_ids=[])
    with pytest.raises(openai.ConflictError, match="expired"):
        alice.uploads.parts.create(old, data=b"x")
    # Alice's upload requests sweep her expired uploads (not Bob's): the room is back.
    _create(alice, 9000, "c.jsonl")
    assert _rows(old) == ("expired", None, 0) and _rows(stuck) == ("expired", None, 0)
    assert alice.uploads.cancel(old).status == "expired"
    assert not stray.exists()
    assert _rows(bobs) == ("pending", None, 1)
    assert _rows(kept) == ("pending", None, 1)

    # The worker's hourly sweep: every owner's.
    worker_files._last_sweep = 0.0
    assert worker_files.sweep_partials() >= 1
    assert _rows(bobs) == ("expired", None, 0)
    assert _rows(kept) == ("pending", None, 1)
    left = _leftovers(data)
    assert [p for p in left if p.endswith(kept)] and not [p for p in left if old in p or bobs in p], left
