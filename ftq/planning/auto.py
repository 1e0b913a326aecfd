"""The "auto" hyperparameters: what a fine-tune of `n` examples gets when its request leaves a choice to
the server (OpenAI's `"auto"`; `/v1` resolves its requests here, and any caller may). Pure functions of
the dataset's size and the world size, no I/O: the choices are part of planning, not of an HTTP adapter.

Epochs follow OpenAI's data-preparation guide: about 3 passes, at least ~100 and at most ~25,000 examples
trained on in all, between 1 and 25 epochs. The batch is about 0.2% of the examples, between 1 and 256.
GRPO samples `num_generations` completions per prompt (8 at compute multiplier 1, TRL's default), and its
per-device batch holds whole groups across the ranks (TRL's rule)."""

from __future__ import annotations

import math
from dataclasses import dataclass

TARGET_EPOCHS, MIN_TARGET_EXAMPLES, MAX_TARGET_EXAMPLES, MAX_DEFAULT_EPOCHS = 3, 100, 25_000, 25
DEFAULT_BETA = 0.1  # DPO's beta
BASE_GENERATIONS = 8  # GRPO's completions per prompt at compute_multiplier 1


def auto_epochs(n_examples: int) -> int:
    n = max(1, n_examples)
    if n * TARGET_EPOCHS < MIN_TARGET_EXAMPLES:
        return min(MAX_DEFAULT_EPOCHS, max(1, MIN_TARGET_EXAMPLES // n))
    if n * TARGET_EPOCHS > MAX_TARGET_EXAMPLES:
        return max(1, MAX_TARGET_EXAMPLES // n)
    return TARGET_EPOCHS


def auto_batch_size(n_examples: int) -> int:
    """About 0.2% of the examples, between 1 and 256."""
    return max(1, min(256, round(n_examples * 0.002)))


def num_generations(multiplier: float) -> int:
    """compute_multiplier as completions sampled per prompt: 8 at 1.0, never under 2 (GRPO compares them)."""
    return max(2, round(BASE_GENERATIONS * multiplier))


def grpo_batch(prompts: int, generations: int, world: int) -> int:
    """Per-device completions for `prompts` prompts a step: the smallest count at least
    prompts x generations / world whose total over the ranks holds whole groups (TRL's rule)."""
    per_device = max(1, math.ceil(prompts * generations / world))
    while (per_device * world) % generations:
        per_device += 1
    return per_device


@dataclass(frozen=True)
class Batches:
    step_batch: int  # examples (prompts, for GRPO) an optimizer step takes across the ranks
    per_device: int  # the per-device batch (completions, for GRPO)
    generations: int  # GRPO's completions per prompt; 0 for other methods


def batches(
    examples: int,
    world: int,
    *,
    batch_size: int | None = None,
    grpo: bool = False,
    compute_multiplier: float | None = None,
) -> Batches:
    """The batches of a run over `world` ranks: `batch_size` (None: auto_batch_size) examples a step, and
    for GRPO that many prompts, each completed num_generations(compute_multiplier) times in the step."""
    batch = auto_batch_size(examples) if batch_size is None else batch_size
    per_device = max(1, math.ceil(batch / world))
    if not grpo:
        return Batches(per_device * world, per_device, 0)
    generations = num_generations(1.0 if compute_multiplier is None else compute_multiplier)
    per_device = grpo_batch(batch, generations, world)
    return Batches(max(1, per_device * world // generations), per_device, generations)


def steps_per_epoch(examples: int, step_batch: int) -> int:
    return max(1, math.ceil(examples / step_batch))
