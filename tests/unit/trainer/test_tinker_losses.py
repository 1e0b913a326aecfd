"""The Tinker host's losses (trainer/tinker_host.py) against hand computation: cross_entropy with real
weights (a client-side custom loss sends -dL/dlogp as weights), importance_sampling and ppo's clipped
ratio, each the elementwise loss whose sum is minimized (Tinker's sums, no mean)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.tinker_host import UserError, _stops, datum_loss, target_logprobs


def test_target_logprobs_are_the_log_softmax_at_the_targets() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(2.0), 0.0]])
    lp = target_logprobs(logits, torch.tensor([1, 0]))
    assert lp.tolist() == pytest.approx([math.log(3 / 4), math.log(2 / 3)])


def test_cross_entropy_is_minus_the_weighted_logprobs() -> None:
    lp = torch.tensor([-1.0, -2.0, -0.5])
    loss = datum_loss("cross_entropy", lp, {"weights": torch.tensor([1.0, 0.0, -2.0])}, {})
    assert loss.tolist() == pytest.approx([1.0, 0.0, -1.0])
    assert datum_loss("cross_entropy", lp, {}, {}).sum().item() == pytest.approx(3.5)


def test_importance_sampling_weights_the_advantage_by_the_ratio() -> None:
    lp = torch.tensor([math.log(0.5), math.log(0.2)], requires_grad=True)
    inputs = {
        "logprobs": torch.tensor([math.log(0.25), math.log(0.2)]),
        "advantages": torch.tensor([1.0, -3.0]),
    }
    loss = datum_loss("importance_sampling", lp, inputs, {})
    assert loss.tolist() == pytest.approx([-2.0, 3.0])  # ratios 2 and 1
    loss.sum().backward()
    # d/dlp of -exp(lp - q) * A is -ratio * A.
    assert lp.grad is not None and lp.grad.tolist() == pytest.approx([-2.0, 3.0])


def test_ppo_clips_the_ratio_on_the_side_that_would_gain() -> None:
    q = torch.tensor([0.0, 0.0, 0.0, 0.0])
    lp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5]))  # ratios against q = 0: exp(lp)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss = datum_loss(
        "ppo", lp, {"logprobs": q, "advantages": adv}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    # A > 0: min(r, clip(r)) -> 1.2 for r = 1.5, 0.5 for r = 0.5; A < 0: min(-r, -clip(r)) -> -1.5, -0.8.
    assert loss.tolist() == pytest.approx([-1.2, -0.5, 1.5, 0.8])


def test_an_unsupported_loss_is_refused_by_name() -> None:
    with pytest.raises(UserError, match="cispo"):
        datum_loss("cispo", torch.zeros(1), {}, {})
    with pytest.raises(UserError, match="advantages"):
        datum_loss("ppo", torch.zeros(1), {"logprobs": torch.zeros(1)}, {})


def test_stops_none_keeps_eos_and_an_empty_list_stops_at_nothing() -> None:
    assert _stops(None, 2) == ({2}, [])
    assert _stops([], 2) == (set(), [])
    assert _stops("\n\nUser:", 2) == (set(), ["\n\nUser:"])
    assert _stops([7, 9], 2) == ({7, 9}, [])
