"""The store: engine and sessions, tables, every SQL statement, the outbox, migrations."""
