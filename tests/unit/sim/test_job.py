"""How a policy's job GPUs are split, and the trainer on devices it shares with a rollout engine."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, strategies as st

from rose.sim import SimConfig, Simulation
from rose.sim.calibrate import GUESS
from rose.sim.instance import Instance
from rose.sim.job import JobSplit, Trainer, job_split
from rose.sim.platform import build


@given(st.integers(1, 4096), st.sampled_from([1, 2, 4, 8]), st.floats(0.01, 1.0), st.booleans())
def test_no_device_counts_twice(job_gpus, tp, fraction, outside):
    s = job_split(job_gpus, fraction, tp, outside)
    assert s.dedicated >= (0 if outside else 1)
    if s.shared:  # only where the job cannot spare a whole instance's devices for rollouts
        assert s.dedicated == 1 and s.train_gpus == job_gpus and job_gpus <= tp
    else:
        assert s.train_gpus >= 1 and s.train_gpus + s.dedicated * tp == job_gpus


def test_split_one_trains_everywhere_only_with_capacity_outside():
    assert job_split(16, 1.0, 4, outside_capacity=True) == JobSplit(16, 0, False)
    assert job_split(16, 1.0, 4, outside_capacity=False) == JobSplit(12, 1, False)
    assert job_split(16, 0.9375, 4, outside_capacity=True) == JobSplit(16, 0, False)  # 1 spare GPU is no 4-GPU engine
    assert job_split(1, 0.5, 1, outside_capacity=False) == JobSplit(1, 1, True)  # one CPU core: trainer and engine


def test_a_trainer_beside_a_busy_engine_runs_at_half_speed_until_it_stops():
    t = Trainer()
    assert t.start(10.0, 2.0, engine_busy=True) == pytest.approx(14.0)  # 2 s of work at half speed
    assert t.engine_changed(11.0, engine_busy=True) is None  # no change, no new end
    assert t.engine_changed(12.0, engine_busy=False) == pytest.approx(13.0)  # 1 s done, 1 s left at full speed
    assert t.start(20.0, 2.0, engine_busy=False) == pytest.approx(22.0)


def test_a_trainer_sharing_its_core_with_the_engine_takes_longer_and_loses_nothing():
    cfg = replace(GUESS, policies=("fixed_async",), serving_gpus=0, max_num_seqs=256)
    shared = Simulation(cfg, "fixed_async")
    assert shared.shared is not None
    own = Simulation(replace(cfg, job_gpus=2), "fixed_async")  # a core each
    assert own.shared is None
    a, b = shared.run(), own.run()
    for r in (a, b):
        assert r.tasks_done == r.tasks_created and r.duplicates == 0 and r.accounting_error_s < 1e-6
    exclusive = np.mean(b.train_s)
    assert exclusive < np.mean(a.train_s) <= exclusive / shared.trainer.share + 1e-9
    assert a.throughput < b.throughput


def test_time_sharing_that_costs_switching_slows_both_sides():
    cfg = replace(GUESS, policies=("fixed_async",), serving_gpus=0, max_num_seqs=256)
    ideal = Simulation(cfg, "fixed_async")
    plat = replace(ideal.plat, share=0.4)  # each side at 0.4 of its speed while both run, not 0.5
    lossy = Simulation(cfg, "fixed_async", platform=plat)
    assert lossy.trainer.share == 0.4
    a, b = ideal.run(), lossy.run()
    assert b.tasks_done == b.tasks_created and b.accounting_error_s < 1e-6
    assert np.mean(b.train_s) > np.mean(a.train_s) and b.throughput < a.throughput


def test_between_turns_a_serving_workers_agent_loop_gets_the_rollouts_share_of_its_core():
    plat = build(replace(GUESS, serving_gpus=1), np.random.default_rng(0))
    ded = Instance("job/0", "dedicated", "dedicated", "job", plat.roll, 64, 0.0)
    assert ded.core_slowdown() == 1.0
    ded.factor = 1 / Trainer().share
    assert ded.core_slowdown() == 2.0
    srv = Instance("serve/0", "serving", "serving", "serve", plat.roll, 64, 0.0)
    srv.n_eff, srv.serving_ms = 32.0, 10.0
    r = plat.roll.decode_ms(32.0)
    assert srv.core_slowdown() == pytest.approx((10.0 + r) / r)


def test_gpu_setups_keep_their_split_as_run():
    cfg = SimConfig(name="t", model="32b", serving_model="serve-32b", job_gpus=16, serving_gpus=16, prompts=16,
                    group_size=8, steps=2, train_fraction=0.9375)
    assert Simulation(cfg, "rose").train_gpus == 16  # no 4-GPU rollout instance on top of 15 training GPUs
    assert Simulation(cfg, "fixed_async").train_gpus == 12


def test_a_cpu_hosts_rollout_instances_take_the_slots_the_config_gives_them():
    # elastic_e2e's fixed worker takes 256 sequences, the colocated one 64: the profile's engine with either
    for seqs in (64, 256):
        assert build(replace(GUESS, max_num_seqs=seqs), np.random.default_rng(0)).roll.max_seqs == seqs


def test_on_a_cpu_host_an_engine_between_turns_still_takes_the_trainers_core():
    # The per-turn overhead fitted on a CPU host is the agent loop's work on the engine's core: while the
    # next step's rollouts wait between long turns (decoding almost nothing), the trainer beside them still
    # runs at the shared speed, not at its own.
    cfg = replace(GUESS, policies=("fixed_async",), serving_gpus=0, max_num_seqs=256, env_latency_s=2.0, steps=6)
    sim = Simulation(cfg, "fixed_async")
    shared = sim.run()
    own = Simulation(replace(cfg, job_gpus=2), "fixed_async").run()  # the same steps, the trainer on a core of its own
    assert sim.shared is not None and shared.tasks_done == shared.tasks_created and shared.accounting_error_s < 1e-6
    exclusive = max(own.train_s)
    # a step trained while the next one's rollouts were in flight ran at the shared speed throughout
    assert max(shared.train_s) == pytest.approx(exclusive / sim.trainer.share, rel=0.05)
