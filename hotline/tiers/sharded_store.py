"""The cold tier sharded by row over N ranks: rank r owns fused rows r, r+N, r+2N, ...

A :class:`ShardedColdStore` keeps this rank's shard in a :class:`~hotline.tiers.cold_store.HostRows` (local
row ``fused // N``) and answers the other ranks' requests. Per step:

1. fetch: a rank sends the ids of its working set to their owners (all-to-all, grouped by owner) and the
   owners answer with the rows and their optimizer state (all-to-all);
2. update: after backward each rank sums its gradients per working row where they live and starts their copy
   to host memory (on CUDA a non-blocking copy into pinned memory: the step does not wait for it);
3. write-back (the writer thread under look-ahead, after the step's device work is done): the sums go back to
   their owners along the same routes (all-to-all, on a group of its own); each owner adds up the gradients of
   every rank that asked for a row and updates it ONCE. The owner applies the update, so no row is written
   back (``writes_back = False``). The host needs the gradients, which exist only once backward has run: the
   copy is inherent. Under look-ahead it overlaps the step's dense all-reduce and dense optimizer step and
   the next step's popular micro-batch; that step's refresh waits for it (its rows may depend on this update).

Look-ahead (fetches for step j run on a thread, over a second gloo group, while earlier steps compute): each
owner flags the rows it served while an earlier step's update of them was still pending (the claim rule on
its shard), and ``refresh`` (a collective on the main group, every step) sends those rows again before the
step first reads its working rows (after this rank's earlier updates have landed: the executor waits for their
write-back), so the result stays exact. Each group's collectives run on one thread in the same order on every rank, so a rank
with an empty shard of a batch still takes part with empty payloads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hotline.distributed.comm import Comm
from hotline.tiers.cold_store import _EMPTY, ColdFetch, ColdStore, HostRows, with_hot_rows
from hotline.tiers.sparse_optim import SparseOptimizer


@dataclass
class Route:
    """Who asked what in one step's fetch: the routes of the requests, the refreshes and the gradients."""

    order: np.ndarray
    """Working-set slots in send order (grouped by owner)."""
    send_counts: np.ndarray
    """Rows asked of each owner."""
    owned: np.ndarray
    """Local rows of this rank's shard that the ranks asked for, grouped by requester."""
    recv_counts: np.ndarray
    """Rows each requester asked of this rank."""
    stale_counts: np.ndarray = field(default_factory=lambda: _EMPTY)
    """How many flagged rows each owner sends again."""
    serve_counts: np.ndarray = field(default_factory=lambda: _EMPTY)
    """How many flagged rows this rank sends again to each requester."""
    stale_at: np.ndarray = field(default_factory=lambda: _EMPTY)
    """Where the rows this rank flagged stand in ``owned`` (grouped by requester: it sends them again)."""
    pages: object = None
    """What the owner's fetch of ``owned`` read (a disk shard's tracked pages; None in memory)."""
    grads: torch.Tensor | None = None
    """The working rows' summed gradients in host memory (set by the update, sent by the write-back)."""
    optimizer: SparseOptimizer | None = None
    """The update rule as it stood at the step (a copy: the schedule may change the rate before the write-back)."""


class ShardedColdStore(ColdStore):
    """Cold rows sharded by fused row id modulo N (see the module docstring)."""

    writes_back = False

    def __init__(
        self, comm: Comm, shard_weights, optimizer: SparseOptimizer, num_rows: int, defer: bool = False
    ):
        """``shard_weights``: this rank's rows (local order) as an array (kept in host memory), or a row
        holder with HostRows' verbs (``hotline.tiers.disk_store.DiskRows``: the shard in a file).

        ``defer``: the gradients' exchange and the owners' update run in :meth:`write_back` (the training
        modes, whose writer thread calls it after every step); else in :meth:`update` itself."""
        self.comm = comm
        self.defer = defer
        self.num_rows = int(num_rows)
        self.host = (
            HostRows(shard_weights, optimizer) if isinstance(shard_weights, np.ndarray) else shard_weights
        )
        self.S = optimizer.state_floats_per_row
        self.state_shape = optimizer.state_shape  # rows -> the shape of their state (S columns travel with w)
        self._ahead: Comm | None = None  # the look-ahead thread's group, inside lookahead()
        self._behind: Comm | None = None  # the writer thread's group, inside lookahead()

    @staticmethod
    def shard_rows(num_rows: int, rank: int, world_size: int) -> np.ndarray:
        """The fused rows rank ``rank`` owns, in local-row order."""
        return np.arange(rank, num_rows, world_size, dtype=np.int64)

    # -- the step ---------------------------------------------------------------------------------------
    def fetch(self, rows, out_values, out_state, step=-1) -> ColdFetch:
        """Asks the owners for ``rows`` (on the look-ahead group when ``step >= 0``; the owners flag stale ones)."""
        comm = self._ahead if step >= 0 else self.comm
        N = comm.world_size
        t0 = time.perf_counter()
        owner = rows % N
        order = np.argsort(owner, kind="stable")
        send_counts = np.bincount(owner, minlength=N)
        asked, recv_counts = comm.all_to_all(torch.from_numpy(rows[order]), send_counts, "cold_ids")
        local = asked.numpy() // N
        stale_at = _EMPTY
        if step >= 0:  # the claim before the read (see HostRows.claim)
            stale = np.zeros(local.shape[0], bool)
            stale[self.host.claim(local, step, distinct=False)] = True
            stale_at = np.flatnonzero(stale)
        # a disk shard's pages: kept current until the update; the pages only flagged rows need are left to the
        # refresh, which sends those rows again (the values sent for them now are replaced)
        w, s, pages = self.host.get(local, skip=stale_at, track=step >= 0)
        parts = [w]
        if self.S:
            parts.append(s.reshape(local.shape[0], self.S))
        if step >= 0:
            parts.append(stale[:, None].astype(np.float32))
        payload = torch.from_numpy(np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])
        got, _ = comm.all_to_all(payload, recv_counts, "cold_rows", send_counts)
        D = w.shape[1]
        rows_back = torch.empty((got.shape[0], D + self.S), dtype=torch.float32)
        rows_back[torch.from_numpy(order)] = got[:, : D + self.S]
        values = np.ascontiguousarray(rows_back.numpy()[:, :D])
        state = np.ascontiguousarray(rows_back.numpy()[:, D:]).reshape(self.state_shape(rows.shape[0]))
        route = Route(order, send_counts, local, recv_counts, pages=pages)
        out = ColdFetch(rows, values, state, step=step, route=route)
        if step >= 0:
            # Refresh routes, known to both sides without asking: the owner sends its flagged rows again,
            # grouped by requester in the order they were asked; the requester gets them in its send order.
            sent_stale = np.flatnonzero(got[:, -1].numpy() != 0)
            source = np.repeat(np.arange(N), recv_counts)
            out.stale = order[sent_stale]
            route.stale_counts = np.bincount(owner[order][sent_stale], minlength=N)
            route.stale_at = stale_at
            route.serve_counts = np.bincount(source[stale], minlength=N)
        out.times = {"exchange_ahead" if step >= 0 else "exchange": time.perf_counter() - t0}
        if step >= 0:
            out.counters = {f"bytes_sent_{k}": v for k, v in comm.take_bytes().items()}
        return out

    def needs_refresh(self, fetch: ColdFetch) -> bool:
        return fetch.step >= 0  # a collective: every rank runs it every step, flagged rows or not

    def refresh(self, fetch: ColdFetch, slots=None):
        r = fetch.route
        # a disk shard: from the owner's fetched pages, read from disk only where no write brought them up to date
        send = torch.from_numpy(self.host.reread(r.owned, r.pages, r.stale_at)[0])
        got, _ = self.comm.all_to_all(send, r.serve_counts, "cold_refresh", r.stale_counts)
        return fetch.stale, got.numpy(), np.zeros(0, np.float32)  # the owners hold the state they update

    def update(self, fetch, optimizer, work, work_state, slot, grads, pos, device_index=None) -> int:
        """Sums this rank's gradients per working row where they live and starts their copy to host memory
        (nothing waits for the device here); :meth:`write_back` sends them to the owners. Returns the rows
        this rank sends gradients for (the owners' count of rows updated is known only there)."""
        r = fetch.route
        D = work.shape[1]
        summed = torch.zeros((fetch.rows.shape[0], D), dtype=torch.float32, device=grads.device)
        if slot.shape[0]:
            slot_t, pos_t = device_index if device_index is not None else map(torch.from_numpy, (slot, pos))
            summed.index_add_(0, slot_t, grads[pos_t])
        r.optimizer = dataclasses.replace(optimizer)
        if not self.defer:  # the exchange and the owners' update now (a blocking copy to the host on CUDA)
            r.grads = summed.cpu()
            self.write_back(fetch, None, None)
            return int(fetch.rows.shape[0])
        if summed.device.type == "cuda":  # finish_write_back waits for an event recorded after this copy
            r.grads = torch.empty(summed.shape, dtype=summed.dtype, pin_memory=True)
            r.grads.copy_(summed, non_blocking=True)
        else:
            r.grads = summed
        sent = r.send_counts.sum() - r.send_counts[self.comm.rank]  # counted with this step's bytes
        self.comm.bytes_sent["cold_grads"] += float(sent) * D * 4
        return int(fetch.rows.shape[0])

    def write_back(self, fetch: ColdFetch, values, state) -> None:
        """The step's gradients to their owners (all-to-all) and each owner's update of its rows: on the
        writer thread's group under look-ahead, after the step's device work (the rows themselves are not
        written back: the owners apply the update)."""
        r = fetch.route
        if r.grads is None:
            return
        comm = self._behind if self._behind is not None else self.comm
        send = r.grads[torch.from_numpy(r.order)]
        got, _ = comm.all_to_all(send, r.send_counts, "cold_grads", r.recv_counts, count=not self.defer)
        if r.owned.shape[0]:  # rows asked for by several ranks: the kernel sums their gradients first
            self.host.apply(r.optimizer, r.owned, got, r.pages)
        r.grads = r.optimizer = None
        if fetch.step >= 0:  # after the update: the look-ahead thread may read these rows as fresh now
            self.host.applied = fetch.step + 1

    @contextlib.contextmanager
    def lookahead(self):
        """Resets the claim bookkeeping and opens the look-ahead thread's and the writer thread's gloo groups
        (collectives)."""
        self.host.start_claims()
        self._ahead = self.comm.new_group()
        if self.defer:
            self._behind = self.comm.new_group()  # the writer thread's (write_back)
        try:
            yield self._ahead
        except BaseException:
            self._destroy_groups()
            raise
        else:  # no rank destroys the groups while a peer may still finish its last collective on them
            self.comm.barrier()
            self._destroy_groups()
        finally:
            self._ahead = self._behind = None
            self.host.end_claims()

    def _destroy_groups(self) -> None:
        for group in (self._ahead, self._behind):
            if group is not None:
                group.destroy()

    # -- evaluation, export, checkpoints ------------------------------------------------------------------
    def read(self, rows: np.ndarray) -> np.ndarray:
        N = self.comm.world_size
        owner = rows % N
        order = np.argsort(owner, kind="stable")
        send_counts = np.bincount(owner, minlength=N)
        asked, recv_counts = self.comm.all_to_all(torch.from_numpy(rows[order]), send_counts, "eval_ids")
        got, _ = self.comm.all_to_all(
            torch.from_numpy(self.host.get(asked.numpy() // N)[0]), recv_counts, "eval_rows", send_counts
        )
        out = np.empty_like(got.numpy())
        out[order] = got.numpy()
        return out

    def demote(self, rows, w, s) -> None:
        """Each owner keeps the leaving rows it owns, from its own (identical) replica of the hot tier."""
        N, r = self.comm.world_size, self.comm.rank
        mine = rows % N == r
        self.host.put(rows[mine] // N, w[mine], s[mine] if self.S else s[:0])

    def promote(self, rows):
        """The entering rows from their owners to every rank (a collective: one all-gather)."""
        N, r = self.comm.world_size, self.comm.rank
        mine = np.flatnonzero(rows % N == r)
        local = rows[mine] // N
        own_w, own_s, _ = self.host.get(local)
        own = [own_w, own_s.reshape(local.shape[0], self.S)] if self.S else [own_w]
        payload = torch.from_numpy(np.concatenate(own, axis=1) if self.S else own_w)
        got = self.comm.all_gather_varlen(payload, "replace_rows")
        where = self.comm.all_gather_varlen(torch.from_numpy(mine), "replace_ids")
        D = own_w.shape[1]
        w = np.empty((rows.shape[0], D), np.float32)
        s = np.empty(self.state_shape(rows.shape[0]), np.float32)
        for pos, vals in zip(where, got):
            w[pos.numpy()] = vals.numpy()[:, :D]
            if self.S:
                s[pos.numpy()] = vals.numpy()[:, D:].reshape(-1, *s.shape[1:])
        return w, s

    def _assemble(self, shard: np.ndarray) -> np.ndarray:
        N = self.comm.world_size
        parts = self.comm.all_gather_varlen(torch.from_numpy(shard.reshape(shard.shape[0], -1)), "export")
        full = np.empty((self.num_rows, *shard.shape[1:]), np.float32)
        for r, p in enumerate(parts):
            full[r::N] = p.numpy().reshape(-1, *shard.shape[1:])
        return full

    def export(self, hot_rows, hot_w, hot_s):
        own_w, own_s = self.host.all()
        w = self._assemble(own_w)
        s = self._assemble(own_s) if self.S else own_s
        return with_hot_rows(w, s, hot_rows, hot_w, hot_s)

    def load(self, weights: np.ndarray, state: np.ndarray) -> None:
        N, r = self.comm.world_size, self.comm.rank
        self.host.replace_all(weights[r::N], state[r::N] if self.S else state)
