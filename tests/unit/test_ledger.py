"""The trajectory ledger finds what goes missing or comes twice between the prompts and the trainer."""
from hypothesis import given
from hypothesis import strategies as st

from rose.ledger import reconcile

PLANNED = {f"s3-g{g}-i{i}" for g in range(4) for i in range(4)}


def test_a_clean_step_balances():
    led = reconcile(3, PLANNED, sorted(PLANNED))
    assert (led.planned, led.received, led.lost, led.duplicated) == (16, 16, 0, 0)


def test_a_dropped_and_a_duplicated_trajectory_are_counted_and_named():
    received = sorted(PLANNED - {"s3-g1-i2"}) + ["s3-g0-i0"]
    led = reconcile(3, PLANNED, received)
    assert (led.lost, led.duplicated) == (1, 1)
    assert led.lost_ids == ("s3-g1-i2",) and led.duplicated_ids == ("s3-g0-i0",)


def test_an_unplanned_trajectory_counts_as_duplicated():
    led = reconcile(3, PLANNED, sorted(PLANNED) + ["s4-g0-i0"])
    assert (led.lost, led.duplicated) == (0, 1) and led.duplicated_ids == ("s4-g0-i0",)


@given(st.lists(st.sampled_from(sorted(PLANNED)), max_size=40))
def test_every_row_is_accounted_for(received):
    led = reconcile(3, PLANNED, received)
    # each received row is either the first of a planned id or an extra one; each planned id is seen or lost
    assert led.received == len(received) == (len(PLANNED) - led.lost) + led.duplicated
