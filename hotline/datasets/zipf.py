"""Zipf-distributed ranks: draws that do not depend on how many are made, and exact shares of the head."""

from __future__ import annotations

import numpy as np

from hotline.kernels.synthetic import zipf_ranks


def sample_zipf(
    rng: np.random.Generator, n: int, s: float, shape: int | tuple[int, ...], redraw_key: int = 0
) -> np.ndarray:
    """Draws Zipf(n, s) ranks in [0, n) (P(r) proportional to 1/(r+1)**s) as an int64 array of ``shape``.

    Takes exactly ``prod(shape)`` uniforms from ``rng``, in order; the few draws the rejection step turns
    down are redrawn from a hash of (``redraw_key``, position, attempt), not from ``rng``. So the first k
    values of a larger draw equal a draw of k values: rows do not depend on how many are made.
    """
    return zipf_ranks(rng.random(shape), n, s, redraw_key)


def zipf_pmf(n: int, s: float) -> np.ndarray:
    """Exact probabilities of ranks 0..n-1 under Zipf(n, s) (float64 [n])."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -float(s)
    return w / w.sum()


def zipf_top_share(n: int, s: float, top: int) -> float:
    """Exact probability that a Zipf(n, s) draw has rank < ``top``, summed in blocks to bound memory."""
    head = total = 0.0
    block = 1 << 22
    for lo in range(1, n + 1, block):
        w = np.arange(lo, min(lo + block, n + 1), dtype=np.float64) ** -float(s)
        total += float(w.sum())
        if lo <= top:
            head += float(w[: max(0, top - lo + 1)].sum())
    return head / total


def fit_zipf_exponent(ranked_counts: np.ndarray) -> float:
    """Zipf exponent s of ``count ~ rank^-s``: least squares in log-log over ranks whose count is >= 2
    (singletons are sampling noise), on log-spaced ranks so the long tail does not outvote the head."""
    m = int(np.count_nonzero(ranked_counts >= 2))
    if m < 3:
        return float("nan")
    ranks = np.unique(np.geomspace(1, m, min(m, 64)).astype(np.int64))
    if ranks.size < 3:
        return float("nan")
    slope = np.polyfit(np.log(ranks), np.log(ranked_counts[ranks - 1].astype(np.float64)), 1)[0]
    return float(-slope)
