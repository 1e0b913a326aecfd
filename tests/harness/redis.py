"""A Redis server of the harness's own: its own port and folder, so a fault test can stop it and start it
again without touching the machine's Redis or anyone else's data."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.harness.procs import free_port


class PrivateRedis:
    """`redis-server` on a free loopback port, no persistence; `stop()` is an outage, `start()` ends it
    (same port, so clients configured with `url()` reconnect)."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = root
        self.port = port or free_port()
        self.root.mkdir(parents=True, exist_ok=True)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def log_path(self) -> Path:
        return self.root / "redis.log"

    def cli(self, *args: str) -> str:
        """`redis-cli -p PORT ARGS`; its output, or "" when it did not answer within 10 s."""
        try:
            out = subprocess.run(
                ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
            )
        except subprocess.TimeoutExpired:
            return ""
        return out.stdout.strip()

    def is_up(self) -> bool:
        return self.cli("ping") == "PONG"

    def start(self, timeout: float = 20) -> PrivateRedis:
        if self.is_up():
            return self
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        options = {
            "daemonize": "yes",
            "bind": "127.0.0.1",
            "port": str(self.port),
            "save": "",  # no persistence: an outage loses what was queued, as `shutdown nosave` means
            "appendonly": "no",
            "dir": str(self.root),
            "pidfile": str(self.root / "redis.pid"),
            "logfile": str(self.log_path),
        }
        argv = ["redis-server"]
        for name, value in options.items():
            argv += [f"--{name}", value]
        subprocess.run(argv, check=True, timeout=20)
        deadline = time.monotonic() + timeout
        while not self.is_up():
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer; see {self.log_path}")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 10) -> None:
        """Shut it down without saving (an outage); returns once it no longer answers."""
        self.cli("shutdown", "nosave")
        deadline = time.monotonic() + timeout
        while self.is_up() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self.is_up(), f"redis on port {self.port} is still up"

    def close(self) -> None:
        if self.is_up():
            self.stop()
