"""tests/unit/service/test_file_quota.py with PostgreSQL as the store (this folder's conftest gives
`store_url`): the owner's quota lock is an advisory lock there."""

from __future__ import annotations

import pytest

from tests.unit.service.test_file_quota import (
    test_two_uploads_finishing_together_cannot_both_take_the_last_room,
)

pytestmark = pytest.mark.postgres

__all__ = ["test_two_uploads_finishing_together_cannot_both_take_the_last_room"]
