"""A stand-in for the Hugging Face Hub on 127.0.0.1 (HF_ENDPOINT): what the fetch step asks for.

It serves one folder as a model repo in the Hub's URL layout (`/api/models/{repo}[/revision/{rev}]`
with the files' sizes, `/{repo}/resolve/{rev}/{file}` with the headers huggingface_hub reads), and one as
a dataset repo the same way under `/api/datasets/` and `/datasets/{repo}/resolve/`, answers
403 `GatedRepo` for a gated repo and 404 `RepoNotFound` for any other, and records the Authorization
header of every request (so a test sees which token reached the Hub).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    url: str
    repos: dict[str, Path]
    gated: set[str]
    datasets: dict[str, Path] = field(default_factory=dict)
    authorizations: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _route(self) -> tuple[str, Path | None, str | None]:
            """(repo, its folder or None, file or None) from /api/models/{repo}... or /{repo}/resolve/...
            (a dataset: /api/datasets/{repo}... or /datasets/{repo}/resolve/...)"""
            path = self.path.split("?")[0]
            repos = hub.repos
            if path.startswith(("/api/datasets/", "/datasets/")):
                repos = hub.datasets
                path = path.replace("/datasets/", "/models/" if path.startswith("/api/") else "/", 1)
            if path.startswith("/api/models/"):
                rest = path.removeprefix("/api/models/")
                repo = "/".join(rest.split("/")[:2])
                return repo, repos.get(repo), None
            parts = path.lstrip("/").split("/")
            repo = "/".join(parts[:2])
            if len(parts) >= 5 and parts[2] == "resolve":
                return repo, repos.get(repo), "/".join(parts[4:])
            return repo, None, None

        def _answer(self) -> None:
            hub.authorizations.append(self.headers.get("Authorization", ""))
            hub.paths.append(f"{self.command} {self.path}")
            repo, folder, name = self._route()
            if repo in hub.gated:
                self._error(403, "GatedRepo", f"Access to model {repo} is restricted.")
                return
            if folder is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return
            if name is None:
                files = sorted(p for p in folder.rglob("*") if p.is_file())
                siblings = [
                    {"rfilename": str(p.relative_to(folder)), "size": p.stat().st_size} for p in files
                ]
                body = json.dumps({"id": repo, "modelId": repo, "sha": SHA, "siblings": siblings}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
            else:
                target = folder / name
                if not target.is_file():
                    self._error(404, "EntryNotFound", f"{name} not found")
                    return
                body = target.read_bytes()
                self.send_response(200)
                self.send_header("X-Repo-Commit", SHA)
                self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
                self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = _answer
        do_HEAD = _answer

    return Handler


@contextmanager
def fake_hub(
    repos: dict[str, Path], gated: set[str] | None = None, datasets: dict[str, Path] | None = None
) -> Iterator[FakeHub]:
    """A fake Hub serving `repos` (model repo id -> folder) and `datasets` (dataset repo id -> folder)
    until the block ends."""
    hub = FakeHub(url="", repos=repos, gated=gated or set(), datasets=datasets or {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
