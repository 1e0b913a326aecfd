"""The schema comes from Alembic only: upgrade from empty to head and back to base (SQLite here; PostgreSQL
in tests/integration/store/test_api_on_postgres.py)."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect

from ftq.store.migrate import downgrade, upgrade
from ftq.store.models import Base


def test_upgrade_to_head_then_downgrade_to_base(store_url: str) -> None:
    upgrade(store_url)
    engine = create_engine(store_url)
    tables = set(inspect(engine).get_table_names())
    assert {"jobs", "metric_points", "idempotency_keys", "dispatches", "alembic_version"} <= tables
    # The migration builds exactly what the models describe, column for column.
    for table in Base.metadata.sorted_tables:
        have = {c["name"] for c in inspect(engine).get_columns(table.name)}
        assert have == {c.name for c in table.columns}, table.name
    upgrade(store_url)  # idempotent
    downgrade(store_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(store_url)
    assert "jobs" in inspect(engine).get_table_names()
    engine.dispose()


def test_the_migrations_are_one_line() -> None:
    # Two features' migrations written from the same parent leave two heads: "upgrade head" then fails
    # on every deployment. Chain the newer one onto the other (its down_revision).
    from alembic.script import ScriptDirectory

    from ftq.store.migrate import alembic_config

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1, script.get_heads()
    revisions = list(script.walk_revisions())
    assert [r.revision for r in revisions][-1] == "0001" and all(
        r.revision.startswith(f"{len(revisions) - i:04d}") for i, r in enumerate(revisions)
    ), [r.revision for r in revisions]
