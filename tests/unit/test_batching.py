"""The engine loop's batch hold: the pure decision, and the loop stepping one full batch for turns that
come back in a wave instead of an iteration for the first of them."""
import time

import pytest
from hypothesis import given, strategies as st

from rose.errors import ConfigError
from rose.runtime.engine import EngineLoop, SamplingSpec
from rose.runtime.engine.batching import BatchHold, hold_s
from rose.runtime.engine.fake import FakeEngine

CFG = BatchHold(fill=0.75, quiet_s=0.004, max_s=0.03)


@given(pending=st.integers(0, 300), last=st.integers(0, 300), held=st.floats(0, 0.1),
       since=st.one_of(st.none(), st.floats(0, 0.1)))
def test_a_hold_is_never_past_its_bound_and_never_with_a_full_or_empty_batch(pending, last, held, since):
    if since is not None:
        since = min(since, held)  # an arrival since the iteration ended
    h = hold_s(CFG, pending, last, held, since)
    assert 0 <= h <= max(0.0, CFG.max_s - held) + 1e-12
    if pending == 0 or pending >= CFG.fill * last or held >= CFG.max_s:
        assert h == 0
    if since is not None and since >= CFG.quiet_s:
        assert h == 0


def test_it_holds_while_turns_come_back_and_steps_once_they_stop():
    assert hold_s(CFG, 2, 100, 0.001, None) == pytest.approx(0.029)  # nothing back yet: up to max_s
    assert hold_s(CFG, 40, 100, 0.010, 0.001) == pytest.approx(0.003)  # arriving: until quiet_s
    assert hold_s(CFG, 40, 100, 0.010, 0.005) == 0  # quiet: the others ended
    assert hold_s(CFG, 80, 100, 0.001, 0.0) == 0  # refilled
    assert hold_s(BatchHold(max_s=0), 2, 100, 0.0, None) == 0  # off


def test_bad_settings_are_named():
    for field, value in (("fill", 1.5), ("quiet_s", -1), ("max_s", -0.1)):
        with pytest.raises(ConfigError, match=f"BatchHold.{field}"):
            BatchHold(**{field: value})


class CountingEngine(FakeEngine):
    """Records how many requests each iteration ran."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.batches: list[int] = []

    def step(self):
        self.batches.append(len(self._reqs))
        return super().step()


def _turn(loop, i, turn):
    return loop.generate([5, 6], SamplingSpec(max_tokens=1, temperature=1.0), request_id=f"t{i}-turn{turn}")


def _until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


@pytest.mark.parametrize("hold", [None, BatchHold(fill=1.0, quiet_s=1.0, max_s=10.0)])
def test_turns_that_come_back_one_by_one_run_in_one_iteration_with_a_hold(hold):
    """8 one-token turns finish together; their next turns come back one at a time, 20 ms apart (an
    event loop busy preparing them). Without a hold the loop steps for the first one alone; with it,
    the 8 run as one batch. (The hold's bounds are far above the spacing: no timing is asserted.)"""
    engine = CountingEngine(vocab_size=16, max_model_len=32)
    loop = EngineLoop(engine, hold=hold)
    try:
        for f in [_turn(loop, i, 0) for i in range(8)]:
            f.result(5)
        assert engine.batches == [8]
        futures = []
        for i in range(8):
            futures.append(_turn(loop, i, 1))
            if i == 0 and hold is None:  # the loop steps for the first one alone
                _until(lambda: len(engine.batches) > 1)
            time.sleep(0.02)
        for f in futures:
            f.result(15)
        assert (engine.batches[1] == 8) == (hold is not None), engine.batches
    finally:
        loop.close()
