"""The trainer's learning rate (GRPOConfig.lr, lr_warmup_steps, lr_decay_steps): a linear warm-up and
a cosine decay counted in updates, the config's rate at every update (also after a restore, whose
optimizer state carries the saved one)."""
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rose.config import GRPOConfig
from rose.runtime.trainer import Trainer
from tests.unit.test_trainer_microbatch import _table, model_dir  # noqa: F401  (a fixture)


def test_the_warm_up_ramps_linearly_to_lr_and_stays():
    cfg = GRPOConfig(lr=1e-3, lr_warmup_steps=4)
    assert [cfg.lr_at(u) for u in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert GRPOConfig(lr=1e-3).lr_at(0) == 1e-3  # no warm-up by default
    for bad in (-1, 2.5, None):
        with pytest.raises(ValueError, match="lr_warmup_steps"):
            GRPOConfig(lr_warmup_steps=bad)


def test_the_decay_follows_a_half_cosine_after_the_warm_up_and_stays_at_its_floor():
    cfg = GRPOConfig(lr=1e-3, lr_warmup_steps=2, lr_decay_steps=4, lr_final_ratio=0.2)
    # Updates 0-1 ramp; 2 starts the decay at lr; 4 is halfway (the mean of lr and the floor); 6 on: the floor.
    quarter, three_quarters = 2e-4 + 8e-4 * (1 + 2 ** -0.5) / 2, 2e-4 + 8e-4 * (1 - 2 ** -0.5) / 2
    assert [cfg.lr_at(u) for u in range(9)] == pytest.approx(
        [5e-4, 1e-3, 1e-3, quarter, 6e-4, three_quarters, 2e-4, 2e-4, 2e-4])
    rates = [GRPOConfig(lr_decay_steps=50).lr_at(u) for u in range(60)]
    assert all(a > b for a, b in zip(rates[:50], rates[1:51])) and rates[50:] == [rates[50]] * 10
    assert GRPOConfig(lr=1e-3, lr_decay_steps=10, lr_final_ratio=0.0).lr_at(10) == 0.0
    for field, bad in (("lr_decay_steps", -1), ("lr_decay_steps", 1.5), ("lr_final_ratio", 1.5),
                       ("lr_final_ratio", -0.1), ("lr_final_ratio", None)):
        with pytest.raises(ValueError, match=field):
            GRPOConfig(**{field: bad})


@given(lr=st.floats(1e-6, 1e-2), warmup=st.integers(0, 20), decay=st.integers(1, 300),
       ratio=st.floats(0.0, 1.0), updates=st.integers(1, 400))
def test_after_the_warm_up_the_rate_never_rises_and_stays_between_floor_and_lr(lr, warmup, decay, ratio, updates):
    cfg = GRPOConfig(lr=lr, lr_warmup_steps=warmup, lr_decay_steps=decay, lr_final_ratio=ratio)
    rates = [cfg.lr_at(u) for u in range(warmup, warmup + updates)]
    assert rates[0] == pytest.approx(lr)
    assert all(lr * ratio * (1 - 1e-12) <= r <= lr * (1 + 1e-12) for r in rates)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(rates, rates[1:]))
    assert cfg.lr_at(warmup + decay + updates) == pytest.approx(lr * ratio)


def test_an_update_in_the_warm_up_is_the_update_at_its_rate(model_dir):  # noqa: F811
    table = _table(seed=4)
    base = GRPOConfig(lr=1e-3, inner_epochs=2, compute_dtype="float32")
    ramped, plain = Trainer(model_dir, device="cpu"), Trainer(model_dir, device="cpu")
    assert ramped.step(table, replace(base, lr_warmup_steps=4))["lr"] == 2.5e-4
    assert plain.step(table, replace(base, lr=2.5e-4))["lr"] == 2.5e-4
    for (name, a), b in zip(ramped.model.state_dict().items(), plain.model.state_dict().values()):
        assert torch.equal(a, b), name
    # The second update runs at twice the first's rate: the weights now part.
    assert ramped.step(table, replace(base, lr_warmup_steps=4))["lr"] == 5e-4
    assert plain.step(table, replace(base, lr=2.5e-4))["lr"] == 2.5e-4
    assert not all(torch.equal(a, b) for a, b in zip(ramped.model.state_dict().values(),
                                                      plain.model.state_dict().values()))


def test_a_restored_trainer_goes_on_with_the_ramp_and_the_configs_rate(model_dir, tmp_path):  # noqa: F811
    table, cfg = _table(seed=5), GRPOConfig(lr=1e-3, inner_epochs=1, lr_warmup_steps=3, compute_dtype="float32")
    t = Trainer(model_dir, device="cpu")
    t.step(table, cfg)
    t.save(str(tmp_path / "ckpt"))
    back = Trainer(model_dir, device="cpu")
    back.restore(str(tmp_path / "ckpt"))
    assert back.step(table, cfg)["lr"] == pytest.approx(2 * 1e-3 / 3)  # the second update of the ramp
    assert back.step(table, replace(cfg, lr=5e-4))["lr"] == 5e-4  # past the ramp: the config's rate, not the saved one
    assert back.opt.param_groups[0]["lr"] == 5e-4


def test_a_run_that_outlasts_its_decay_is_told_so():
    from rose.graph import rl_step
    from rose.pipeline import past_the_decay

    def graph(**grpo):
        return rl_step("guess", "guess", 2, 2, grpo=GRPOConfig(**grpo))

    assert past_the_decay(graph(lr_decay_steps=200), 200) == []  # the default pipeline's: the run's length
    assert past_the_decay(graph(lr_decay_steps=200), 5) == []  # a trial run ends before its decay
    assert past_the_decay(graph(), 400) == []  # no decay: a constant rate has no floor
    (msg,) = past_the_decay(graph(lr_decay_steps=200), 400)
    assert "'train'" in msg and "last 199 updates" in msg and "lr_decay_steps=400" in msg
    (msg,) = past_the_decay(graph(lr_warmup_steps=10, lr_decay_steps=100), 300)
    assert "by update 110" in msg and "lr_decay_steps=290" in msg
