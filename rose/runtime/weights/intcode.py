"""Integer codes for sparse deltas: Golomb-Rice for gaps, Exp-Golomb for heavy-tailed sizes, in numpy.

Why these codes: the gaps between changed elements of a shard are close to geometric (each element
changes with about the same small probability), and for a geometric source a Rice code with the
right parameter is within about 1 % of its entropy, with no table to send. (zstd, which this
replaced, spends a Huffman table per block and at least one bit per byte-symbol: 1.5 % over the
positions' entropy on 1 MiB shards, 10 % on the small shards of a 0.55 M model.) The sizes of the
rarer larger changes have a long tail (a sign flip through zero is a jump of 2**15 in bf16 bits),
which an Exp-Golomb code bounds at about twice their bit length. Each coded stream is its count
and parameter (`_HEAD`, 5 bytes), its binary parts (fixed width for Rice, as bit planes) and its
unary parts (q zeros then a one; for Exp-Golomb first, since they give the widths), so that encoding and decoding are whole-array numpy operations
(`packbits`, a cumulative sum, a scatter), not a loop per symbol: decoding the positions of a
1 MiB shard with 12 k changes takes about 0.1 ms. A set padding bit is refused (ValueError), so
that no flipped bit passes unseen.

    >>> x = np.array([0, 3, 40, 7])
    >>> buf = rice_encode(x)
    >>> rice_decode(buf, 0)[0].tolist(), rice_decode(buf, 0)[1] == len(buf)
    ([0, 3, 40, 7], True)
"""
from __future__ import annotations

import struct

import numpy as np

_HEAD = struct.Struct("<IB")  # number of integers, code parameter k
MAX_BITS = 48  # widest binary part accepted: bit sums stay exact in float64 and shifts in int64


def _bitlen(v: np.ndarray) -> np.ndarray:
    """Bit length of each positive integer below 2**53 (frexp is exact for them)."""
    return np.frexp(v.astype(np.float64))[1].astype(np.int64)


def _unary_bits(q: np.ndarray) -> np.ndarray:
    bits = np.zeros(int(q.sum()) + q.size, np.uint8)
    bits[np.cumsum(q + 1) - 1] = 1
    return bits


def _read_unary(buf, off: int, count: int) -> tuple[np.ndarray, int]:
    """`count` unary numbers from byte `off` on -> (numbers, offset after their last byte)."""
    if count > 8 * (len(buf) - off):  # each takes at least one bit: refuse before allocating
        raise ValueError(f"{count} codes cannot fit in {len(buf) - off} bytes")
    # (as bool: nonzero over bytes is several times slower)
    ones = np.flatnonzero(np.unpackbits(np.frombuffer(buf, np.uint8, offset=off)).view(bool))[:count + 1]
    if ones.size < count:
        raise ValueError(f"stream ends after {ones.size} of {count} codes")
    last = int(ones[count - 1]) if count else -1
    end = off + (last // 8 + 1 if count else 0)
    if ones.size > count and ones[count] < 8 * (end - off):
        raise ValueError("nonzero padding after the unary codes")
    return np.diff(ones[:count], prepend=-1) - 1, end


def _pack_fixed(x: np.ndarray, k: int) -> bytes:
    """The low k bits of each integer as k bit planes (the top bit of every integer, then the next),
    so that decoding reads contiguous rows."""
    return np.packbits(((x[None, :] >> np.arange(k - 1, -1, -1)[:, None]) & 1).astype(np.uint8)).tobytes()


def _read_bits(buf, off: int, nbits: int) -> np.ndarray:
    """nbits bits from byte `off` on; the padding to a whole byte must be zero (a flipped bit there
    would otherwise pass unseen)."""
    nbytes = (nbits + 7) // 8
    if off + nbytes > len(buf):
        raise ValueError(f"stream too short for {nbits} bits")
    bits = np.unpackbits(np.frombuffer(buf, np.uint8, nbytes, off))
    if bits[nbits:].any():
        raise ValueError("nonzero padding after the binary fields")
    return bits[:nbits]


def _unpack_fixed(buf, off: int, count: int, k: int) -> tuple[np.ndarray, int]:
    nbytes = (count * k + 7) // 8
    planes = _read_bits(buf, off, count * k).reshape(k, count)
    # Row by row (contiguous: faster than a matrix product or packbits along rows), in the narrowest
    # integer that holds k bits.
    x = np.zeros(count, next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if np.iinfo(t).bits >= k))
    for plane in planes:
        x <<= 1
        x |= plane
    return x.astype(np.int64), off + nbytes


def _pack_var(x: np.ndarray, widths: np.ndarray) -> bytes:
    """The low widths[i] bits of each x[i], most significant first, end to end."""
    total = int(widths.sum())
    elem = np.repeat(np.arange(x.size), widths)
    shift = np.repeat(np.cumsum(widths), widths) - 1 - np.arange(total)  # end of its field - 1 - bit
    return np.packbits(((x[elem] >> shift) & 1).astype(np.uint8)).tobytes()


def _unpack_var(buf, off: int, widths: np.ndarray) -> tuple[np.ndarray, int]:
    total = int(widths.sum())
    nbytes = (total + 7) // 8
    bits = _read_bits(buf, off, total)
    elem = np.repeat(np.arange(widths.size), widths)
    shift = np.repeat(np.cumsum(widths), widths) - 1 - np.arange(total)
    x = np.bincount(elem, weights=bits * np.exp2(shift), minlength=widths.size)  # exact: widths <= MAX_BITS
    return x.astype(np.int64), off + nbytes


def _head(buf, off: int) -> tuple[int, int, int]:
    if off + _HEAD.size > len(buf):
        raise ValueError("stream ends inside its header")
    count, k = _HEAD.unpack_from(buf, off)
    if k > MAX_BITS:
        raise ValueError(f"code parameter {k} above {MAX_BITS}")
    return count, k, off + _HEAD.size


def rice_bits(x: np.ndarray, k: int) -> int:
    """Bits of the Rice code of `x` with parameter k, header not counted."""
    return int((x >> k).sum()) + x.size * (k + 1)


def rice_encode(x: np.ndarray) -> bytes:
    """Integers >= 0 (below 2**MAX_BITS) -> header, the low k bits of each, then x >> k in unary (last:
    the decoder's scan for its ones then stops at the stream's end, where it is the last in a buffer).
    k is the cheapest near log2 of the mean (the optimum for a geometric source is there)."""
    x = np.asarray(x, np.int64)
    guess = int(np.log2(x.mean() + 1)) if x.size else 0
    k = min(range(max(0, guess - 2), min(MAX_BITS, guess + 2) + 1), key=lambda k: rice_bits(x, k))
    return _HEAD.pack(x.size, k) + _pack_fixed(x, k) + np.packbits(_unary_bits(x >> k)).tobytes()


def rice_decode(buf, off: int) -> tuple[np.ndarray, int]:
    """A `rice_encode` stream at byte `off` of `buf` -> (integers, offset after the stream)."""
    count, k, off = _head(buf, off)
    low, off = _unpack_fixed(buf, off, count, k)
    q, off = _read_unary(buf, off, count)
    return (q << k) | low, off


def exp_golomb_bits(x: np.ndarray, k: int) -> int:
    """Bits of the order-k Exp-Golomb code of `x`, header not counted."""
    return int((2 * _bitlen(x + (1 << k)) - k - 1).sum())


def exp_golomb_encode(x: np.ndarray) -> bytes:
    """Integers >= 0 -> header, (bit length of x + 2**k) - 1 - k in unary, then the bits of x + 2**k
    below its leading one; k (0 to 4) is the cheapest for these integers."""
    x = np.asarray(x, np.int64)
    k = min(range(5), key=lambda k: exp_golomb_bits(x, k))
    v = x + (1 << k)
    width = _bitlen(v) - 1
    return _HEAD.pack(x.size, k) + np.packbits(_unary_bits(width - k)).tobytes() + _pack_var(v, width)


def exp_golomb_decode(buf, off: int) -> tuple[np.ndarray, int]:
    """An `exp_golomb_encode` stream at byte `off` of `buf` -> (integers, offset after the stream)."""
    count, k, off = _head(buf, off)
    q, off = _read_unary(buf, off, count)
    width = q + k
    if width.max(initial=0) > MAX_BITS:
        raise ValueError(f"an Exp-Golomb code of {int(width.max())} bits")
    low, off = _unpack_var(buf, off, width)
    return low + (np.int64(1) << width) - (1 << k), off
