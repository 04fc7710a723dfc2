"""The integer codes and the change coding under deltas (`intcode.py`, `delta.py`): round trips and refusals."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.runtime.weights import delta, intcode

ints = st.lists(st.integers(0, 2**40), max_size=200).map(lambda xs: np.array(xs, np.int64))


@settings(max_examples=80, deadline=None)
@given(ints, st.binary(max_size=3))
def test_integer_codes_round_trip_and_end_where_they_say(x, tail):
    for enc, dec in ((intcode.rice_encode, intcode.rice_decode),
                     (intcode.exp_golomb_encode, intcode.exp_golomb_decode)):
        buf = b"\x07" + enc(x) + tail  # read at an offset, followed by other bytes
        got, end = dec(buf, 1)
        assert np.array_equal(got, x)
        assert end == len(buf) - len(tail)


def test_rice_size_is_near_the_entropy_of_geometric_gaps():
    # A geometric source of mean 41 (2.4 % density) has entropy H2(p)/p = 6.80 bits a gap;
    # the Rice code with the best parameter costs about 1 % more.
    p = 0.024
    x = np.random.default_rng(0).geometric(p, 100_000) - 1
    h = -(p * np.log2(p) + (1 - p) * np.log2(1 - p)) / p
    assert h * x.size / 8 < len(intcode.rice_encode(x)) < 1.015 * h * x.size / 8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-2**32 + 1, 2**32 - 1).filter(bool), max_size=300))
def test_changes_round_trip(diffs):
    d = np.array(diffs, np.int64)
    assert np.array_equal(delta.changes_decode(delta.changes_encode(d), d.size), d)


def test_sign_flips_and_float32_jumps_are_exact():
    old = np.array([0x0001, 0x8001, 0x3F80, 0x7F80, 0xFFFF], np.uint16)  # tiny +, tiny -, 1.0, inf, a NaN
    new = np.array([0x8001, 0x0001, 0x3F81, 0x7FC0, 0x0000], np.uint16)
    d = delta.encode(old.tobytes() * 8, new.tobytes() + old.tobytes() * 7, "bfloat16", "a", "b")
    assert bytes(delta.apply(old.tobytes() * 8, d, "bfloat16")) == new.tobytes() + old.tobytes() * 7
    a = np.zeros(64, np.uint32)
    b = a.copy()
    b[5] = 2**32 - 1
    d = delta.encode(a.tobytes(), b.tobytes(), "float32", "a", "b")
    assert bytes(delta.apply(a.tobytes(), d, "float32")) == b.tobytes()


@pytest.mark.parametrize("cut", [0, 1, 4, 6])
def test_truncated_streams_and_wrong_counts_are_refused(cut):
    buf = intcode.rice_encode(np.array([3, 0, 17, 250, 1], np.int64))
    with pytest.raises(ValueError):
        intcode.rice_decode(buf[:cut], 0)
    with pytest.raises(ValueError):  # a change larger than 1 ulp at index 2 of only 2 changes
        delta.changes_decode(delta.changes_encode(np.array([1, -1, 2])), 2)


def test_a_flipped_padding_bit_is_refused_not_ignored():
    x = np.array([3, 0, 17, 250, 1], np.int64)  # 5 codes of k=3: 15 low bits, one bit of padding
    buf = intcode.rice_encode(x)
    assert intcode.rice_bits(x, buf[4]) % 8 and buf[-1] & 1 == 0
    with pytest.raises(ValueError):
        intcode.rice_decode(buf[:-1] + bytes([buf[-1] | 1]), 0)
    signs = delta.changes_encode(np.array([1, -1, 2]))
    with pytest.raises(ValueError):
        delta.changes_decode(bytes([signs[0] | 1]) + signs[1:], 3)


def test_a_header_claiming_huge_counts_is_refused_before_allocating():
    buf = intcode._HEAD.pack(2**32 - 1, 3) + b"\xff" * 8
    with pytest.raises(ValueError):
        intcode.rice_decode(buf, 0)
    with pytest.raises(ValueError):
        intcode.exp_golomb_decode(intcode._HEAD.pack(1, 200) + b"\x80", 0)
