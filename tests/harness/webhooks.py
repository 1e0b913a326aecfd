"""A webhook receiver for tests and benches: a small http.server on 127.0.0.1 in a thread, recording each
delivery and answering `status`, that can be down (its port closed) and come back on the same port, or hold
its answers until `hold` is set."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harness import free_port


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))

    @property
    def type(self) -> str:
        return str(self.json["type"])

    @property
    def job_id(self) -> str:
        return str(self.json["data"]["job_id"])

    @property
    def seq(self) -> int:
        """The event's number in `webhook-id` (evt_<id>): what orders a job's deliveries."""
        return int(self.headers["webhook-id"].removeprefix("evt_"))


def signature_valid(secret: str, d: Delivery) -> bool:
    """Standard Webhooks' check, written here from the specification, not taken from ftq."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = d.headers["webhook-id"].encode() + b"." + d.headers["webhook-timestamp"].encode() + b"." + d.body
    want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return (
        want in d.headers.get("webhook-signature", "").split(" ")
        and abs(time.time() - int(d.headers["webhook-timestamp"])) < 300
    )


class Receiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks/ftq"
        self.received: list[Delivery] = []
        self.status = 204  # what each POST is answered
        self.hold: threading.Event | None = None  # when given, each POST waits (up to 20 s) for it first
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if receiver.hold is not None:
                    receiver.hold.wait(20)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    receiver.received.append(Delivery({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def of(self, job_id: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.received if d.job_id == job_id]

    def wait_for(self, job_id: str, type_: str, timeout: float = 120) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.of(job_id)
            if any(d.type == type_ for d in got):
                return got
            time.sleep(0.2)
        raise AssertionError(
            f"no {type_} delivery for {job_id} in {timeout}s; got {[d.type for d in self.of(job_id)]}"
        )
