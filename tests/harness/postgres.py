"""PostgreSQL for tests and benches: throwaway databases on the machine's server, and (for the fault
tests) stopping and starting that server.

FTQ_TEST_PG_ADMIN names the maintenance database to connect to (default: the local server as postgres).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator

import psycopg

PG_ADMIN_URL = os.environ.get("FTQ_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")


def database_url(name: str) -> str:
    """postgresql:// URL of database `name` on the admin URL's server."""
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


def sqlalchemy_url(url: str) -> str:
    """The same database as SQLAlchemy names it with the psycopg 3 driver."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def create_database(prefix: str = "ftq_test") -> str:
    """A new empty database named `<prefix>_<random>`; returns its postgresql:// URL."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(name)


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


def is_up() -> bool:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=2) as conn:
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


def answers_while_down(request: Callable[[], int | str], seconds: float) -> tuple[Counter[str], Counter[str]]:
    """Call `request` for `seconds` while the server is stopped: (answers given while it was down before and
    after the call, answers given while it was up). Something else on the host may start PostgreSQL again
    early; an answer from then is no evidence about the outage."""
    down: Counter[str] = Counter()
    back: Counter[str] = Counter()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        was_down = not is_up()
        answer = str(request())
        (down if was_down and not is_up() else back)[answer] += 1
        time.sleep(0.2)
    return down, back
