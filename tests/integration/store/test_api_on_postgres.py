"""The in-process API and migration tests that take `store_url`, run again with PostgreSQL as the store
(this folder's conftest gives `store_url`): storage, pages, owners, idempotency, the schema, pause and
resume, evaluations (the cap's advisory lock, scores, events), and the scheduler's queue rows and usage
accounting (upserts and row locks in PostgreSQL's dialect)."""

from __future__ import annotations

import pytest

from tests.unit.ftq.store.test_migrate import test_upgrade_to_head_then_downgrade_to_base
from tests.unit.service.test_api import (
    test_concurrent_duplicates_make_one_job,
    test_create_list_get_paginate,
    test_idempotency,
    test_logs_metrics_checkpoints_read_the_run_dir,
    test_method_metrics_are_stored_merged_and_served_in_extra,
    test_owners_are_kept_apart,
    test_pause_holds_a_queued_job_resume_queues_it_and_an_ended_job_refuses_both,
)
from tests.unit.service.test_evaluations import test_routes_scores_and_placement
from tests.unit.service.test_usage import test_queue_usage_and_estimate_vs_actual

pytestmark = pytest.mark.postgres

__all__ = [
    "test_concurrent_duplicates_make_one_job",
    "test_create_list_get_paginate",
    "test_idempotency",
    "test_logs_metrics_checkpoints_read_the_run_dir",
    "test_method_metrics_are_stored_merged_and_served_in_extra",
    "test_owners_are_kept_apart",
    "test_pause_holds_a_queued_job_resume_queues_it_and_an_ended_job_refuses_both",
    "test_queue_usage_and_estimate_vs_actual",
    "test_routes_scores_and_placement",
    "test_upgrade_to_head_then_downgrade_to_base",
]
