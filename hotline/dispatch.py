"""Dispatcher: splits each mini-batch into a popular micro-batch, a non-popular one, and its working set."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hotline._malloc import huge_full
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


INDEXES = ("dense", "hash")
"""How a :class:`Dispatcher` finds a row's hot slot: ``dense``, an int32 remap of every row (4 bytes a row: one
load a lookup); ``hash``, a hot table of the hot rows only (:func:`hotline.kernels.dispatch.new_hot_table`,
16 to 32 bytes a hot row, whatever the row count: what each of N ranks holds)."""


def index_for(world_size: int, on_disk: bool = False) -> str:
    """The index a rank of ``world_size`` uses: ``dense`` on one rank with the rows in memory (the faster split:
    one load a lookup; ``benchmarks/bench_dispatcher.py`` prints the ratio, the hot table's split at 0.5x to
    0.8x of its speed); ``hash`` on N ranks, where a remap of every row on each rank would cost the machine 4N
    bytes a row, and with the rows on disk (``on_disk``: the tables are beyond DRAM, the remap's 4 bytes a row
    are the DRAM tier's to use, and the split is a small part of a disk step)."""
    return "dense" if int(world_size) == 1 and not on_disk else "hash"


class HotSlots:
    """Fused row id -> hot slot (-1: cold) by a dispatcher's index, for lookups beside the split (evaluation,
    re-placement): ``hot_slots[fused_ids]`` is int64 of the ids' shape; an id outside the rows raises IndexError.
    """

    def __init__(self, index: np.ndarray, layout: TableLayout, padded: bool):
        self.index = index
        """The dispatcher's remap or hot table (padded bags: of the ids shifted by :meth:`keys`)."""
        self._starts = layout.offsets
        self._rows = layout.num_rows
        self._padded = padded

    def keys(self, fused: np.ndarray) -> np.ndarray:
        """The index's keys of fused row ids: the ids, or for padded bags the ids of table t shifted by t + 1
        (each table's padding entry comes first)."""
        if not self._padded:
            return fused
        return fused + np.searchsorted(self._starts, fused, side="right")

    def __getitem__(self, fused) -> np.ndarray:
        fused = np.asarray(fused, dtype=np.int64)
        if fused.size and (fused.min() < 0 or fused.max() >= self._rows):
            raise IndexError(
                f"fused row ids must lie in [0, {self._rows}), got [{fused.min()}, {fused.max()}]"
            )
        return dispatch.lookup_slots(self.index, self.keys(fused)).reshape(fused.shape)


class Dispatcher:
    """Splits batches by a :class:`Placement` (the Numba kernels of ``hotline.kernels.dispatch``).

    ``split`` writes into output buffers allocated once per slot of a small ring (``in_flight`` slots), so a
    split's arrays stay valid until ``in_flight`` more splits have been made: the pipelined executor sizes the
    ring to its look-ahead. ``index`` (:data:`INDEXES`) is how a row's hot slot is found: ``dense``, the
    remap of every row, or ``hash``, a table of the hot rows only (the same splits: ``tests/test_dispatch_index.py``).
    """

    def __init__(
        self,
        placement: Placement,
        pooling_factor: int | BagLayout,
        max_batch_size: int,
        in_flight: int = 1,
        index: str = "dense",
    ):
        if index not in INDEXES:
            raise ValueError(f"index must be one of {INDEXES}, got {index!r}")
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
        self.num_hot = placement.num_hot
        self.index = index
        self._kernel_cols = (self.col_offset, self.col_size)
        # Padded bags: the kernels see ids + 1 in an index whose table t starts with one extra entry, its
        # padding slot (hot, slot num_hot): a padding id is a hot lookup to them, filtered out of the outputs.
        self._shifted_start = layout.offsets + np.arange(layout.num_tables)
        if bags.padded:
            self._kernel_cols = (self.col_offset + bags.col_table, self.col_size + 1)
        self.row_remap = HotSlots(self._build_index(placement, layout, bags.padded), layout, bags.padded)
        """Fused row id -> hot slot (:class:`HotSlots`) by the same index the split uses."""
        self.remap = self.row_remap.index
        """The kernels' index: int32 [rows (+ tables, padded)] or a hot table [M, 2]."""
        self.max_batch_size = int(max_batch_size)
        self.slot_map = dispatch.new_slot_map(self.max_batch_size * bags.num_columns)
        self.counts = None  # an OnlineCounts to count every lookup of every split (re-placement)
        self._ring = [
            dispatch.new_buffers(self.max_batch_size * bags.num_columns, self.max_batch_size)
            for _ in range(max(1, in_flight))
        ]
        self._next = 0

    def _build_index(self, placement: Placement, layout: TableLayout, padded: bool) -> np.ndarray:
        """The index of ``self.index``, made from the hot ids in one piece (no wider or second copy): for
        padded bags each table's keys shifted by its padding entry (slot ``num_hot``) in front."""
        T = layout.num_tables
        starts = self._shifted_start + 1 if padded else layout.offsets
        slots = [np.arange(placement.hot_offsets[t], placement.hot_offsets[t + 1]) for t in range(T)]
        pad_keys = self._shifted_start if padded else np.zeros(0, np.int64)
        if self.index == "hash":
            keys = [starts[t] + placement.hot_ids[t] for t in range(T)] + [pad_keys]
            pads = np.full(pad_keys.shape[0], self.num_hot, np.int64)
            return dispatch.new_hot_table(np.concatenate(keys), np.concatenate(slots + [pads]))
        dtype = np.int32 if self.num_hot < 2**31 - 1 else np.int64
        # huge pages: it is looked up at random (hotline._malloc)
        out = huge_full(layout.num_rows + (T if padded else 0), -1, dtype)
        for t in range(T):
            out[starts[t] + placement.hot_ids[t]] = slots[t]
        out[pad_keys] = self.num_hot
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
