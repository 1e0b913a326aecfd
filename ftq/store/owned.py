"""The one owner filter of the API's reads (as Polar's `get_readable_statement`): every repository the API
uses for one owner's rows (`JobRepository(session, owner)`, `FileRepository`, ...) is an `OwnedRepository`,
and reads through `_readable()`, which is `_select()` filtered on `_owner_column()` equal to its owner. A
repository whose rows belong to an owner through another table (a side run through its job) says so by
overriding `_select()` (the join) and `_owner_column()`; nothing overrides the filter itself, so a new
query cannot forget it."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import Select, select
from sqlalchemy.orm import Session


class OwnedRepository:
    """One owner's rows of `model` (a subclass names it in its class body)."""

    model: ClassVar[Any]

    def __init__(self, session: Session, owner: str):
        self.session = session
        self.owner = owner

    def _select(self) -> Select[Any]:
        """What a read selects before the owner filter: the model's rows."""
        return select(self.model)

    def _owner_column(self) -> Any:
        """The column holding the owner of what `_select()` reads (a mapped attribute)."""
        return self.model.owner

    def _readable(self) -> Select[Any]:
        """`_select()`, this owner's rows only."""
        return self._select().where(self._owner_column() == self.owner)
