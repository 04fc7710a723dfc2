"""The entropy bound of a weight change (`bound.py`): hand-computed cases, and the coding measured against it."""
import math

import numpy as np
import pytest

from rose.runtime.weights import delta
from rose.runtime.weights.bound import (binary_entropy_bits, change_bound_bits, empirical_entropy_bits,
                                        shard_bound_bytes, version_bound_bytes)
from rose.runtime.weights.shards import shard_params


def test_binary_entropy_by_hand():
    assert binary_entropy_bits(8, 4) == pytest.approx(8.0)  # H2(1/2) = 1 bit a position
    assert binary_entropy_bits(1000, 0) == binary_entropy_bits(1000, 1000) == 0.0
    # H2(1/4) = 1/4 log2 4 + 3/4 log2 4/3 = 0.811278...
    assert binary_entropy_bits(4, 1) == pytest.approx(4 * (0.5 + 0.75 * math.log2(4 / 3)))


def test_empirical_entropy_by_hand():
    assert empirical_entropy_bits(np.array([7, 7, 7])) == 0.0  # one symbol: nothing to say
    assert empirical_entropy_bits(np.array([1, -1, 1, -1])) == pytest.approx(4.0)
    # counts 2, 1, 1 of 4: 2 log2 2 + 2 log2 4 = 6 bits
    assert empirical_entropy_bits(np.array([5, 5, -3, 1000])) == pytest.approx(6.0)


def test_change_bound_is_positions_plus_values():
    old = np.zeros(16, np.uint16)
    new = old.copy()
    new[[2, 9, 11, 15]] = [1, 65535, 1, 1]  # differences +1, +65535, +1, +1: counts 3 and 1 of 4
    want = 16 * (0.25 * 2 + 0.75 * math.log2(4 / 3)) + (3 * math.log2(4 / 3) + 1 * 2)
    assert change_bound_bits(old.tobytes(), new.tobytes(), "bfloat16") == pytest.approx(want)
    assert change_bound_bits(old.tobytes(), old.tobytes(), "bfloat16") == 0.0


def test_the_bound_stays_below_dense_even_for_a_random_shard_and_is_dense_without_a_base():
    # The plug-in entropy of k values is at most log2 k bits each, so even a shard whose every
    # element changed at random is bounded below its dense size (a coding would pay for its table).
    rng = np.random.default_rng(0)
    old = rng.integers(0, 2**16, 4096, dtype=np.uint16)
    new = old ^ rng.integers(1, 2**16, 4096, dtype=np.uint16)
    assert 0.7 * new.nbytes < shard_bound_bytes(old.tobytes(), new.tobytes(), "bfloat16") < new.nbytes
    assert shard_bound_bytes(None, new.tobytes(), "bfloat16") == new.nbytes


def test_version_bound_counts_each_lacking_shard_once_against_its_position():
    old = {"a": np.zeros(256, np.float32), "b": np.ones(256, np.float32)}
    new = {"a": old["a"].copy(), "b": old["b"].copy()}
    new["a"][[3, 100]] = 1.0  # a's first shard changes; b unchanged
    m0, d0 = shard_params({k: _t(v) for k, v in old.items()}, 0, "float32", 512)
    m1, d1 = shard_params({k: _t(v) for k, v in new.items()}, 1, "float32", 512)
    store = {**d0, **d1}
    got = version_bound_bytes(m1, m0, store.__getitem__)
    a0, a1 = m0.at(("a", "", 0)), m1.at(("a", "", 0))
    assert got == pytest.approx(change_bound_bits(store[a0.hash], store[a1.hash], "float32") / 8)
    assert version_bound_bytes(m1, None, store.__getitem__) == len(d1) * 512  # nothing held: dense


def _t(a):
    import torch
    return torch.from_numpy(a)


@pytest.mark.parametrize("p", [0.005, 0.024, 0.1])
def test_coding_of_a_typical_change_is_near_the_bound(p):
    # Positions at density p, differences mostly +-1 ulp (the shape of a bf16 step at a small lr):
    # the coding sits within a few percent of the entropy bound on one 1 MiB shard.
    rng = np.random.default_rng(1)
    n = 1 << 19
    old = rng.integers(0x3C00, 0x3D00, n).astype(np.uint16)
    new = old.copy()
    idx = np.flatnonzero(rng.random(n) < p)
    size = np.where(rng.random(idx.size) < 0.89, 1, rng.geometric(0.4, idx.size) + 1)
    new[idx] = old[idx] + np.where(rng.random(idx.size) < 0.5, -size, size).astype(np.uint16)
    d = delta.encode(old.tobytes(), new.tobytes(), "bfloat16", "a", "b")
    bound = shard_bound_bytes(old.tobytes(), new.tobytes(), "bfloat16")
    assert bytes(delta.apply(old.tobytes(), d, "bfloat16")) == new.tobytes()
    assert bound < d.nbytes < 1.05 * bound
