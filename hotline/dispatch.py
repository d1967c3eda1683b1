"""Dispatcher: splits each mini-batch into a popular micro-batch, a non-popular one, and its working set."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotline.kernels import dispatch
from hotline.placement import Placement
from hotline.table_layout import TableLayout


@dataclass
class MicroBatches:
    """One mini-batch split by a :class:`Dispatcher` (all index arrays int64; B samples, C = T*L columns).

    The popular micro-batch is ``popular_samples`` (in batch order); its lookups are ``pop_ids``
    [len(popular_samples) * C], fused hot slots. The non-popular micro-batch is ``non_popular_samples``; its
    flattened lookups [len(non_popular_samples) * C] are either hot (position ``hot_pos``, hot slot
    ``hot_slot``) or cold (position ``cold_pos``, slot ``cold_slot`` into the working buffer, whose rows are
    the fused row ids ``working_set`` in first-occurrence order).
    """

    popular_samples: np.ndarray
    non_popular_samples: np.ndarray
    pop_ids: np.ndarray
    hot_pos: np.ndarray
    hot_slot: np.ndarray
    cold_pos: np.ndarray
    cold_slot: np.ndarray
    working_set: np.ndarray
    popular_count: int = -1
    """Samples whose every lookup is hot (equals ``len(popular_samples)`` unless the split was fused)."""

    def __post_init__(self) -> None:
        if self.popular_count < 0:
            self.popular_count = int(self.popular_samples.shape[0])

    @property
    def num_popular(self) -> int:
        return int(self.popular_samples.shape[0])

    @property
    def num_non_popular(self) -> int:
        return int(self.non_popular_samples.shape[0])


class Dispatcher:
    """Splits batches by a :class:`Placement` (the Numba kernels of ``hotline.kernels.dispatch``).

    ``split`` writes into output buffers allocated once per slot of a small ring (``in_flight`` slots), so a
    split's arrays stay valid until ``in_flight`` more splits have been made: the pipelined executor sizes the
    ring to its look-ahead.
    """

    def __init__(self, placement: Placement, pooling_factor: int, max_batch_size: int, in_flight: int = 1):
        self.placement = placement
        self.table_sizes = placement.table_sizes
        T, L = len(self.table_sizes), int(pooling_factor)
        self.pooling_factor = L
        layout = TableLayout(self.table_sizes)
        self.col_offset = layout.column_offsets(L)
        self.col_size = layout.column_sizes(L)
        self.remap = placement.fused_remap().astype(np.int32)  # int32: half the cache footprint of int64
        self.num_hot = placement.num_hot
        self.slot_map = np.full(int(sum(self.table_sizes)), -1, dtype=np.int32)
        self.max_batch_size = int(max_batch_size)
        self.counts = None  # an OnlineCounts to count every lookup of every split (re-placement)
        self._ring = [
            dispatch.new_buffers(self.max_batch_size * T * L, self.max_batch_size)
            for _ in range(max(1, in_flight))
        ]
        self._next = 0

    def split(self, sparse: np.ndarray, fused: bool = False) -> MicroBatches:
        """Splits one batch of ids ``[B, T, L]``; raises IndexError naming the table and id if one is out of range.

        ``fused=True`` keeps the whole batch as one micro-batch in batch order (lookups still remapped to hot
        slots and working-buffer slots): for steps whose cold rows arrived before compute starts."""
        B, T, L = sparse.shape
        if T != len(self.table_sizes) or L != self.pooling_factor:
            raise ValueError(
                f"sparse ids must be [B, {len(self.table_sizes)}, {self.pooling_factor}], got {sparse.shape}"
            )
        if B > self.max_batch_size:
            raise ValueError(
                f"batch of {B} samples exceeds the dispatcher's max_batch_size {self.max_batch_size}"
            )
        ids = np.ascontiguousarray(sparse).reshape(B, T * L)
        buffers = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        out = dispatch.split_batch(
            ids, self.col_offset, self.col_size, self.remap, self.slot_map, buffers, fused=fused
        )
        bad = out[-1]
        if out[0].shape[0] + out[1].shape[0] != B:  # the kernels stopped at an out-of-range id
            b = int(np.flatnonzero(bad >= 0)[0])
            c = int(bad[b])
            t = c // L
            raise IndexError(
                f"table {t}: id {int(ids[b, c])} out of range [0, {self.table_sizes[t]}) (sample {b} of the batch)"
            )
        if self.counts is not None:  # the ids are checked now
            self.counts.add(ids, self.col_offset)
        popular = int(np.count_nonzero(buffers["is_popular"][:B])) if fused else -1
        return MicroBatches(*out[:-1], popular_count=popular)
