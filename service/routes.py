"""What the routers declare alike: an id in the path, and the error answers the OpenAPI document lists
for a route (each with the `{"detail", "code"}` body of `service.errors`)."""

from __future__ import annotations

from typing import Any

from fastapi import Path

from ftq.contract.schemas import ErrorBody

Responses = dict[int | str, dict[str, Any]]


def error(description: str) -> dict[str, Any]:
    """One error answer of a route: when it happens."""
    return {"model": ErrorBody, "description": description}


UNAUTHORIZED = error("Missing or invalid bearer token")
# What the guard refuses when auth is off (service.guard): a browser's request from another site.
CROSS_SITE = error("Auth off: a cross-origin or cross-site request")


def owner_errors(not_found: str) -> Responses:
    """A route on one of the owner's things: 401 without a valid token, 404 for a thing that does not
    exist or is another owner's (the API does not tell them apart)."""
    return {401: UNAUTHORIZED, 404: error(not_found)}


# The longest id a route's path takes.
ID_MAX_LENGTH = 64


def id_in_path(description: str) -> Any:
    """The id of a job, file, export or webhook in a route's path."""
    return Path(min_length=1, max_length=ID_MAX_LENGTH, description=description)
