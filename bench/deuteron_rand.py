"""A bit-exact port of deuteron::Tensor::rand (src/runtime/tensor.cpp) to numpy.

Tensor::rand is a counter-based generator: element i is splitmix64(splitmix64(seed) + (i + 1) *
golden) mapped onto [lo, hi). Float dtypes use the top 24 bits, u = bits >> 40 as a float times
2^-24, v = lo + span * u in float arithmetic (no FMA: the library is built for baseline x86-64),
clamped to the representable values inside [lo, hi). Integer dtypes map the 64 bits onto
[ceil(lo), ceil(hi)) by multiply-shift. The benchmark uses this to give PyTorch and JAX exactly
the inputs Deuteron's catalogue entries make (checked against the C++ by bench/test_rand.py).
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_CHUNK = 1 << 21


def _splitmix64_inplace(z: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """splitmix64's output function on a uint64 array, in place (tmp: scratch of the same size)."""
    with np.errstate(over="ignore"):
        np.right_shift(z, np.uint64(30), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
        np.multiply(z, _M1, out=z)
        np.right_shift(z, np.uint64(27), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
        np.multiply(z, _M2, out=z)
        np.right_shift(z, np.uint64(31), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
    return z


def _splitmix64_int(z: int) -> int:
    mask = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _bits(seed: int, begin: int, end: int) -> np.ndarray:
    base = np.uint64(_splitmix64_int(seed & ((1 << 64) - 1)))
    z = np.arange(begin + 1, end + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.multiply(z, _GOLDEN, out=z)
        np.add(z, base, out=z)
    return _splitmix64_inplace(z, np.empty_like(z))


def _chunks(n: int, fill) -> None:
    """Runs fill(begin, end) over chunks of [0, n) on two threads (numpy releases the GIL)."""
    spans = [(b, min(n, b + _CHUNK)) for b in range(0, n, _CHUNK)]
    if len(spans) <= 1:
        for b, e in spans:
            fill(b, e)
        return
    with ThreadPoolExecutor(max_workers=min(len(spans), max(1, len(os.sched_getaffinity(0))))) as ex:
        list(ex.map(lambda be: fill(*be), spans))


def _mulhi64(a: np.ndarray, b: int) -> np.ndarray:
    """High 64 bits of a * b (a uint64 array, 0 <= b < 2^64)."""
    mask = np.uint64(0xFFFFFFFF)
    a_lo, a_hi = a & mask, a >> np.uint64(32)
    b_lo, b_hi = np.uint64(b & 0xFFFFFFFF), np.uint64(b >> 32)
    with np.errstate(over="ignore"):
        lo_lo = a_lo * b_lo
        hi_lo = a_hi * b_lo
        lo_hi = a_lo * b_hi
        hi_hi = a_hi * b_hi
        cross = (lo_lo >> np.uint64(32)) + (hi_lo & mask) + lo_hi
        return hi_hi + (hi_lo >> np.uint64(32)) + (cross >> np.uint64(32))


def rand(shape, dtype: str = "float32", seed: int = 0, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    """Tensor::rand(shape, dtype, seed, lo, hi) as a numpy array (float32, int64 or int32)."""
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    if dtype in ("float32", "f32"):
        out = np.empty(n, dtype=np.float32)
        top = np.float32(hi)
        while float(top) >= hi:
            top = np.nextafter(top, np.float32(-np.inf), dtype=np.float32)
        bottom = np.float32(lo)
        while float(bottom) < lo:
            bottom = np.nextafter(bottom, np.float32(np.inf), dtype=np.float32)
        lo_f, span_f = np.float32(lo), np.float32(hi - lo)
        scale = np.float32(2.0 ** -24)
        def fill(b, e):
            bits = _bits(seed, b, e)
            np.right_shift(bits, np.uint64(40), out=bits)
            v = bits.astype(np.float32)
            np.multiply(v, scale, out=v)   # u in [0, 1), exact
            np.multiply(v, span_f, out=v)  # float32 multiply, then float32 add: as the C++ does
            np.add(v, lo_f, out=v)
            np.clip(v, bottom, top, out=out[b:e])
        _chunks(n, fill)
        return out.reshape(shape)
    if dtype in ("int64", "i64", "int32", "i32"):
        first, end = math.ceil(lo), math.ceil(hi)
        rng = end - first
        if rng <= 0:
            raise ValueError(f"no integer lies in [{lo}, {hi})")
        out = np.empty(n, dtype=np.int64)
        def fill(b, e):
            out[b:e] = _mulhi64(_bits(seed, b, e), rng).astype(np.int64) + first
        _chunks(n, fill)
        return out.reshape(shape).astype(np.int32 if dtype in ("int32", "i32") else np.int64)
    raise ValueError(f"deuteron_rand: dtype {dtype} not supported (float32, int64, int32)")
