"""Small helpers of the Files API tests: uploads as raw bodies or multipart forms, and waiting for a
validation."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.harness import Deployment


def upload_raw(dep: Deployment, token: str, data: bytes, filename: str = "data.jsonl") -> httpx.Response:
    with dep.client(token) as c:
        return c.post(
            "/files",
            params={"filename": filename},
            content=data,
            headers={"Content-Type": "application/jsonl"},
        )


def upload_form(dep: Deployment, token: str, data: bytes, filename: str = "data.jsonl") -> httpx.Response:
    with dep.client(token) as c:
        return c.post(
            "/files", files={"file": (filename, data, "application/jsonl")}, data={"purpose": "fine-tune"}
        )


def wait_validated(dep: Deployment, token: str, file_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with dep.client(token) as c:
        while True:
            r = c.get(f"/files/{file_id}")
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            if body["status"] != "validating":
                return body
            assert time.monotonic() < deadline, f"file {file_id} still validating after {timeout} s"
            time.sleep(0.2)


def owner_files(dep: Deployment) -> list[str]:
    """Every file (and partial upload) under the data dir's files/ folder, by name."""
    root = dep.data_dir / "files"
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []
