"""OpenAI's lists: `{"object": "list", "data", "has_more", "first_id", "last_id"}`, newest first, the next
page asked for with `after=<last id>` (the SDK's auto-pagination does exactly that)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from fastapi import Query

from ftq.contract.openai import OpenAIList

T = TypeVar("T")

AFTER = Query(None, max_length=64, description="The id of the last object of the previous page.")
LIMIT = Query(20, ge=1, le=100, description="Objects per page (1 to 100).")


def listing(data: list[T], has_more: bool, id_of: Callable[[T], str]) -> OpenAIList[T]:
    return OpenAIList[T](
        data=data,
        has_more=has_more,
        first_id=id_of(data[0]) if data else None,
        last_id=id_of(data[-1]) if data else None,
    )


def page_of(items: Sequence[T], after: str | None, limit: int, id_of: Callable[[T], str]) -> OpenAIList[T]:
    """One page of a list held whole (a job's events or checkpoints): the items after the one with id
    `after` (none there: an empty page)."""
    start = 0
    if after is not None:
        position = next((i for i, item in enumerate(items) if id_of(item) == after), None)
        if position is None:
            return listing([], False, id_of)
        start = position + 1
    shown = list(items[start : start + limit])
    return listing(shown, start + limit < len(items), id_of)
