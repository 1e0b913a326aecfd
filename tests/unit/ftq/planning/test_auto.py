"""ftq.planning.auto: the "auto" hyperparameters, as OpenAI's guide and TRL's GRPO batching give them."""

from __future__ import annotations

import pytest

from ftq.planning import auto


@pytest.mark.parametrize(
    ("examples", "epochs"),
    [(1, 25), (10, 10), (20, 5), (34, 3), (1000, 3), (8333, 3), (8334, 2), (10_000, 2), (30_000, 1)],
)
def test_auto_epochs_aim_at_three_passes_within_100_to_25000_examples(examples: int, epochs: int) -> None:
    assert auto.auto_epochs(examples) == epochs


def test_the_auto_batch_is_about_two_per_thousand_examples_within_1_to_256() -> None:
    assert [auto.auto_batch_size(n) for n in (10, 1000, 10_000, 1_000_000)] == [1, 2, 20, 256]


def test_grpo_batches_hold_whole_groups_across_the_ranks() -> None:
    b = auto.batches(100, 3, batch_size=4, grpo=True, compute_multiplier=1.0)
    # 4 prompts x 8 completions over 3 ranks: 11 each would split a group; 16 x 3 = 48 = 6 whole groups.
    assert (b.per_device, b.generations) == (16, 8) and (b.per_device * 3) % 8 == 0
    assert b.step_batch == 6
    assert auto.batches(100, 2, batch_size=4).per_device == 2
    assert auto.num_generations(0.1) == 2  # never fewer than two to compare
    assert auto.steps_per_epoch(10, 4) == 3
