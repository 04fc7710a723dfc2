"""DAPO: its pure decisions (varied groups, more groups, overlong shaping), its loss and its config."""
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rose
from rose.errors import ConfigError
from rose.graph import rl_step
from rose.pipeline import with_algorithm
from rose.runtime.dapo import more_groups, overlong_penalty, varied_groups
from rose.runtime.grpo import grpo_loss
from rose.runtime.trainer import _trainable
from rose.runtime.trajectory import Trajectory, to_batch


@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0]), st.booleans()), max_size=40))
def test_a_group_is_kept_when_the_rewards_of_two_or_more_of_its_unfailed_samples_differ(rows):
    g = [r[0] for r in rows]
    kept = varied_groups(g, [r[1] for r in rows], [r[2] for r in rows])
    for group in set(g):
        rewards = [r for gg, r, ok in rows if gg == group and ok]
        assert (group in kept) == (len(rewards) >= 2 and len(set(rewards)) > 1)
    assert kept <= set(g)


@given(st.integers(1, 64), st.integers(0, 256), st.integers(0, 256), st.integers(1, 6), st.integers(1, 6))
def test_more_groups_stops_when_full_or_out_of_rounds_and_asks_for_at_most_a_batch(target, sampled, kept, rounds,
                                                                                  max_rounds):
    kept = min(kept, sampled)
    more = more_groups(target, sampled, kept, rounds, max_rounds)
    if kept >= target or rounds >= max_rounds:
        assert more == 0
    else:
        assert 1 <= more <= target


def test_more_groups_asks_for_the_shortfall_over_the_kept_fraction():
    assert more_groups(16, 16, 4, 1, 4) == 16  # 12 short at 1/4 kept: 48, capped at a batch
    assert more_groups(16, 16, 12, 1, 4) == 6  # 4 short at 3/4 kept
    assert more_groups(16, 16, 0, 1, 4) == 16  # nothing kept yet: a batch again
    assert more_groups(16, 16, 12, 4, 4) == 0  # out of rounds


def test_overlong_penalty_is_dapos_soft_punishment():
    p = overlong_penalty([10, 16, 18, 20, 25], max_tokens=20, buffer=4, penalty=1.0)
    assert p.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty([10, 25], 0, 0, 1.0).tolist() == [0.0, 0.0]  # off
    assert overlong_penalty([20, 21], 20, 0, 0.5).tolist() == [0.0, -0.5]  # a hard limit


def test_clip_higher_lets_a_rising_token_keep_its_gradient_past_the_low_clip():
    old = torch.log(torch.tensor([[0.5, 0.2]]))
    new = (old + torch.log(torch.tensor(1.25))).requires_grad_()  # ratio 1.25: past 1.2, under 1.28
    mask = torch.tensor([[0.0, 1.0]])
    for high, flows in ((None, False), (0.28, True)):
        new.grad = None
        loss, stats = grpo_loss(new, old, old, torch.tensor([1.0]), mask, clip=0.2, tis_cap=2.0, clip_high=high)
        loss.backward()
        assert (new.grad.abs().sum() > 0) == flows
        assert stats["clip_frac"] == (0.0 if flows else 1.0)


def test_token_and_sequence_aggregation_weigh_long_answers_differently():
    lp = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    token, _ = grpo_loss(lp, lp, lp, adv, mask, 0.2, 2.0, agg="token")
    sequence, _ = grpo_loss(lp, lp, lp, adv, mask, 0.2, 2.0, agg="sequence")
    assert token.item() == pytest.approx(-(3 - 1) / 4)  # every token counts once
    assert sequence.item() == pytest.approx(0.0)  # each answer counts once


def test_dapo_config_defaults_and_what_a_caller_set_stays():
    d = rose.DAPOConfig()
    assert (d.clip_upper, d.samples_dynamically, d.aggregation) == (0.28, True, "token")
    g = rose.GRPOConfig(clip_high=0.3, dynamic_sampling=False)
    assert (g.clip_upper, g.samples_dynamically) == (0.3, False)
    switched = replace(g, algorithm="dapo")
    assert (switched.clip_upper, switched.samples_dynamically) == (0.3, False)  # set by the caller: kept
    assert replace(rose.GRPOConfig(), algorithm="dapo").clip_upper == 0.28
    for bad, field in ((dict(algorithm="ppo"), "algorithm"), (dict(loss_agg="mean"), "loss_agg"),
                       (dict(overlong_max_tokens=10, overlong_buffer=11), "overlong_buffer"),
                       (dict(max_sample_rounds=0), "max_sample_rounds"), (dict(clip_high=-0.1), "clip_high")):
        with pytest.raises(ConfigError, match=f"GRPOConfig.{field}"):
            rose.GRPOConfig(**bad)


def _table(rewards_by_group):
    trajs = []
    for g, rewards in rewards_by_group.items():
        for i, r in enumerate(rewards):
            t = Trajectory(0, g, i, "guess", g)
            t.add_context([1])
            t.add_generated([2], [-0.5], [0])
            trajs.append(t)
    return pa.Table.from_batches([to_batch(trajs, [r for rs in rewards_by_group.values() for r in rs])])


def test_dynamic_sampling_trains_only_on_the_groups_whose_rewards_vary():
    table = _table({0: [1.0, 1.0], 1: [0.0, 1.0], 2: [0.5, 0.5]})
    ok, m = _trainable(table, rose.DAPOConfig())
    assert set(ok["group_id"].to_pylist()) == {1} and m["groups_sampled"] == 3 and m["groups_varied"] == 1
    ok, m = _trainable(table, rose.GRPOConfig())  # GRPO trains on all of them
    assert ok.num_rows == 6 and m["groups_varied"] == 1


def test_with_algorithm_switches_every_train_node():
    p = rose.Pipeline(name="p", env="guess", build=lambda s: rl_step("g", "guess", 2, 2, grpo=rose.GRPOConfig(lr=1e-3)))
    cfg = with_algorithm(p, "dapo").build(0).nodes["train"].params["grpo"]
    assert cfg.algorithm == "dapo" and cfg.lr == 1e-3 and cfg.samples_dynamically
    with pytest.raises(ConfigError, match="algorithm='ppo'"):
        with_algorithm(p, "ppo")
