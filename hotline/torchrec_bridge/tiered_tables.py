"""The tables of one embedding dim over Hotline's tiers, as the torchrec collection looks them up.

A :class:`TieredTables` is the torchrec bridge's view of ``hotline.tiers``: the hot rows of its tables in one
device tensor (replicated on every rank, updated by
``hotline.tiers.replicated.update_replicas``: every rank's gradients summed in rank order, the same bits on
every replica) and every row in a
:class:`~hotline.tiers.cold_store.ColdStore` (``LocalColdStore`` on one rank, ``ShardedColdStore`` sharded by
row over N ranks). It adds only what a jagged ``KeyedJaggedTensor`` needs on top of them:

1. ``lookup(ids)``: the :class:`~hotline.dispatch.Dispatcher` splits a batch's fused row ids (one lookup per
   "sample", so bags of any length need no padding) into hot slots and a working set (by a remap of every row
   on one rank, a hot table of the hot rows on N: ``hotline.dispatch.index_for``, so a rank holds nothing that
   grows with the table but its shard), the store fetches the working set, and the looked-up rows become one
   leaf tensor whose ``.grad`` autograd fills;
2. ``update(lookup)``: ONE sparse update of the hot rows (every rank's gradients) and one of the working rows
   (written back, or applied at the rows' owners), by the store's own verbs. On the device nothing is read
   back: the distinct hot rows come from the split on the host, and the updated rows (or the gradients, N
   ranks) travel to the host without blocking and land there when the next lookup (or a save) needs them;
3. ``prefetch(ids)``: the same dispatch and fetch ahead of time, under the store's claim rule (a row an earlier,
   unfinished step may still update is flagged and read again by ``refresh`` just before the lookup computes),
   so a look-ahead pipeline stays exact.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from hotline.dispatch import Dispatcher, index_for
from hotline.distributed.comm import Comm
from hotline.kernels import sparse_update
from hotline.kernels.gather import assemble_rows
from hotline.placement import Placement
from hotline.table_layout import TableLayout
from hotline.tiers.cold_store import ColdFetch, LocalColdStore
from hotline.tiers.replicated import update_replicas
from hotline.tiers.sharded_store import ShardedColdStore
from hotline.tiers.sparse_optim import SparseOptimizer


def to_device(a: np.ndarray, device: torch.device, copy: bool = False) -> torch.Tensor:
    """A host array on ``device``: on a CPU the array itself (no copy; ``copy``: a copy, as the device path run
    on a CPU makes one); on CUDA staged through a pinned buffer of torch's caching host allocator (the size of
    this array, reused) and copied without blocking the host, so a lookup never waits for the device (a
    pageable copy would synchronise the stream)."""
    t = torch.from_numpy(a)
    if device.type == "cpu":
        return t.to(device, copy=True, non_blocking=True) if copy else t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class Lookup:
    """One batch's lookups of a :class:`TieredTables`, from dispatch to the update."""

    ids: np.ndarray
    """int64 [N] fused row ids, one per lookup."""
    hot_pos: torch.Tensor
    """Lookups that hit a hot row ..."""
    hot_slot: torch.Tensor
    """... and its hot slot."""
    cold_pos: np.ndarray
    """Lookups of cold rows ..."""
    cold_slot: np.ndarray
    """... and their slot in the working set."""
    fetch: ColdFetch
    """The working set as the cold store fetched it."""
    hot_index: tuple[np.ndarray, np.ndarray] = (None, None)
    """``(hot_pos, hot_slot)`` as numpy arrays (the CPU kernels read them)."""
    hot_distinct: tuple[torch.Tensor, torch.Tensor] | None = None
    """The distinct hot slots (sorted) and each hot lookup's index into them, found on the host by the split
    (the device path's update needs no ``torch.unique``, which waits for the device)."""
    work: torch.Tensor | None = None
    """[U, D] working rows on the device (updated in place by the step)."""
    work_state: torch.Tensor | None = None
    """[U] their optimizer state (empty for SGD)."""
    rows: torch.Tensor | None = None
    """[N, D] every looked-up row; a leaf whose ``.grad`` the update reads (training)."""


class TieredTables:
    """Tables of one embedding dim: hot rows on the device, all rows in a ColdStore (see the module docstring).

    Args:
        sizes: rows per table.
        dim: embedding dim of every table.
        hot_ids: hot row ids per table (original ids).
        weights: [sum(sizes), dim] initial weights, fused (table after table).
        optimizer: the sparse update rule.
        comm: the ranks the cold rows are sharded over (one rank: every row in this process).
        device: where the hot rows and the lookups live.
        max_lookups: lookups per batch to size the dispatcher for (it grows when a batch needs more).
        local: ``weights`` holds this rank's rows only (fused rows ``rank, rank + N, ...``, what the cold store
            keeps); the hot rows are then read from their owners (a collective on N ranks).
        host_kernels: the step's arithmetic runs in the CPU kernels on the tensors' memory (default: on a CPU,
            where the device is the host); False: the device path, torch ops that read nothing back on the
            host (CUDA's; tests run it on a CPU, tests/test_torchrec_syncs.py).
    """

    def __init__(self, sizes: list[int], dim: int, hot_ids: list[np.ndarray], weights: np.ndarray,
                 optimizer: SparseOptimizer, comm: Comm, device: torch.device, max_lookups: int = 1 << 16,
                 local: bool = False, host_kernels: bool | None = None):  # fmt: skip
        self.layout = TableLayout(sizes)
        self.dim = int(dim)
        self.optimizer = optimizer
        self.comm = comm
        self.device = torch.device(device)
        self.host_kernels = self.device.type == "cpu" if host_kernels is None else bool(host_kernels)
        self.num_rows = self.layout.num_rows
        self.hot_rows = self.layout.fuse_rows(hot_ids)
        N, r = comm.world_size, comm.rank
        self._capacity = max(1, int(max_lookups))
        if N == 1:
            # pageable: each working set is copied through a pinned staging buffer (to_device), no table pinned
            self.store = LocalColdStore(weights, optimizer, max_rows=self._capacity)
        else:
            shard = np.ascontiguousarray(weights if local else weights[r::N])
            # defer: the gradients' exchange and the owners' update wait for the next lookup (_land_updates),
            # so the update never waits for the device to copy the gradients to the host
            self.store = ShardedColdStore(comm, shard, optimizer, self.num_rows, defer=True)
        if local:
            self.hot_weight = torch.zeros((self.hot_rows.shape[0], self.dim), device=self.device)
        else:
            self.hot_weight = torch.from_numpy(weights[self.hot_rows]).to(self.device)
        self.hot_state = optimizer.new_state(self.hot_rows.shape[0], self.device)
        self._hot_scratch = sparse_update.new_scratch(self.hot_rows.shape[0])
        self._placement = Placement.from_hot_ids([self.num_rows], [self.hot_rows], embedding_dim=self.dim)
        self._index = index_for(N)  # N ranks: a hot table of the hot rows, not a remap of every row on each
        self._dispatcher = Dispatcher(self._placement, 1, self._capacity, index=self._index)
        self._landing: deque[tuple] = deque()  # updates whose write-back waits for the next lookup
        self._prefetched: deque[Lookup] = deque()
        self._ahead: contextlib.ExitStack | None = None  # open while the claim rule is on (after a prefetch)
        self._next_step = 0  # the claim rule's step number of the next training lookup
        self.refreshed_rows = 0
        """Prefetched rows read again because an earlier step was still to update them (the claim rule)."""
        if local:
            self.load_hot_from_host()

    # -- storage views --------------------------------------------------------------------------------------
    def local_rows(self, t: int) -> slice:
        """Rows of table ``t`` in this rank's part of the cold store (a slice of its host arrays)."""
        N, r = self.comm.world_size, self.comm.rank
        lo, hi = int(self.layout.offsets[t]), int(self.layout.offsets[t]) + self.layout.table_sizes[t]
        first = lo + (r - lo) % N  # the first fused row of table t this rank holds
        count = len(range(first, hi, N))
        return slice(first // N, first // N + count)

    @property
    def host_weight(self) -> torch.Tensor:
        """This rank's rows in host memory (every row on one rank); hot rows there are stale until
        :meth:`sync_to_host`."""
        return self.store.host.weight

    @property
    def host_state(self) -> torch.Tensor:
        return self.store.host.state

    def sync_to_host(self) -> None:
        """Writes the hot rows' current values and state into the host rows (each rank the rows it holds), after
        the last step's update has landed there (a collective on N ranks when one is still on its way)."""
        self._land_updates()
        if self.hot_rows.size:
            s = self.hot_state.cpu().numpy() if self.hot_state.numel() else np.zeros(0, np.float32)
            self.store.demote(self.hot_rows, self.hot_weight.detach().cpu().numpy(), s)

    @torch.no_grad()
    def load_hot_from_host(self, weights: bool = True, state: bool = True) -> None:
        """Reads the hot rows (and/or their state) back from the host rows (a collective on N ranks)."""
        self._land_updates()
        if not self.hot_rows.size:
            return
        w, s = self.store.promote(self.hot_rows)
        if weights:
            self.hot_weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        if state and self.hot_state.numel():
            self.hot_state.copy_(torch.from_numpy(np.ascontiguousarray(s)))

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's weight and state (fused ids), hot rows from the hot tier (a collective on N ranks)."""
        self._land_updates()
        return self.store.export(self.hot_rows, self.hot_weight, self.hot_state)

    @torch.no_grad()
    def load(self, weights: np.ndarray, state: np.ndarray | None = None) -> None:
        """Replaces every row's weight (and state; None keeps it) in both tiers (each rank keeps its rows)."""
        self._land_updates()
        if state is None:
            _, state = self.export()
        self.store.load(weights, state)
        self.hot_weight.copy_(torch.from_numpy(weights[self.hot_rows]))
        if self.hot_state.numel():
            self.hot_state.copy_(torch.from_numpy(state[self.hot_rows]))

    # -- one step -------------------------------------------------------------------------------------------
    def _split(self, ids: np.ndarray, step: int) -> Lookup:
        """Dispatch and fetch (the claim rule when ``step >= 0``; without it the rows must be current)."""
        if step < 0:
            self._land_updates()
        n = ids.shape[0]
        if n > self._capacity:
            self._capacity = max(n, 2 * self._capacity)
            self._dispatcher = Dispatcher(self._placement, 1, self._capacity, index=self._index)
        micro = self._dispatcher.split(ids.reshape(n, 1, 1))

        # The dispatcher's arrays are ring buffers reused by the next split: copy what the step keeps.
        def index(a) -> np.ndarray:
            return np.array(a, dtype=np.int64, copy=True)

        working_set = index(micro.working_set)
        U, D = working_set.shape[0], self.dim
        fetch = self.store.fetch(
            working_set,
            np.empty((U, D), np.float32),
            np.empty(self.optimizer.state_shape(U), np.float32),
            step,
        )
        hot_pos, hot_slot = index(micro.popular_samples), index(micro.pop_ids)
        look = Lookup(ids, self._to_device(hot_pos), self._to_device(hot_slot), index(micro.non_popular_samples),
                      index(micro.cold_slot), fetch, (hot_pos, hot_slot))  # fmt: skip
        if not self.host_kernels:  # the update's distinct hot rows, found here on the host
            rows, inverse = np.unique(hot_slot, return_inverse=True)
            look.hot_distinct = (self._to_device(rows), self._to_device(inverse.astype(np.int64).reshape(-1)))
        return look

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        """``to_device`` of a host array (a copy when the device path runs on a CPU: the device has its own)."""
        return to_device(a, self.device, copy=not self.host_kernels)

    def prefetch(self, ids: np.ndarray) -> None:
        """Dispatches and fetches a coming training batch's lookups now, under the claim rule (the next
        training :meth:`lookup` of the same ids uses them after refreshing the rows flagged stale)."""
        if self._ahead is None:
            self._land_updates()  # the claim rule starts from rows that hold every update
            self._ahead = contextlib.ExitStack()
            self._ahead.enter_context(self.store.lookahead())
            self._next_step = 0
        step = self._next_step + len(self._prefetched)
        self._prefetched.append(self._split(np.ascontiguousarray(ids, dtype=np.int64), step))

    def stop_prefetching(self) -> None:
        """Ends the claim rule (a collective on N ranks); prefetched lookups not yet used are dropped."""
        if self._ahead is not None:
            self._land_updates()
            self._prefetched.clear()
            self._ahead.close()
            self._ahead = None

    def lookup(self, ids: np.ndarray, training: bool) -> Lookup:
        """The rows of ``ids`` (a leaf tensor when ``training``), from a prefetch of the same ids if any."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        self._land_updates()  # the earlier steps' updates reach the host rows this lookup reads
        if training and self._prefetched:
            look = self._prefetched.popleft()
            if not np.array_equal(look.ids, ids):
                raise RuntimeError(
                    "a training forward's features differ from the batch prefetched for it: prefetch() batches "
                    "in the order they are trained"
                )
        elif training and self._ahead is not None:  # the claim rule is on: every training step takes part
            look = self._split(ids, self._next_step)
        else:
            look = self._split(ids, -1)
        if training and look.fetch.step >= 0:
            self._next_step = look.fetch.step + 1
        dev = self.device
        if self.store.needs_refresh(look.fetch):  # every earlier step's update has landed by now
            slots, w, s = self.store.refresh(look.fetch)
            if slots.size:
                self.refreshed_rows += int(slots.size)
                look.fetch.values[slots] = w
                if s.size:
                    look.fetch.state[slots] = s
        look.work = self._to_device(look.fetch.values)
        look.work_state = self._to_device(look.fetch.state)
        rows = torch.empty((ids.shape[0], self.dim), dtype=torch.float32, device=dev)
        if self.host_kernels:  # one parallel pass over both tiers
            assemble_rows(rows.numpy(), self.hot_weight.numpy(), *look.hot_index, look.fetch.values,
                          look.cold_pos, look.cold_slot)  # fmt: skip
        else:
            rows[look.hot_pos] = self.hot_weight.index_select(0, look.hot_slot)
            rows[self._to_device(look.cold_pos)] = look.work.index_select(0, self._to_device(look.cold_slot))
        if training:
            rows.requires_grad_(True)
        look.rows = rows
        return look

    @torch.no_grad()
    def update(self, look: Lookup, optimizer: SparseOptimizer, grad_scale: float = 1.0) -> int:
        """Applies ``optimizer`` to the rows ``look`` read, with their gradients (``look.rows.grad``, times
        ``grad_scale``): every rank's hot-row gradients summed, each touched row updated once; the working rows
        written back or updated at their owners. Returns the rows this rank updated. A collective on N ranks."""
        g = look.rows.grad
        if g is None:
            g = torch.zeros_like(look.rows)  # a rank whose loss did not reach these rows still takes part
        if grad_scale != 1.0:
            g = g * grad_scale
        g = g.detach().contiguous()
        touched = self._update_hot(look, optimizer, g)
        store = self.store
        if isinstance(store, LocalColdStore) and store._scratch.shape[0] < look.work.shape[0]:
            store._scratch = np.full(2 * look.work.shape[0], -1, dtype=np.int32)  # the update's row scratch
        device_index = None
        if not self.host_kernels:
            device_index = (self._to_device(look.cold_slot), self._to_device(look.cold_pos))
        touched += store.update(look.fetch, optimizer, look.work, look.work_state, look.cold_slot, g,
                                look.cold_pos, device_index)  # fmt: skip
        self._start_landing(look)
        if self.host_kernels:  # the rows are host memory already: land now, as the step's own work
            self._land_updates()
        return touched

    def _update_hot(self, look: Lookup, optimizer: SparseOptimizer, g: torch.Tensor) -> int:
        """The hot rows' update: on N ranks every rank's (row, summed gradient) pairs applied in rank order
        (:func:`~hotline.tiers.replicated.update_replicas`), so every replica computes the same bits; the
        device path sums by the distinct rows the split found on the host (nothing read back)."""
        hot = look.hot_pos.numel() > 0
        grads = g.index_select(0, look.hot_pos)
        if self.comm.world_size > 1:
            ids, gs = ([look.hot_slot], [grads]) if hot else ([], [])
            touched = update_replicas(self.comm, optimizer, self.hot_weight, self.hot_state, ids, gs, "hot_grads",
                                      look.hot_distinct, not self.host_kernels, self._hot_scratch)  # fmt: skip
            return int(touched or 0)
        if not hot:
            return 0
        if self.host_kernels:
            return optimizer.step(self.hot_weight, self.hot_state, look.hot_slot, grads, self._hot_scratch)
        rows, inverse = look.hot_distinct
        optimizer.step_coalesced(self.hot_weight, self.hot_state, rows, inverse, grads)
        return int(rows.shape[0])

    def _start_landing(self, look: Lookup) -> None:
        """Starts the step's updated rows (one rank: the working rows and their state; N ranks: the gradients the
        store summed) on their way to the host; :meth:`_land_updates` writes them there. On CUDA the working rows
        go into pinned buffers without blocking, and an event marks when they are there."""
        values = state = event = None
        if self.store.writes_back:
            values, state = look.work, look.work_state
            if not self.host_kernels:
                pin = self.device.type == "cuda"
                values = torch.empty(look.work.shape, dtype=torch.float32, pin_memory=pin)
                values.copy_(look.work, non_blocking=True)
                state = torch.empty(look.work_state.shape, dtype=torch.float32, pin_memory=pin)
                state.copy_(look.work_state, non_blocking=True)
        elif not self.host_kernels and self.device.type == "cpu":  # the device path on a CPU: as CUDA's store
            r = look.fetch.route  # stages the summed gradients in a host buffer (sharded_store.update)
            if r is not None and r.grads is not None:
                staged = torch.empty(r.grads.shape, dtype=r.grads.dtype)
                r.grads = staged.copy_(r.grads, non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._landing.append((look.fetch, values, state, event))

    def _land_updates(self) -> None:
        """Writes the updates started by :meth:`_start_landing` into the host rows (N ranks: the gradients to
        their owners, who update their rows; a collective), waiting for their copies from the device: the one
        wait of a step, for rows the next lookup (or a save) reads."""
        while self._landing:
            fetch, values, state, event = self._landing.popleft()
            if event is not None:
                event.synchronize()
            if values is None:
                self.store.write_back(fetch, None, None)
            else:
                self.store.write_back(fetch, values.numpy(), state.numpy())

    def close(self) -> None:
        self._land_updates()
        self.stop_prefetching()
        self.store.close()
