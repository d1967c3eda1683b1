"""Numba kernels of the synthetic data generator: exact Zipf draws and hashed per-row effects.

Zipf draws use rejection-inversion (Hörmann and Derflinger 1996): rank ``r`` in ``[0, n)`` comes with
probability proportional to ``1 / (r + 1) ** s``, exactly, in O(1) per draw, with neither a cumulative-weight
array (80 MB for a 10M-row table) nor a binary search. The method inverts the integral of the continuous hat
``h(x) = x ** -s`` and accepts the rounded value with a cheap test; the formulas follow Apache Commons Math's
``ZipfRejectionInversionSampler`` (``log1p`` / ``expm1`` keep them exact near ``s = 1``). The 0.1-2 % of
draws that are rejected are redrawn from a counter-based hash of (key, position, attempt), so the result at a
position depends only on that position's uniform: a longer array of uniforms extends, never changes, a draw.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_SQRT3 = math.sqrt(3.0)


@njit(cache=True, inline="always")
def _mix64(x: np.uint64) -> np.uint64:
    # splitmix64's finaliser: a bijection on uint64 whose outputs look independent for nearby inputs.
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, inline="always")
def _unit(h: np.uint64) -> float:
    # The top 53 bits as a float64 in [0, 1).
    return np.float64(h >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def _log1p_over_x(x: float) -> float:
    if abs(x) > 1e-8:
        return math.log1p(x) / x
    return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))


@njit(cache=True, inline="always")
def _expm1_over_x(x: float) -> float:
    if abs(x) > 1e-8:
        return math.expm1(x) / x
    return 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))


@njit(cache=True, inline="always")
def _hat_integral(x: float, s: float) -> float:
    # H(x) = (x ** (1 - s) - 1) / (1 - s), and log(x) at s = 1.
    log_x = math.log(x)
    return _expm1_over_x((1.0 - s) * log_x) * log_x


@njit(cache=True, inline="always")
def _hat(x: float, s: float) -> float:
    return math.exp(-s * math.log(x))


@njit(cache=True, inline="always")
def _hat_integral_inverse(y: float, s: float) -> float:
    t = y * (1.0 - s)
    if t < -1.0:
        t = -1.0  # rounding can push t just below the pole at -1
    return math.exp(_log1p_over_x(t) * y)


def _zipf_ranks_impl(u: np.ndarray, n: int, s: float, redraw_key: np.uint64, out: np.ndarray) -> None:
    h_first = _hat_integral(1.5, s) - 1.0
    h_last = _hat_integral(n + 0.5, s)
    squeeze = 2.0 - _hat_integral_inverse(_hat_integral(2.5, s) - _hat(2.0, s), s)
    for i in prange(u.size):
        v = u[i]
        attempt = np.uint64(0)
        while True:
            y = h_last + v * (h_first - h_last)
            x = _hat_integral_inverse(y, s)
            # Round x to a rank in [1, n]. In the far tail of a steep Zipf, x can be inf (rounding meets the
            # pole of the inverse): that is rank n, so compare before rounding (floor of inf is no integer).
            if x >= n + 0.5:
                k = float(n)
            else:
                k = np.floor(x + 0.5)
                if k < 1.0:
                    k = 1.0
            if k - x <= squeeze or y >= _hat_integral(k + 0.5, s) - _hat(k, s):
                out[i] = np.int64(k) - 1
                break
            attempt += np.uint64(1)
            v = _unit(_mix64(_mix64(np.uint64(i) ^ redraw_key) + attempt))


def _bag_effects_impl(ranks: np.ndarray, key: np.uint64, rank_scale: float, out: np.ndarray) -> None:
    m, L = ranks.shape
    for i in prange(m):
        acc = 0.0
        for j in range(L):
            r = ranks[i, j]
            centred = 2.0 * _unit(_mix64(np.uint64(r) ^ key)) - 1.0
            acc += centred * _SQRT3 / math.sqrt(1.0 + r / rank_scale)
        out[i] = acc / L


# Each kernel compiled twice: threads pay off on large arrays, but on small ones (and on a busy machine) the
# cost of waking them dominates.
PARALLEL_MIN_SIZE = 1 << 16
_zipf_ranks = njit(cache=True, parallel=True, nogil=True)(_zipf_ranks_impl)
_zipf_ranks_serial = njit(cache=True, nogil=True)(_zipf_ranks_impl)
_bag_effects = njit(cache=True, parallel=True, nogil=True)(_bag_effects_impl)
_bag_effects_serial = njit(cache=True, nogil=True)(_bag_effects_impl)


def _as_key(key: int) -> np.uint64:
    key = int(key)
    if not 0 <= key < 2**64:
        raise ValueError(f"key must be in [0, 2**64), got {key}")
    return np.uint64(key)


def zipf_ranks(u: np.ndarray, n: int, s: float, redraw_key: int = 0) -> np.ndarray:
    """Maps uniforms in [0, 1) to Zipf(n, s) ranks in [0, n): int64 array of ``u``'s shape.

    When ``u`` is uniform, rank r comes with probability exactly proportional to ``1 / (r + 1) ** s``.
    Rejected draws are redrawn from a hash of (``redraw_key``, flat position, attempt).
    """
    u = np.asarray(u)
    if u.dtype != np.float64:
        raise TypeError(f"zipf_ranks: u must be float64, got {u.dtype}")
    n, s = int(n), float(s)
    if n < 1:
        raise ValueError(f"zipf_ranks: the number of ranks n must be >= 1, got {n}")
    if not (math.isfinite(s) and s >= 0.0):
        raise ValueError(f"zipf_ranks: the exponent s must be finite and >= 0, got {s}")
    flat = np.ascontiguousarray(u).reshape(-1)
    out = np.empty(flat.size, np.int64)
    if flat.size:
        kernel = _zipf_ranks if flat.size >= PARALLEL_MIN_SIZE else _zipf_ranks_serial
        kernel(flat, n, s, _as_key(redraw_key), out)
    return out.reshape(u.shape)


def bag_effects(ranks: np.ndarray, key: int, rank_scale: float) -> np.ndarray:
    """Mean over each bag of a hashed per-rank effect: float64 [m] from int64 ranks [m, L].

    The effect of rank r is ``sqrt(3) * (2 U - 1) / sqrt(1 + r / rank_scale)`` with ``U`` a uniform hash of
    (r, ``key``): unit variance at rank 0, shrinking for rarer ranks.
    """
    ranks = np.ascontiguousarray(ranks)
    if ranks.ndim != 2 or ranks.dtype != np.int64:
        raise TypeError(f"bag_effects: ranks must be int64 [m, L], got {ranks.dtype} {ranks.shape}")
    if ranks.size and ranks.min() < 0:
        raise ValueError("bag_effects: ranks must be >= 0")
    if not rank_scale > 0:
        raise ValueError(f"bag_effects: rank_scale must be > 0, got {rank_scale}")
    out = np.zeros(ranks.shape[0], np.float64)
    if ranks.shape[0] and ranks.shape[1]:
        kernel = _bag_effects if ranks.size >= PARALLEL_MIN_SIZE else _bag_effects_serial
        kernel(ranks, _as_key(key), float(rank_scale), out)
    return out
