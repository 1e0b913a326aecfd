"""The event log and webhook outbox tests of tests/unit/worker/test_webhooks.py, run again with PostgreSQL
as the store (this folder's conftest gives `store_url`): events in the transaction of their change,
ids that commit in order, deliveries in each job's order, retries and disabling."""

from __future__ import annotations

import pytest

from tests.unit.worker.test_webhooks import (
    receiver,
    store,
    test_a_failing_receiver_is_retried_in_order_then_gives_up_and_is_disabled,
    test_an_event_commits_with_its_change_or_not_at_all,
    test_deliveries_are_signed_and_in_event_order,
    test_receiver_down_then_up_loses_nothing,
    test_transitions_write_their_events_in_order,
)

pytestmark = pytest.mark.postgres

__all__ = [
    "receiver",
    "store",
    "test_a_failing_receiver_is_retried_in_order_then_gives_up_and_is_disabled",
    "test_an_event_commits_with_its_change_or_not_at_all",
    "test_deliveries_are_signed_and_in_event_order",
    "test_receiver_down_then_up_loses_nothing",
    "test_transitions_write_their_events_in_order",
]
