"""Access counts kept while training, recent steps weighing more: what re-placement chooses hot rows from.

Every lookup of step i adds ``decay ** -i`` to its row's count (counted by the dispatcher in the pass it
makes over every id anyway). Scaled by ``decay ** i`` that is an exponentially decayed count with weight 1
for the current step, without touching every row each step; the weights are renormalised before they grow
out of float64 range.
"""

from __future__ import annotations

import numpy as np

from hotline.kernels.dispatch import add_counts

_RESCALE_AT = 1e150


class OnlineCounts:
    """Decayed access counts per fused row (``decay`` per step: 1.0 counts every step alike)."""

    def __init__(self, num_rows: int, decay: float = 0.99):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"count decay must be in (0, 1], got {decay}")
        self.decay = float(decay)
        self.raw = np.zeros(int(num_rows), np.float64)
        self.weight = 1.0
        self.steps = 0

    def add(self, ids: np.ndarray, col_offset: np.ndarray) -> None:
        """Counts one step's lookups (``ids`` [B, T*L], checked) and moves on to the next step."""
        add_counts(ids, col_offset, self.raw, self.weight)
        self.steps += 1
        self.weight /= self.decay
        if self.weight > _RESCALE_AT:
            self.raw /= self.weight
            self.weight = 1.0

    def values(self) -> np.ndarray:
        """The decayed counts (float64 [num_rows]), in units of the latest step's lookups."""
        return self.raw / (self.weight * self.decay)  # the latest step was counted with weight * decay

    def top(self, k: int, raw: np.ndarray | None = None) -> np.ndarray:
        """The fused ids of the ``k`` most counted rows, sorted by id (a deterministic function of the
        counts: every rank of a run chooses the same rows from the same counts)."""
        raw = self.raw if raw is None else raw  # (the counts summed over ranks, in units of ``raw``)
        n = raw.shape[0]
        k = int(min(max(k, 0), n))
        if k == 0:
            return np.zeros(0, np.int64)
        top = np.arange(n) if k == n else np.argpartition(-raw, k - 1)[:k]
        return np.sort(top).astype(np.int64)

    def state(self) -> dict[str, np.ndarray]:
        return {"raw": self.raw.copy(), "weight": np.array(self.weight), "steps": np.array(self.steps)}

    def load(self, state: dict) -> None:
        self.raw[:] = state["raw"]
        self.weight = float(state["weight"])
        self.steps = int(state["steps"])
