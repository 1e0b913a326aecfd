"""The events API's models: defined in the core (`ftq.contract.schemas`), shared with the client SDK."""

from __future__ import annotations

from ftq.contract.schemas import ErrorBody, Event, EventPage

__all__ = ["ErrorBody", "Event", "EventPage"]
