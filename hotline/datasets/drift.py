"""Popularity drift for synthetic data: each day, a share of every table's most popular ranks moves to rows
that were cold before (new items and users appear), the rest of the skew unchanged.

Day d's rank permutation is day d-1's composed with swaps of ``rate`` x (head size) head ranks with as many
tail ranks, drawn from the seed: the item that held a popular rank becomes cold, a cold one takes its place.
A permutation is stored sparsely (only the ranks it moves), so a 10M-row table costs what its swaps cost.
"""

from __future__ import annotations

import math

import numpy as np

HEAD_SHARE = 0.01
"""The head of a table (the ranks drift moves from): its most popular 1% of rows, at least one row."""


class RankDrift:
    """The per-day rank permutations of every table (identity on day 0)."""

    def __init__(self, sizes: tuple[int, ...], days: int, rate: float, seed: int):
        self.days, self.rate = int(days), float(rate)
        # maps[t][d] = (sorted ranks moved by day d's permutation, the ranks they map to)
        self.maps: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for t, n in enumerate(sizes):
            head = max(1, math.ceil(HEAD_SHARE * n))
            moves = min(math.ceil(self.rate * head), head, n - head) if self.rate > 0 else 0
            rng = np.random.default_rng(np.random.SeedSequence([seed, 3, t]))
            perm: dict[int, int] = {}
            per_day = [(np.zeros(0, np.int64), np.zeros(0, np.int64))]
            for _ in range(1, self.days):
                if moves:
                    hot = rng.choice(head, size=moves, replace=False)
                    cold = head + rng.choice(n - head, size=moves, replace=False)
                    new = dict(perm)
                    for h, c in zip(hot.tolist(), cold.tolist()):
                        new[h], new[c] = perm.get(c, c), perm.get(h, h)
                    perm = {k: v for k, v in new.items() if k != v}
                keys = np.fromiter(sorted(perm), np.int64, len(perm))
                per_day.append((keys, np.fromiter((perm[k] for k in keys.tolist()), np.int64, len(perm))))
            self.maps.append(per_day)

    def day_of(self, rows: np.ndarray, total_rows: int) -> np.ndarray:
        """The day of each stream row (rows are in day order; days of equal length)."""
        return (rows * self.days // max(1, total_rows)).astype(np.int64)

    def apply(self, t: int, ranks: np.ndarray, days: np.ndarray) -> np.ndarray:
        """Ranks [m, L] of table t drawn on ``days`` [m], through each day's permutation."""
        out = ranks.copy()
        for d in np.unique(days):
            keys, values = self.maps[t][int(d)]
            if not keys.size:
                continue
            sel = days == d
            r = out[sel]
            idx = np.minimum(np.searchsorted(keys, r), keys.size - 1)
            hit = keys[idx] == r
            r[hit] = values[idx[hit]]
            out[sel] = r
        return out

    def meta(self, total_rows: int) -> dict:
        """What meta.json records: the days, the rate and the first stream row of each day."""
        return {
            "days": self.days,
            "rate": self.rate,
            "head_share": HEAD_SHARE,
            "day_start_rows": [-(-d * total_rows // self.days) for d in range(self.days)],
        }
