"""The dashboard's SLO attainment series, from the plugin's cumulative history samples."""
from rose.runtime.scheduler.dashboard import _attainment_series


def test_attainment_windows_from_cumulative_counts():
    now = 1000.0
    # (time, address, role, slots, used, slo_met, slo_requests): 20 requests a sample, 5 missed in the second
    history = [(now - 30 + i, "s", "serving", 8, 0, met, reqs)
               for i, (met, reqs) in enumerate([(0, 0), (20, 20), (35, 40), (55, 60)])]
    history.append((now - 25, "d", "dedicated", 8, 4, None, None))  # no serving counters: skipped
    xs, ys = _attainment_series(history, now)["s"]
    assert ys == [1.0, 0.75, 1.0]
    assert xs == [-29.0, -28.0, -27.0]


def test_small_windows_accumulate_until_twenty_requests():
    now = 100.0
    history = [(now - 10 + i, "s", "serving", 8, 0, met, reqs)
               for i, (met, reqs) in enumerate([(0, 0), (5, 5), (9, 10), (19, 20), (30, 31)])]
    _, ys = _attainment_series(history, now)["s"]
    # the window stays open from 0 until 20 requests: 5/5, 9/10, 19/20; then a new one from 20: 11/11
    assert ys == [1.0, 0.9, 0.95, 1.0]
