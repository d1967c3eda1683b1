"""Fits and penalties of timings, shared by the host's and the disk's calibrations (numpy only: the GPU
image has no scipy)."""

from __future__ import annotations

import numpy as np


def nnls(features: list[list[float]], seconds: list[float]) -> np.ndarray:
    """Non-negative least squares (active set: drop the most negative coefficient, solve again), each row
    weighted by 1/seconds so relative errors count, not absolute ones. numpy only: the GPU image has no scipy."""
    a = np.asarray(features, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    w = 1.0 / y
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    a = a / scale * w[:, None]
    b = y * w
    free = np.ones(a.shape[1], dtype=bool)
    coef = np.zeros(a.shape[1])
    while free.any():
        sol = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        if (sol >= 0).all():
            coef[free] = sol
            break
        idx = np.flatnonzero(free)
        free[idx[np.argmin(sol)]] = False
    return coef / scale


def overlap_penalty(together: float, a: float, b: float) -> float:
    """The part of the shorter of two lanes, timed alone (``a``, ``b``) and together, that still costs time:
    (together - longer) / shorter, in [0, 3] (0: free overlap, 1: none, more: worse than one after the other)."""
    return float(min(3.0, max(0.0, (together - max(a, b)) / max(min(a, b), 1e-9))))


def pooled_penalty(timings: list[tuple[float, float, float]]) -> dict:
    """The overlap penalty of paired timings ``(together, a alone, b alone)``
    (:func:`overlap_penalty`'s terms: 0 free overlap, 1 none, more: worse than one
    after the other): ``pooled``, (sum of together - sum of the longer) / sum of the shorter; ``se``, the
    standard error of the per-pair penalties (None for one pair); ``pairs``, the timings (so that two
    calibrations can be pooled as one); and ``penalty``, what the cost model prices with: ``pooled``,
    except that an overlap the timings do not show beyond their noise (``pooled`` < 1 but ``pooled + 2 se`` >= 1)
    is not credited: 1. A penalty is a small difference of two noisy times over a third (a swing of the
    disk's speed moves one pair's penalty far), so a gain within the noise is priced as none."""
    if not timings:
        return {"penalty": 1.0, "pooled": 1.0, "se": None, "pairs": []}  # nothing timed shows no gain
    together = sum(t for t, _, _ in timings)
    longer = sum(max(a, b) for _, a, b in timings)
    shorter = sum(min(a, b) for _, a, b in timings)
    penalty = priced(overlap_penalty(together, longer, shorter), [overlap_penalty(*t) for t in timings])
    return {**penalty, "pairs": [[float(t), float(a), float(b)] for t, a, b in timings]}


def priced(pooled: float, each: list[float]) -> dict:
    """``pooled``, a penalty from the sums of paired timings, with ``se`` (the standard error of ``each``, the
    pairs' own penalties; None for one pair: no noise known) and ``penalty``, what the cost model prices: ``pooled``
    where the timings show it (a loss, or a gain beyond 2 se), else 1 (a gain within the noise priced as none)."""
    se = float(np.std(each, ddof=1) / np.sqrt(len(each))) if len(each) > 1 else None
    shown = pooled >= 1.0 or (se is not None and pooled + 2.0 * se < 1.0)
    return {"penalty": pooled if shown else 1.0, "pooled": pooled, "se": se}
