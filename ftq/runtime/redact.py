"""Secret values (FTQ_PASS_ENV) never leave the service: masked in text it stores or serves."""

from __future__ import annotations

from ftq.runtime.settings import get_settings

MASK = "***"


def redact(text: str) -> str:
    """text with every value of the operator's pass-through secrets replaced by `***`."""
    for value in sorted(get_settings().secret_values(), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
