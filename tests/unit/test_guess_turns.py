"""benchmarks/support/guess_turns.py: a guess episode's turns read against the interval its feedback leaves."""
import pytest

from benchmarks.support.guess_turns import block_stats


def _row(target, actions, reward):
    return {"ground_truth": str(target), "actions": actions, "env_reward": reward}


def test_turns_are_judged_against_the_interval_the_feedback_so_far_leaves():
    rows = [
        # 8 (midpoint of 1..16) -> higher; 12 (midpoint of 9..16) -> lower; 3 lies outside 9..11; 10 found
        _row(10, ["guess 8 \n", "guess 12 \n", "guess 3 \n", "guess 10 \n"], 0.7),
        # 16 is inside 1..16 but not its midpoint -> lower; then a malformed turn ends the episode
        _row(5, ["guess 16 \n", "5 \n"], -1.0),
        # five turns, none found
        _row(1, ["guess 9 \n", "guess 4 \n", "guess 2 \n", "guess 16 \n", "guess 3 \n"], 0.0),
    ]
    s = block_stats(rows)
    assert (s["found"], s["missed"], s["malformed"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert s["reward"] == pytest.approx(-0.1)
    # turn 1: 8, 16, 9 (none outside; 8 and 9 are 1..16's middle numbers); turn 2: 12, 4 (12 is 9..16's
    # middle, 4 is 1..8's); turn 3: 3 outside 9..11, 2 inside 1..3 and its midpoint; turn 4: 10 inside 9..11
    # and its midpoint, 16 outside 1..1; turn 5: 3 outside 1..1
    assert s["outside"] == pytest.approx([0, 0, 0.5, 0.5, 1.0])
    assert s["middle"] == pytest.approx([2 / 3, 1.0, 0.5, 0.5, 0.0])
