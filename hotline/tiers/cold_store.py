"""The cold tier's seam: where cold rows live, and how a step's working set is fetched and written back.

A :class:`ColdStore` holds every row of every table (fused ids) with its optimizer state; rows that are hot
have stale copies there, the hot tier is authoritative for them. The tiered mode talks to it through four
verbs, whatever the store is:

- ``fetch(rows, ..., step)``: the rows and state of a working set (``step >= 0``: fetched ahead, under the
  look-ahead's claim rule, which flags the rows an earlier step may still update: ``ColdFetch.stale``);
- ``refresh(fetch)``: reads the flagged rows again, once every earlier step's update has landed
  (``refresh_into`` puts them straight into a host working buffer: by default through ``refresh``);
- ``update(...)``: applies the step's gradients of the working rows (to the fetched copy, or at the rows'
  owners);
- ``write_back(fetch, values, state)``: stores the updated working rows (where the copy was updated).

:class:`LocalColdStore` keeps the rows in this process's host memory (pageable: copies go through pinned
staging buffers, nothing reads the tier in place; ``pin=True`` registers it), and is the store of one rank;
``hotline.tiers.sharded_store.ShardedColdStore`` spreads them over N ranks;
``hotline.tiers.disk_store.DiskColdStore`` keeps them in a file on local disk, read
and written in place (tables beyond DRAM).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from hotline.distributed.comm import Comm
from hotline.kernels import sparse_update
from hotline.kernels.claim_book import RowsInFlight
from hotline.kernels.gather import copy_rows, gather_rows, scatter_rows
from hotline.tiers.pinning import pinned
from hotline.tiers.sparse_optim import SparseOptimizer

_EMPTY = np.zeros(0, np.int64)


@dataclass
class ColdFetch:
    """A working set's rows as its store fetched them into host memory."""

    rows: np.ndarray
    """int64 [U] the fused row ids (distinct), in working-set order."""
    values: np.ndarray
    """float32 [U, D] their weights."""
    state: np.ndarray
    """float32 their optimizer state: [U], [U, S] (per-element optimizers) or [0] (SGD)."""
    step: int = -1
    """The step it was fetched for under the claim rule (-1: fetched when due, nothing can be stale)."""
    stale: np.ndarray = field(default_factory=lambda: _EMPTY)
    """Working-set slots an earlier, unfinished step may update: read again by ``refresh`` before compute."""
    stale_owner: np.ndarray = field(default_factory=lambda: _EMPTY)
    """For each stale slot, the step that last held its row (whose working buffer has the fresh value), where
    the store knows it (one rank); empty otherwise."""
    stale_slot: np.ndarray = field(default_factory=lambda: _EMPTY)
    """For each stale slot, where its row stands in the working set of its ``stale_owner`` step (given where
    ``stale_owner`` is)."""
    route: object = None
    """What the store needs to finish the step (the sharded store's routes between ranks)."""
    times: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)


class ColdStore(ABC):
    """Where the cold rows live (see the module docstring for the protocol)."""

    writes_back: bool = True
    """True when the tiered mode updates the fetched copy and ``write_back`` stores it; False when
    ``update`` applies the gradients where the rows live (nothing to write back)."""
    forwards_stale: bool = False
    """True when a stale row may be taken from the working buffer of the step that last held it (its value
    is final once that step computed), instead of waiting for that step's write-back."""

    comm: Comm

    @abstractmethod
    def fetch(
        self, rows: np.ndarray, out_values: np.ndarray, out_state: np.ndarray, step: int = -1
    ) -> ColdFetch:
        """Rows and state of the distinct fused ids ``rows`` (into ``out_*`` where the store copies)."""

    @abstractmethod
    def needs_refresh(self, fetch: ColdFetch) -> bool:
        """Whether :meth:`refresh` must run before the fetched step computes (a collective may need it
        on every step)."""

    @abstractmethod
    def refresh(
        self, fetch: ColdFetch, slots: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reads the rows at ``slots`` (default ``fetch.stale``) again, after every earlier step's update of
        them landed: returns the slots and their fresh weights and state (state [0] where unused)."""

    def refresh_into(self, fetch: ColdFetch, slots: np.ndarray, work: np.ndarray, state: np.ndarray) -> None:
        """:meth:`refresh` of ``slots`` straight into the working buffer ``work`` and its ``state`` (host arrays;
        state empty where unused). Called even with no slots, as :meth:`refresh` is (a collective may need it)."""
        slots, w, s = self.refresh(fetch, slots)
        if slots.size:
            scatter_rows(work, slots, w)
            if s.size:
                scatter_rows(state, slots, s)

    @abstractmethod
    def update(self, fetch: ColdFetch, optimizer: SparseOptimizer, work: torch.Tensor, work_state: torch.Tensor,
               slot: np.ndarray, grads: torch.Tensor, pos: np.ndarray, device_index=None) -> int:  # fmt: skip
        """Applies the step's gradients of the working rows: lookup i's gradient ``grads[pos[i]]`` belongs to
        working slot ``slot[i]``. ``device_index``: ``(slot, pos)`` as device tensors (off the CPU).
        Returns the number of rows updated."""

    @abstractmethod
    def write_back(self, fetch: ColdFetch, values: np.ndarray, state: np.ndarray) -> None:
        """Stores the updated working rows (and state); marks the step's update as landed."""

    @abstractmethod
    def lookahead(self) -> contextlib.AbstractContextManager[Comm]:
        """A look-ahead run: resets the claim bookkeeping; yields the Comm the fetching thread uses."""

    @abstractmethod
    def read(self, rows: np.ndarray) -> np.ndarray:
        """Weights of the distinct fused ids ``rows`` (evaluation; a collective on N ranks)."""

    @abstractmethod
    def export(
        self, hot_rows: np.ndarray, hot_w: torch.Tensor, hot_s: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every row's weight and state (fused ids), the hot rows taken from the hot tier (a collective)."""

    @abstractmethod
    def load(self, weights: np.ndarray, state: np.ndarray) -> None:
        """Replaces every row's weight and state (fused ids; each rank keeps its own)."""

    def close(self) -> None:
        """Releases what the store holds beyond its arrays (pinned registrations)."""
        self.host.close()

    def demote(self, rows: np.ndarray, w: np.ndarray, s: np.ndarray) -> None:
        """Stores rows leaving the hot tier (their values and state become the authoritative copies)."""
        raise NotImplementedError(f"{type(self).__name__} cannot move rows between tiers yet")

    def promote(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weights and state of rows entering the hot tier."""
        raise NotImplementedError(f"{type(self).__name__} cannot move rows between tiers yet")


def update_working_rows(optimizer: SparseOptimizer, scratch, work: torch.Tensor, work_state: torch.Tensor,
                        slot: np.ndarray, grads: torch.Tensor, pos: np.ndarray, device_index=None) -> int:  # fmt: skip
    """:meth:`ColdStore.update` of a store whose working copy is updated and written back."""
    if not slot.shape[0]:
        return 0
    if device_index is None:  # CPU: the kernel reads the gradients in place
        return optimizer.step_parts(work, work_state, [(slot, grads.numpy(), pos)], scratch)
    slot_t, pos_t = device_index
    n = work.shape[0]
    optimizer.step_coalesced(work, work_state, None, slot_t, grads[pos_t], num_rows=n)
    return n


def staging_tensor(shape, pin: bool) -> torch.Tensor:
    """A float32 host buffer that copies go through (allocated pinned when ``pin``: small, reused)."""
    return torch.empty(shape, dtype=torch.float32, pin_memory=pin)


def with_hot_rows(
    w: np.ndarray, s: np.ndarray, hot_rows: np.ndarray, hot_w: torch.Tensor, hot_s: torch.Tensor
):
    """Every row's weight and state with the hot rows' taken from the hot tier (authoritative for them)."""
    if hot_rows.size:
        w[hot_rows] = hot_w.detach().cpu().numpy()
        if s.size:
            s[hot_rows] = hot_s.detach().cpu().numpy()
    return w, s


class ClaimBook:
    """The claim rule's bookkeeping over ``num_rows`` rows (see :meth:`claim`), whatever holds the rows: the rows
    of the live steps' working sets only (:class:`hotline.kernels.claim_book.RowsInFlight`), so its size
    follows the rows in flight, not the table."""

    def __init__(self, num_rows: int):
        self.num_rows = int(num_rows)
        self._book: RowsInFlight | None = None  # during a look-ahead run
        self.applied = 0  # steps < applied have their updates where the rows live

    def claim_with_owners(self, rows: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`claim` of distinct ``rows``, also returning for each stale row the step that last held it
        and the row's slot in that step's working set."""
        applied = self.applied
        return self._book.claim(rows, step, applied)

    def claim(self, rows: np.ndarray, step: int, distinct: bool = True) -> np.ndarray:
        """The claim rule: positions in ``rows`` of rows that an earlier step, whose update has not landed,
        also holds (they may be stale); records ``step`` as the rows' last holder. Call it BEFORE reading the
        rows: ``applied`` is read first, so a row not flagged was last updated by a step that had finished.
        ``distinct=False``: ``rows`` may repeat (several ranks asked for one row); each copy gets the flag
        of the row, and the rows' slots are recorded as unknown."""
        applied = self.applied
        return self._book.claim(rows, step, applied, distinct)[0]

    def held(self, rows: np.ndarray) -> np.ndarray:
        """int64: each row's last holder step (high 32 bits) and slot (low 32) while that step is in the book,
        -1 where none (for tests and diagnostics)."""
        return self._book.entries(rows)

    def start_claims(self) -> None:
        self._book = RowsInFlight()
        self.applied = 0

    def end_claims(self) -> None:
        self._book = None


class HostRows(ClaimBook):
    """Rows and their optimizer state in this process's host memory, with the claim rule's bookkeeping."""

    def __init__(self, weights: np.ndarray, optimizer: SparseOptimizer, pin: bool = False):
        super().__init__(weights.shape[0])
        self.weight = torch.from_numpy(weights)
        self.state = optimizer.new_state(weights.shape[0])
        self._pinned = []
        if pin:
            # Pinned in place (cudaHostRegister), copied only where that is refused (with a warning): only the
            # staging buffers are copied from, but a registered cold tier lets later versions read it from the
            # device directly.
            (self.weight, weight_region), (self.state, state_region) = map(pinned, (self.weight, self.state))
            self._pinned = [weight_region, state_region]
        self.w = self.weight.numpy()  # numpy views for the Numba kernels (same memory)
        self.s = self.state.numpy()

    def close(self) -> None:
        """Unregisters pinned memory."""
        for region in self._pinned:
            if region is not None:
                region.close()
        self._pinned = []

    def gather(
        self, rows: np.ndarray, out_w: np.ndarray, out_s: np.ndarray, skip: np.ndarray = _EMPTY
    ) -> tuple[np.ndarray, np.ndarray]:
        """Copies rows and their state into buffers; returns the filled views. ``skip``: slots left as they are
        (the stale ones, which a refresh reads again before the step computes: reading them now is wasted)."""
        n = rows.shape[0]
        if not skip.size:
            w = gather_rows(self.w, rows, out_w)
            s = gather_rows(self.s, rows, out_s) if self.s.size else out_s[:0]
            return w, s
        if out_w.shape[0] < n or (self.s.size and out_s.shape[0] < n):
            raise ValueError(f"staging buffers {out_w.shape} / {out_s.shape} too small for {n} rows")
        keep = np.ones(n, bool)
        keep[skip] = False
        slots = np.flatnonzero(keep)
        read = rows[slots]
        copy_rows(out_w, slots, self.w, read)
        if self.s.size:
            copy_rows(out_s, slots, self.s, read)
        return out_w[:n], out_s[:n] if self.s.size else out_s[:0]

    def scatter(self, rows: np.ndarray, w: np.ndarray, s: np.ndarray) -> None:
        scatter_rows(self.w, rows, w)
        if self.s.size:
            scatter_rows(self.s, rows, s)

    # The row holder's verbs that a store of a rank's shard uses (``hotline.tiers.disk_store.DiskRows`` has
    # them too: a shard in a file).
    def get(self, rows: np.ndarray, out_w=None, out_s=None, skip=None, track: bool = False):
        """Weights and state of ``rows`` (may repeat), and None (no pages were read: nothing to track; ``skip``,
        the rows a refresh sends again, are read too: from memory that costs no request)."""
        return self.w[rows], self.s[rows] if self.s.size else self.s[:0], None

    def reread(self, rows: np.ndarray, pages, idx: np.ndarray):
        """Weights and state of ``rows[idx]`` now (``pages``: none in memory)."""
        return self.get(rows[idx])[:2]

    def put(self, rows: np.ndarray, w: np.ndarray, s: np.ndarray, pages=None) -> None:
        """Stores weights and state of the distinct ``rows``."""
        self.scatter(rows, w, s)

    def apply(self, optimizer: SparseOptimizer, rows: np.ndarray, grads: torch.Tensor, pages=None) -> int:
        """One sparse update of ``rows`` (may repeat: their gradients summed) in place (``pages``: none here)."""
        return optimizer.step(self.weight, self.state, torch.from_numpy(rows), grads)

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of every row's weight and state."""
        return self.w.copy(), self.s.copy()

    def replace_all(self, weights: np.ndarray, state: np.ndarray) -> None:
        self.w[:] = weights
        if self.s.size:
            self.s[:] = state


class OneRankStore(ColdStore):
    """A store of one rank whose working copy is updated and written back, over a row holder ``host`` with
    the claim bookkeeping and the verbs get / put / all / replace_all (:class:`HostRows`, or the disk
    store's ``DiskRows``)."""

    forwards_stale = True
    _scratch: np.ndarray

    def needs_refresh(self, fetch: ColdFetch) -> bool:
        return fetch.stale.size > 0

    def update(self, fetch, optimizer, work, work_state, slot, grads, pos, device_index=None) -> int:
        return update_working_rows(optimizer, self._scratch, work, work_state, slot, grads, pos, device_index)

    def write_back(self, fetch: ColdFetch, values, state) -> None:
        if fetch.rows.shape[0]:
            self.host.put(fetch.rows, values, state, fetch.route)
        if fetch.step >= 0:
            self.host.applied = fetch.step + 1

    @contextlib.contextmanager
    def lookahead(self):
        self.host.start_claims()
        try:
            yield self.comm
        finally:
            self.host.end_claims()

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self.host.get(rows)[0]

    def demote(self, rows, w, s) -> None:
        if rows.size:
            self.host.put(rows, w, s)

    def promote(self, rows):
        w, s, _ = self.host.get(rows)
        return w, s

    def export(self, hot_rows, hot_w, hot_s):
        return with_hot_rows(*self.host.all(), hot_rows, hot_w, hot_s)

    def load(self, weights: np.ndarray, state: np.ndarray) -> None:
        self.host.replace_all(weights, state)


class LocalColdStore(OneRankStore):
    """Every row in this process's host memory: the store of one rank."""

    def __init__(self, weights: np.ndarray, optimizer: SparseOptimizer, pin: bool = False, max_rows: int = 0):
        self.comm = Comm()
        self.host = HostRows(weights, optimizer, pin)
        self._scratch = sparse_update.new_scratch(max_rows)

    @property
    def w(self) -> np.ndarray:
        return self.host.w

    @property
    def s(self) -> np.ndarray:
        return self.host.s

    def fetch(self, rows, out_values, out_state, step=-1) -> ColdFetch:
        stale, owner, slot = self.host.claim_with_owners(rows, step) if step >= 0 else (_EMPTY,) * 3
        w, s = self.host.gather(rows, out_values, out_state, skip=stale)  # stale rows: read by the refresh
        return ColdFetch(rows, w, s, step=step, stale=stale, stale_owner=owner, stale_slot=slot)

    def refresh(self, fetch: ColdFetch, slots=None):
        slots = fetch.stale if slots is None else slots
        rows = fetch.rows[slots]
        return slots, self.w[rows], self.s[rows] if self.s.size else self.s[:0]

    def refresh_into(self, fetch: ColdFetch, slots: np.ndarray, work: np.ndarray, state: np.ndarray) -> None:
        if slots.size:  # host to working buffer in one pass each, with no intermediate copy
            rows = fetch.rows[slots]
            copy_rows(work, slots, self.w, rows)
            if self.s.size:
                copy_rows(state, slots, self.s, rows)
