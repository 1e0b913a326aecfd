"""tests/unit/service/openai/test_uploads.py with PostgreSQL as the store (this folder's conftest gives
`store_url`): `complete`'s compare-and-set and a part's hold on its upload are row locks there, the
quota lock an advisory lock."""

from __future__ import annotations

import pytest

from tests.unit.service.openai.test_uploads import (
    test_a_wrong_md5_is_refused_and_nothing_kept,
    test_concurrent_parts_never_take_an_upload_past_its_declared_bytes,
    test_eight_concurrent_completes_make_one_file,
    test_expired_uploads_parts_are_swept,
    test_parts_count_in_the_owner_quota,
)

pytestmark = pytest.mark.postgres

__all__ = [
    "test_a_wrong_md5_is_refused_and_nothing_kept",
    "test_concurrent_parts_never_take_an_upload_past_its_declared_bytes",
    "test_eight_concurrent_completes_make_one_file",
    "test_expired_uploads_parts_are_swept",
    "test_parts_count_in_the_owner_quota",
]
