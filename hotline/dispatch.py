"""Dispatcher: splits each mini-batch into a popular micro-batch, a non-popular one, and its working set."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotline._malloc import huge_copy, huge_zeros
from hotline.kernels import dispatch
from hotline.placement import Placement
from hotline.table_layout import BagLayout, TableLayout


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
    pop_pos: np.ndarray | None = None
    """Padded bags: the positions (in the popular micro-batch's [n * C] id slots) of ``pop_ids``, which then
    holds the real lookups only; None: ``pop_ids`` fills every slot."""

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

    def __init__(
        self, placement: Placement, pooling_factor: int | BagLayout, max_batch_size: int, in_flight: int = 1
    ):
        self.placement = placement
        self.table_sizes = placement.table_sizes
        layout = TableLayout(self.table_sizes)
        bags = (
            pooling_factor
            if isinstance(pooling_factor, BagLayout)
            else BagLayout.uniform(layout, pooling_factor)
        )
        self.bags = bags
        self.pooling_factor = bags.pooling_factor
        self.col_offset = bags.col_offset
        self.col_size = bags.col_size
        # int32: half the cache footprint of int64; huge pages: it is looked up at random (hotline._malloc)
        remap = huge_copy(placement.fused_remap().astype(np.int32))
        self.num_hot = placement.num_hot
        self.row_remap = remap
        """int32 [rows]: each fused row's hot slot, or -1."""
        self._kernel_cols = (self.col_offset, self.col_size)
        if bags.padded:
            # The kernels see ids + 1 in a remap whose table t starts with one extra entry, its padding slot
            # (hot, slot num_hot): a padding id is a hot lookup to them, filtered out of the outputs here.
            remap = self._padded_remap(layout, remap)
            self._kernel_cols = (self.col_offset + bags.col_table, self.col_size + 1)
        self.remap = remap
        self.max_batch_size = int(max_batch_size)
        self.slot_map = dispatch.new_slot_map(self.max_batch_size * bags.num_columns)
        self.counts = None  # an OnlineCounts to count every lookup of every split (re-placement)
        self._ring = [
            dispatch.new_buffers(self.max_batch_size * bags.num_columns, self.max_batch_size)
            for _ in range(max(1, in_flight))
        ]
        self._next = 0

    def _padded_remap(self, layout: TableLayout, remap: np.ndarray) -> np.ndarray:
        """The remap with one padding entry (slot ``num_hot``) in front of every table's rows."""
        out = huge_zeros(remap.shape[0] + layout.num_tables, np.int32)
        self._shifted_start = layout.offsets + np.arange(layout.num_tables)
        for t, (o, n) in enumerate(zip(layout.offsets, layout.table_sizes)):
            s = int(self._shifted_start[t])
            out[s] = self.num_hot
            out[s + 1 : s + 1 + n] = remap[o : o + n]
        return out

    def split(self, sparse: np.ndarray, fused: bool = False) -> MicroBatches:
        """Splits one batch of ids ``[B, T, L]``; raises IndexError naming the table and id if one is out of range.

        ``fused=True`` keeps the whole batch as one micro-batch in batch order (lookups still remapped to hot
        slots and working-buffer slots): for steps whose cold rows arrived before compute starts."""
        B = sparse.shape[0]
        ids = np.ascontiguousarray(self.bags.flat(sparse))
        if B > self.max_batch_size:
            raise ValueError(
                f"batch of {B} samples exceeds the dispatcher's max_batch_size {self.max_batch_size}"
            )
        buffers = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        shifted = ids + 1 if self.bags.padded else ids  # padding -1 -> 0: each table's padding entry
        out = dispatch.split_batch(
            shifted, *self._kernel_cols, self.remap, self.slot_map, buffers, fused=fused
        )
        bad = out[-1]
        if out[0].shape[0] + out[1].shape[0] != B:  # the kernels stopped at an out-of-range id
            b = int(np.flatnonzero(bad >= 0)[0])
            c = int(bad[b])
            t = int(self.bags.col_table[c])
            raise IndexError(
                f"table {t}: id {int(ids[b, c])} out of range [0, {self.table_sizes[t]}) (sample {b} of the batch)"
            )
        if self.counts is not None:  # the ids are checked now
            self.counts.add(ids, self.col_offset)
        popular = int(np.count_nonzero(buffers["is_popular"][:B])) if fused else -1
        micro = MicroBatches(*out[:-1], popular_count=popular)
        return self._drop_padding(micro) if self.bags.padded else micro

    def _drop_padding(self, micro: MicroBatches) -> MicroBatches:
        """The split of a padded batch without its padding slots (the kernels saw them as hot slot
        ``num_hot``), and its working set back in the fused id space."""
        pad = self.num_hot
        keep = np.flatnonzero(micro.pop_ids != pad)
        micro.pop_pos, micro.pop_ids = keep, micro.pop_ids[keep]
        keep = micro.hot_slot != pad
        micro.hot_pos, micro.hot_slot = micro.hot_pos[keep], micro.hot_slot[keep]
        ws = micro.working_set
        table = np.searchsorted(self._shifted_start, ws, side="right") - 1
        micro.working_set = ws - table - 1
        return micro
