"""PostgreSQL for tests and benches: throwaway databases on the machine's server, stopping and starting
that server, and a server of the harness's own (PrivatePostgres: the fault tests stop it without
stopping anyone else's).

FTQ_TEST_PG_ADMIN names the maintenance database to connect to (default: the local server as postgres).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg

PG_ADMIN_URL = os.environ.get("FTQ_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_url(name: str, admin_url: str = PG_ADMIN_URL) -> str:
    """postgresql:// URL of database `name` on the admin URL's server."""
    return f"{admin_url.rsplit('/', 1)[0]}/{name}"


def sqlalchemy_url(url: str) -> str:
    """The same database as SQLAlchemy names it with the psycopg 3 driver."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def create_database(prefix: str = "ftq_test", admin_url: str = PG_ADMIN_URL) -> str:
    """A new empty database named `<prefix>_<random>` (on the machine's server unless `admin_url` names
    another's maintenance database); returns its postgresql:// URL."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(name, admin_url)


def drop_database(url: str, attempts: int = 10) -> None:
    """Drop the database of `url`, connections and all. The server may be restarting (the fault tests stop
    it): it is started again if need be, and the drop retried."""
    name = url.rsplit("/", 1)[1]
    for attempt in range(attempts):
        try:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.OperationalError:
            if attempt == attempts - 1:
                raise
            ensure_up()
            time.sleep(1)


@contextlib.contextmanager
def database(prefix: str = "ftq_test", *, migrate: bool = False) -> Iterator[str]:
    """A fresh database (migrated to head when `migrate`), dropped afterwards; yields its URL."""
    url = create_database(prefix)
    try:
        if migrate:
            from ftq.store.migrate import upgrade

            upgrade(sqlalchemy_url(url))
        yield url
    finally:
        drop_database(url)


def reset_schema(url: str) -> None:
    """Empty a database: its public schema dropped and made again."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


# The server itself (fault tests) ------------------------------------------------------------------------


def is_up(admin_url: str = PG_ADMIN_URL) -> bool:
    try:
        with psycopg.connect(admin_url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _cluster() -> tuple[str, str]:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    return version, "main"


def pg_ctl(action: str) -> None:
    """`pg_ctlcluster <version> main <action>` on Debian's cluster ("stop" is a fast shutdown)."""
    version, name = _cluster()
    argv = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action]
    if action == "stop":
        argv += ["-m", "fast"]
    subprocess.run(argv, check=False, capture_output=True, timeout=120)


def ensure_up(timeout: float = 90) -> None:
    """Start the server again if it is down (a fault test stopped it); RuntimeError if it will not."""
    deadline = time.monotonic() + timeout
    while not is_up():
        if time.monotonic() > deadline:
            raise RuntimeError("PostgreSQL did not come back")
        pg_ctl("start")
        time.sleep(1)


def answers_while_down(
    request: Callable[[], int | str], seconds: float, up: Callable[[], bool] = is_up
) -> tuple[Counter[str], Counter[str]]:
    """Call `request` for `seconds` while the server is stopped: (answers given while it was down before and
    after the call, answers given while it was up). Something else on the host may start PostgreSQL again
    early; an answer from then is no evidence about the outage. `up`: whether the server answers (the
    machine's, unless given)."""
    down: Counter[str] = Counter()
    back: Counter[str] = Counter()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        was_down = not up()
        answer = str(request())
        (down if was_down and not up() else back)[answer] += 1
        time.sleep(0.2)
    return down, back


class PrivatePostgres:
    """A PostgreSQL server of its own (initdb, pg_ctl) on a free loopback port, trust auth, in a folder
    that `close()` removes: `stop()` is an outage that no other test sees, `start()` ends it (same port).
    PostgreSQL refuses to run as root, so under root it runs as the `postgres` user, in a folder of its
    own under the system's temporary folder (pytest's are private to root)."""

    def __init__(self, port: int | None = None):
        from tests.harness.procs import free_port

        self.port = port or free_port()
        self.bin = Path(f"/usr/lib/postgresql/{_cluster()[0]}/bin")
        self.root = Path(tempfile.mkdtemp(prefix="ftq-pg-"))
        self.data = self.root / "data"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o700)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, tool: str, *args: str, timeout: float = 120) -> None:
        argv = [*self._as, str(self.bin / tool), *args]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: exit {out.returncode}\n{out.stdout}{out.stderr}")

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._pg(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"
            )
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._pg(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "start"
        )
        return self

    def stop(self) -> None:
        """A fast shutdown: an outage; returns once it no longer answers."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def is_up(self) -> bool:
        return is_up(self.admin_url)

    def create_database(self, prefix: str = "ftq_test") -> str:
        """A new empty database on this server; its postgresql:// URL."""
        return create_database(prefix, self.admin_url)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            if (self.data / "postmaster.pid").exists():
                self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
