"""GRPOConfig.kl_coef: the KL penalty to the reference policy (the run's starting weights), k3 per token."""
import math
from dataclasses import replace

import pytest
import torch

from rose.config import GRPOConfig
from rose.runtime.grpo import grpo_loss
from rose.runtime.trainer import Trainer
from tests.unit.test_trainer_microbatch import _table, model_dir  # noqa: F401  (a fixture)


def test_k3_hand_computed_and_aggregated_like_the_policy_term():
    lp = torch.tensor([[0.0, -1.0, -2.0]])
    ref = torch.tensor([[0.0, -1.5, -2.0]])  # r = ref - lp: -0.5 on the first generated token, 0 on the second
    mask = torch.tensor([[0, 1, 1]])
    adv = torch.tensor([0.0])  # no policy signal: the loss is the penalty alone
    k3 = math.exp(-0.5) + 0.5 - 1
    loss, stats = grpo_loss(lp, lp, lp, adv, mask, 0.2, 2.0, ref_lp=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * k3 / 2)  # the token mean over both generated tokens
    assert stats["kl"] == pytest.approx(k3 / 2)
    seq, _ = grpo_loss(lp, lp, lp, adv, mask, 0.2, 2.0, agg="sequence", ref_lp=ref, kl_coef=0.1)
    assert seq.item() == pytest.approx(0.1 * k3 / 2)  # one row: its token mean
    plain, plain_stats = grpo_loss(lp, lp, lp, adv, mask, 0.2, 2.0)
    assert plain.item() == 0 and "kl" not in plain_stats  # off by default


def test_the_penalty_pulls_the_policy_back_toward_the_reference():
    ref = torch.tensor([[0.0, -1.0, -1.0]])
    mask = torch.tensor([[0, 1, 1]])
    for start in (-0.5, -2.0):  # above and below the reference's log-prob
        lp = torch.tensor([[0.0, start, -1.0]], requires_grad=True)
        loss, _ = grpo_loss(lp, lp.detach(), lp.detach(), torch.tensor([0.0]), mask, 0.2, 2.0, ref_lp=ref,
                            kl_coef=0.5)
        loss.backward()
        # Gradient descent moves lp against its gradient: toward -1.0; where lp = ref there is no pull.
        assert math.copysign(1, -lp.grad[0, 1].item()) == math.copysign(1, -1.0 - start)
        assert lp.grad[0, 2].item() == 0 and lp.grad[0, 0].item() == 0


def test_a_penalty_without_reference_log_probs_and_a_negative_coefficient_are_refused():
    lp, mask = torch.zeros(1, 2), torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="ref_lp"):
        grpo_loss(lp, lp, lp, torch.tensor([1.0]), mask, 0.2, 2.0, kl_coef=0.1)
    for bad in (-0.1, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="kl_coef"):
            GRPOConfig(kl_coef=bad)


def _distance(trainer, start):
    return sum(float((p - start[n]).pow(2).sum()) for n, p in trainer.model.state_dict().items()) ** 0.5


def test_a_trainer_with_the_penalty_stays_nearer_its_starting_weights(model_dir):  # noqa: F811
    table = _table(seed=6)
    cfg = GRPOConfig(lr=3e-3, inner_epochs=2, compute_dtype="float32")
    free, anchored = Trainer(model_dir, device="cpu"), Trainer(model_dir, device="cpu")
    start = {n: p.clone() for n, p in free.model.state_dict().items()}
    for _ in range(6):
        m_free = free.step(table, cfg)
        m_anchored = anchored.step(table, replace(cfg, kl_coef=5.0))
    assert free._reference is None and "kl" not in m_free  # no reference held without the penalty
    assert m_anchored["kl"] > 0  # the policy had moved from the reference when the last step began
    assert _distance(anchored, start) < 0.8 * _distance(free, start), (_distance(anchored, start),
                                                                        _distance(free, start))
    # The reference stays the starting weights, however far the policy goes.
    for n, p in anchored._reference.state_dict().items():
        assert torch.equal(p, start[n]), n


def test_a_restored_trainer_keeps_the_runs_starting_weights_as_its_reference(model_dir, tmp_path):  # noqa: F811
    table, cfg = _table(seed=7), GRPOConfig(lr=3e-3, inner_epochs=1, compute_dtype="float32", kl_coef=0.5)
    t = Trainer(model_dir, device="cpu")
    t.step(table, cfg)
    t.step(table, cfg)
    t.save(str(tmp_path / "ckpt"))
    back = Trainer(model_dir, device="cpu")
    back.restore(str(tmp_path / "ckpt"))
    m_on, m_back = t.step(table, cfg), back.step(table, cfg)
    assert m_back["kl"] == pytest.approx(m_on["kl"], rel=1e-5) and m_back["kl"] > 0
    for (n, a), b in zip(t.model.state_dict().items(), back.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), n
