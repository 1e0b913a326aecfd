"""The events API's models: defined in the core (`ftq.schemas`), shared with the client SDK."""

from __future__ import annotations

from ftq.schemas import ErrorBody, Event, EventPage

__all__ = ["ErrorBody", "Event", "EventPage"]
