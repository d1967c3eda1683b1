"""Access counts kept while training, recent steps weighing more: what re-placement chooses hot rows from.

Every lookup of step i adds ``decay ** -i`` to its row's count (counted by the dispatcher in the pass it
makes over every id anyway). Scaled by ``decay ** i`` that is an exponentially decayed count with weight 1
for the current step, without touching every row each step.

Four bytes a row, the narrowest that holds what the choice needs:

- ``decay == 1.0`` (every step alike): the counts are whole numbers, kept exactly in uint32 up to 2**32 - 1,
  where a count stops (it does not wrap round to 0: a row that popular stays among the most counted).
- ``decay < 1``: float32. Range: the weights are renormalised to 1 once they pass :data:`_RESCALE_AT`
  (2**40), so no lookup adds more than 2**40 and a raw count is at most ``L * 2**40 / (1 - decay)`` for ``L <
  2**31`` lookups a step: below 2**127 (float32 reaches 2**128) for every float64 decay below 1, where ``1 -
  decay >= 2**-53``. Precision: each addition rounds to nearest,
  an error of at most 2**-24 of the sum, and an error made k steps ago weighs ``decay ** k`` now, so a row
  looked up at most ``n`` times a step is within a relative ``n * 2**-24 / (1 - decay)`` of its float64
  value (at decay 0.99: 6e-6 n); rows whose counts differ by more are ranked as float64 would rank them.
"""

from __future__ import annotations

import numpy as np

from hotline.kernels.profile import add_step_counts, top_rows

_RESCALE_AT = 2.0**40
"""Weight at which the raw counts are renormalised (divided by it; it becomes 1): bounds their range."""

_REDUCE_ROWS = 1 << 22
"""Rows summed over ranks per collective (their float64 copy is a few tens of MiB)."""


class OnlineCounts:
    """Decayed access counts per fused row (``decay`` per step: 1.0 counts every step alike)."""

    def __init__(self, num_rows: int, decay: float = 0.99):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"count decay must be in (0, 1], got {decay}")
        self.decay = float(decay)
        self.raw = np.zeros(int(num_rows), np.uint32 if self.decay == 1.0 else np.float32)
        """uint32 (decay 1.0) or float32 [num_rows]: the counts, each lookup adding :attr:`weight`."""
        self.weight = 1.0
        self.steps = 0

    def add(self, ids: np.ndarray, col_offset: np.ndarray) -> None:
        """Counts one step's lookups (``ids`` [B, T*L], checked) and moves on to the next step."""
        add_step_counts(ids, col_offset, self.raw, self.weight)
        self.steps += 1
        if self.decay == 1.0:
            return
        self.weight /= self.decay
        if self.weight > _RESCALE_AT:
            self.raw /= np.float32(self.weight)
            self.weight = 1.0

    def values(self) -> np.ndarray:
        """The decayed counts (float64 [num_rows]), in units of the latest step's lookups."""
        return self.raw / np.float64(self.weight * self.decay)  # the latest step's weight was weight * decay

    def summed(self, comm) -> np.ndarray:
        """:attr:`raw` summed over the ranks of ``comm`` (itself on one rank): every rank chooses from the same
        counts. Summed in float64 a block of rows at a time, then stored as the counts are (uint32 stopping at
        2**32 - 1)."""
        if comm is None or comm.world_size == 1:
            return self.raw
        import torch

        out = np.empty_like(self.raw)
        for lo in range(0, self.raw.shape[0], _REDUCE_ROWS):
            block = torch.from_numpy(self.raw[lo : lo + _REDUCE_ROWS].astype(np.float64))
            total = comm.all_reduce_(block, "replace_counts").numpy()
            if out.dtype == np.uint32:
                np.minimum(total, np.iinfo(np.uint32).max, out=total)
            out[lo : lo + total.shape[0]] = total
        return out

    def top(self, k: int, raw: np.ndarray | None = None) -> np.ndarray:
        """The fused ids of the ``k`` most counted rows, sorted by id (a deterministic function of the
        counts, ties to the lowest ids: every rank of a run chooses the same rows from the same counts)."""
        raw = self.raw if raw is None else raw  # (the counts summed over ranks, in units of ``raw``)
        return top_rows(raw, k)  # ties to the lowest ids; no sort, no index of every row

    def state(self) -> dict[str, np.ndarray]:
        return {"raw": self.raw.copy(), "weight": np.array(self.weight), "steps": np.array(self.steps)}

    def load(self, state: dict) -> None:
        """Restores :meth:`state` (a checkpoint's; one written with float64 counts is narrowed)."""
        self.raw[:] = state["raw"]
        self.weight = float(state["weight"])
        self.steps = int(state["steps"])
