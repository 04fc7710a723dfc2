"""The simulator's sync times come from the runtime's planner; its calibration fits what it says it
fits and predicts the rest."""
from __future__ import annotations

import os

import pytest

from rose.sim.calibrate import GUESS, calibrate, fit_coserve_overhead, harvest
from rose.sim.costs import load_cpu_profile
from rose.sim.sync import sync_times

RUNS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks", "sim", "e2e_runs.jsonl")
GB = 1e9


def test_each_shard_crosses_each_slow_link_once_and_deltas_shrink_it():
    sites = {"job": 4, "serve": 16, "cloud": 8}
    dense = sync_times(sites, "job", 16 * GB, 400, 20, sparse=False, relays=True)
    assert dense.bytes_inter == pytest.approx(2 * 16 * GB, rel=1e-6)  # one crossing into each remote site
    sparse = sync_times(sites, "job", 16 * GB, 400, 20, sparse=True, relays=True, changed_fraction=0.03)
    assert sparse.bytes_inter == pytest.approx(2 * 16 * GB * 0.03, rel=1e-6)
    full = sync_times(sites, "job", 16 * GB, 400, 20, sparse=False, relays=False)
    assert full.bytes_inter == pytest.approx(24 * 16 * GB, rel=1e-6)  # every remote receiver from the source
    assert sparse.per_site["serve"] < dense.per_site["serve"] < full.per_site["serve"]
    # 16 GB over 20 Gbit/s is 6.4 s at least; the relays add the fan-out inside the site
    assert dense.per_site["serve"] >= 6.4


def test_calibration_reproduces_what_it_fits_and_reports_every_measured_mode():
    res = calibrate(RUNS)
    rows = {(r["policy"], r["mode"]): r for r in res["rows"]}
    assert set(rows) >= {("fixed", "sync"), ("rose", "async"), ("ideal", "async"), ("elastic", "async")}
    fixed = rows[("fixed", "sync")]
    assert fixed["sim_rollout_s"] == pytest.approx(fixed["measured_rollout_s"], rel=0.01)  # the fitted figure
    # the nearest harvest the fit reaches (it steps with whole sequences offered), reported to 3 decimals
    assert res["coserve_harvest"] == pytest.approx(res["measured_harvest"], abs=0.0025)
    ideal = rows[("ideal", "async")]
    if load_cpu_profile().contention > 0:  # the trainer slowed by rollouts on the other core
        assert ideal["sim_traj_s"] < ideal["sim_no_contention_traj_s"]
    else:
        assert ideal["sim_traj_s"] == ideal["sim_no_contention_traj_s"]
    assert res["calibration_error"] == max(r["error"] for r in res["rows"])


def test_more_coserving_overhead_harvests_less(monkeypatch):
    # Whatever host measured the current profile, harvest never grows with the overhead...
    now = [harvest(GUESS, x) for x in (0.0, 3.0, 5.0, 20.0)]
    assert now == sorted(now, reverse=True) and now[0] > 0
    # ...and on one whose co-served steps leave rollout a budget (the AMX host's kept profile; on the AVX2
    # host's, 3 ms of overhead already leaves none at 70 req/s) it falls strictly, and the fit inverts it.
    import rose.sim.platform as platform

    kept = os.path.join(os.path.dirname(RUNS), "cpu_profile_9069073.json")
    monkeypatch.setattr(platform, "load_cpu_profile", lambda: load_cpu_profile(kept))
    assert harvest(GUESS, 0.0) > harvest(GUESS, 5.0) > harvest(GUESS, 20.0)
    target = harvest(GUESS, 3.0)  # a harvest the profile can reach: the fit finds the overhead that gives it
    assert fit_coserve_overhead(GUESS, target) == pytest.approx(3.0, abs=0.05)


def test_calibration_serves_the_rate_its_runs_served(tmp_path, monkeypatch):
    import json

    import rose.sim.calibrate as cal

    rows = [json.loads(line) for line in open(RUNS) if line.strip()]
    served = [r for r in rows if "rate" in r]
    assert served  # rose's runs say their rate
    seen = []
    real = cal._sim
    monkeypatch.setattr(cal, "_sim", lambda cfg: (seen.append(cfg.serving_rps), real(cfg))[1])
    moved = tmp_path / "runs.jsonl"
    moved.write_text("".join(json.dumps({**r, "rate": 16.5} if "rate" in r else r) + "\n" for r in rows))
    calibrate(str(moved))
    assert set(seen) == {16.5}  # every simulated setup, not the default config's rate
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(moved.read_text() + json.dumps({**served[0], "rate": 33.0}) + "\n")
    with pytest.raises(ValueError, match="different serving rates"):
        calibrate(str(mixed))
