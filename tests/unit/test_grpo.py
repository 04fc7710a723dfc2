import math

import pytest
import torch

from rose.runtime.grpo import group_advantages, grpo_loss, token_logprobs


def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0])
    g = torch.tensor([0, 0, 1, 1, 2])
    adv = group_advantages(r, g, eps=0.0 + 1e-12)
    # group 0: mean 0.5, sample std sqrt(0.5)
    s = math.sqrt(0.5)
    assert adv[0].item() == pytest.approx(0.5 / s)
    assert adv[1].item() == pytest.approx(-0.5 / s)
    assert adv[2].item() == 0 and adv[3].item() == 0  # no spread: no signal
    assert adv[4].item() == 0  # a group of one


def test_loss_equals_minus_mean_advantage_at_ratio_one():
    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -0.5]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = grpo_loss(lp, lp, lp, adv, mask, clip=0.2, tis_cap=2.0)
    # ratio 1, tis 1: -(1 + 1 - 2) / 3
    assert loss.item() == pytest.approx(0.0)
    assert stats["clip_frac"] == 0 and stats["tis_mean"] == pytest.approx(1.0)


def test_clipping_hand_computed():
    old = torch.log(torch.tensor([[1.0, 0.5]]))
    new = torch.log(torch.tensor([[1.0, 0.8]]))  # ratio 1.6 on the masked token
    mask = torch.tensor([[0, 1]])
    loss_pos, st = grpo_loss(new, old, old, torch.tensor([1.0]), mask, clip=0.2, tis_cap=2.0)
    assert loss_pos.item() == pytest.approx(-1.2)  # min(1.6, 1.2) * 1
    assert st["clip_frac"] == 1.0
    loss_neg, _ = grpo_loss(new, old, old, torch.tensor([-1.0]), mask, clip=0.2, tis_cap=2.0)
    assert loss_neg.item() == pytest.approx(1.6)  # min(-1.6, -1.2) = -1.6


def test_truncated_importance_weight():
    old = torch.log(torch.tensor([[1.0, 0.9]]))
    behav = torch.log(torch.tensor([[1.0, 0.3]]))  # engine gave the token 0.3, trainer 0.9: weight 3 -> cap 2
    mask = torch.tensor([[0, 1]])
    loss, st = grpo_loss(old, old, behav, torch.tensor([1.0]), mask, clip=0.2, tis_cap=2.0)
    assert st["tis_mean"] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(-2.0)


def test_masked_slots_do_not_leak_gradients_or_nans():
    lp = torch.tensor([[float("-inf"), -1.0]], requires_grad=True)
    mask = torch.tensor([[0, 1]])
    loss, _ = grpo_loss(lp, lp.detach(), lp.detach(), torch.tensor([1.0]), mask, 0.2, 2.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert lp.grad[0, 0] == 0


def test_token_logprobs_alignment_and_temperature():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2 strongly
    ids = torch.tensor([[1, 2, 3]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 3) and lp[0, 0] == 0
    assert lp[0, 1].item() == pytest.approx(torch.log_softmax(logits[0, 0], -1)[2].item())
    hot = token_logprobs(logits, ids, temperature=2.0)
    assert hot[0, 1].item() == pytest.approx(torch.log_softmax(logits[0, 0] / 2, -1)[2].item())
