"""The cluster simulator: determinism, conservation, closed forms, and that the runtime's own policy
functions are the ones making its decisions."""
from __future__ import annotations

from dataclasses import replace

import pytest

import rose.runtime.coserve.slo as slo_mod
import rose.runtime.dapo as dapo
import rose.runtime.placement.elastic as elastic_mod
import rose.runtime.placement.policy as policy_mod
import rose.runtime.weights.plan as plan_mod
import rose.sim.sync as sync_mod
from rose.sim import SimConfig, Simulation
from rose.sim.cluster import SimulationError
from rose.sim import platform as platform_mod
from rose.sim import scaling, serving, workload
from rose.sim.compare import compare

SMALL = SimConfig(name="t", job_gpus=8, serving_gpus=8, prompts=48, group_size=8, steps=5, turns_max=6,
                  tokens_per_turn=120.0, max_num_seqs=64, elastic_max_gpus=8, allocation_delay_s=20.0)


def run(cfg: SimConfig, policy: str):
    return Simulation(cfg, policy).run()


def conserved(r) -> None:
    assert r.tasks_done == r.tasks_created > 0
    assert r.duplicates == 0
    assert r.leftover_tasks == 0
    assert r.accounting_error_s < 1e-6  # busy + environment-only + idle = time up, for every instance
    assert len(r.step_end) == len(r.train_s)


@pytest.mark.parametrize("policy", SMALL.policies)
def test_every_group_finishes_once_and_gpu_seconds_add_up(policy):
    r = run(SMALL, policy)
    conserved(r)
    assert len(r.step_end) == SMALL.steps
    assert r.throughput > 0


def test_deterministic_for_a_seed_and_not_across_seeds():
    a, b = run(SMALL, "rose").summary(), run(SMALL, "rose").summary()
    for measured in ("wall_s", "allocation_overhead"):  # both count wall time spent in this process
        a.pop(measured), b.pop(measured)
    assert a == b
    # allocation_overhead adds the placement's CPU time on this host to the simulated waits for capacity;
    # those waits (elastic's allocation delays: rose has none here) repeat exactly
    ea, eb = run(SMALL, "elastic"), run(SMALL, "elastic")
    assert ea.alloc_wait_s == eb.alloc_wait_s > 0
    c = run(replace(SMALL, seed=1), "rose").summary()
    assert c["traj_per_s"] != a["traj_per_s"]


def test_every_policy_sees_the_same_work():
    cfg = replace(SMALL, algorithm="dapo")
    demands = {p: run(cfg, p).demand for p in ("fixed_async", "rose", "elastic")}
    assert demands["fixed_async"] == demands["rose"] == demands["elastic"]
    assert max(demands["rose"]) > min(demands["rose"])  # DAPO: demand varies from step to step


def test_with_nothing_to_borrow_or_rent_fixed_and_rose_agree():
    cfg = replace(SMALL, serving_gpus=0, elastic_max_gpus=0)
    t = {p: run(cfg, p).throughput for p in ("fixed_async", "elastic", "rose")}
    assert t["fixed_async"] == pytest.approx(t["rose"], rel=1e-12) == pytest.approx(t["elastic"], rel=1e-12)


def test_an_idle_serving_fleet_lends_everything_rose_reaches_ideal():
    cfg = replace(SMALL, trace="none", prompts=96)
    rose, ideal = run(cfg, "rose"), run(cfg, "ideal")
    assert rose.placements.get("serving", 0) > 0
    assert rose.throughput == pytest.approx(ideal.throughput, rel=0.02)


def test_infinite_links_make_sync_time_vanish():
    fast = run(replace(SMALL, intra_gbit=1e12, inter_gbit=1e12), "rose")
    assert max(fast.sync_s) < 1e-6
    slow = run(replace(SMALL, inter_gbit=1.0, sparse_sync=False), "rose")
    assert max(slow.sync_s) > 10.0  # 16 GB dense over 1 Gbit/s: over two minutes


def test_relays_and_sparse_sync_each_shorten_sync():
    base = replace(SMALL, inter_gbit=20.0, serving_gpus=32)
    full = max(run(replace(base, relays=False, sparse_sync=False), "rose").sync_s)
    relayed = max(run(replace(base, sparse_sync=False), "rose").sync_s)
    sparse = max(run(base, "rose").sync_s)
    assert sparse < relayed < full


def test_the_slo_check_catches_a_controller_that_ignores_the_budget(monkeypatch):
    cfg = replace(SMALL, tpot_ms=60.0)
    r = run(cfg, "rose")
    assert r.placements.get("serving", 0) > 0 and r.slo_windows > 0
    assert r.slo_violations == r.slo_violations_alone == 0  # the real controller keeps the TPOT budget
    # Eight rollout steps beside every serving step, whatever the budget: serving misses its TPOT.
    monkeypatch.setattr(serving.ServingFleet, "steps", lambda self, decodes, seqs: 8)
    greedy = run(cfg, "rose")
    assert greedy.slo_violations > 0 and greedy.slo_violations_alone == 0


def test_a_prompt_waits_out_rollout_periods_between_its_prefill_chunks_only_inside_the_ttft_guard():
    import numpy as np

    from rose.sim.costs import LinearCost

    cost = LinearCost(a_ms=2.0, b_ms=0.1, prefill_ms_per_token=0.01, max_seqs=64, cold_start_s=0.0, wake_s=0.0,
                      weight_bytes=0.0)

    def ttft(prompt: int, ttft_ms: float) -> tuple[float, float, float, float]:
        shape = serving.RequestShape(prompt_mean=prompt, prompt_p99=prompt, gen_mean=10.0)
        fleet = serving.ServingFleet(slo_mod.SloConfig(ttft_ms, 100.0), cost, cost, shape, 1e12, 1e12, 1.0, 0.0, 512,
                                     np.random.default_rng(0))
        s_ms, r_ms = cost.decode_ms(float(serving.p99(8))), cost.decode_ms(32)
        return fleet.slo_ok(8, 32)[2], s_ms, r_ms, fleet.steps(8, 32) * r_ms

    # one chunk: the iteration under way, then its prefill step, whose end brings the first token
    t, s_ms, r_ms, period = ttft(100, 10_000.0)
    assert period > r_ms and t == pytest.approx(s_ms + period + s_ms + 1.0)
    assert ttft(100, 20.0)[0] == pytest.approx(t)  # the guard has nothing to hold back
    # three chunks inside a loose guard: the period's rollout steps before each of the next two
    assert ttft(1536, 10_000.0)[0] == pytest.approx(s_ms + period + 3 * (s_ms + 5.12) + 2 * period)
    # a guard (10 ms) the first chunk's wait has passed: no rollout step between the chunks
    assert ttft(1536, 20.0)[0] == pytest.approx(s_ms + period + 3 * (s_ms + 5.12))


def test_bursty_load_sheds_and_nothing_is_lost():
    r = run(replace(SMALL, trace="bursty", serving_rps=20.0, prompts=96, load_tick_s=5.0), "rose")
    assert r.sheds > 0
    conserved(r)


def test_preempted_spot_instances_lose_work_but_no_group():
    r = run(replace(SMALL, prompts=96, preempt_mean_s=60.0, allocation_delay_s=5.0), "elastic")
    assert r.preemptions > 0
    conserved(r)
    assert r.allocation_overhead > 0


def _spy(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def spy(*a, **kw):
        calls[name] = calls.get(name, 0) + 1
        return real(*a, **kw)
    monkeypatch.setattr(module, name, spy)


def test_the_runtime_policies_make_the_decisions(monkeypatch):
    # The simulator holds the runtime's functions themselves, not copies ...
    assert scaling.place is policy_mod.place and scaling.plan_shed is policy_mod.plan_shed
    assert scaling.plan_migrate is policy_mod.plan_migrate and scaling.elastic_target is elastic_mod.elastic_target
    assert serving.SloController is slo_mod.SloController
    assert sync_mod.plan_sync is plan_mod.plan_sync and sync_mod.plan_full is plan_mod.plan_full
    assert workload.more_groups is dapo.more_groups
    # ... and calls them: spies on the names the simulator looks up see every decision.
    calls: dict = {}
    _spy(monkeypatch, scaling, "place", calls)
    _spy(monkeypatch, scaling, "elastic_target", calls)
    _spy(monkeypatch, slo_mod.SloController, "rollout_capacity", calls)
    _spy(monkeypatch, slo_mod.SloController, "steps_beside", calls)
    _spy(monkeypatch, sync_mod, "plan_sync", calls)
    platform_mod._sync_cached.cache_clear()
    cfg = replace(SMALL, seed=7)
    run(cfg, "rose")
    run(cfg, "elastic")
    assert calls.get("place", 0) > 0 and calls.get("rollout_capacity", 0) > 0
    assert calls.get("elastic_target", 0) > 0 and calls.get("plan_sync", 0) > 0 and calls.get("steps_beside", 0) > 0


def test_a_broken_placement_policy_stops_the_simulation_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(scaling, "place", lambda tasks, workers, policy: [])
    with pytest.raises(SimulationError, match="no rollout finished .* 96 groups of 8 waiting, 0 running"):
        Simulation(replace(SMALL, steps=2), "rose").run()


def test_groups_wider_than_any_engine_are_a_clear_error():
    with pytest.raises(SimulationError,
                       match="nothing left to happen .* groups of 128 waiting.* at most 64 on one instance"):
        run(replace(SMALL, group_size=128, max_num_seqs=64, serving_gpus=0), "fixed_async")


def test_compare_keeps_each_policy_best_split():
    c = compare(replace(SMALL, train_fractions=(0.25, 0.75), policies=("fixed_async", "rose")))
    for p, r in c.results.items():
        for f in (0.25, 0.5, 0.75):
            assert r.throughput >= run(replace(SMALL, train_fraction=f), p).throughput - 1e-9
    assert c.speedup() == pytest.approx(c.results["rose"].throughput / c.results["fixed_async"].throughput)
