"""Training modes across N ranks: the data-parallel ``device`` reference and the sharded ``hotline``/``hybrid``.

Each rank trains on its shard of every global mini-batch (the loss normalised by the GLOBAL batch size, so the
gradients of the ranks add up to one process's gradient). Embedding rows:

- ``device`` (:class:`ReplicatedDeviceMode`): every rank holds every table; each rank sums the gradients of its
  lookups per row, the ranks all-gather those (row, gradient) pairs, and every replica applies the same sparse
  update to the union of the touched rows.
- ``hotline`` / ``hybrid`` (:class:`ShardedTieredMode`): the hot tier is replicated and updated like the
  ``device`` tables above; the cold tier is sharded by row (fused row id modulo N: rank r owns rows r, r+N,
  ...). Each step a rank sends the ids of its working set to their owners (all-to-all), the owners answer with
  the rows and their optimizer state (all-to-all), and after backward the working rows' summed gradients go
  back to the owners (all-to-all), which add up the gradients from every rank and update each row ONCE.
  With look-ahead 0 the next step's rows are fetched after this step's owners updated them, so every read is
  fresh. With look-ahead K > 0 (:class:`LookAhead`) a thread per rank dispatches and fetches the steps ahead
  over a second gloo group while the main thread computes; each owner flags the rows it served while an
  earlier step's update of them was still pending, and those rows alone are fetched again (on the main group)
  just before the step computes, so the result stays exact.

Each group's collectives run on one thread in the same order on every rank (step order), so a rank with an
empty shard (a global batch smaller than N) still takes part with empty payloads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.dispatcher import Dispatcher, MicroBatches
from hotline.executor import _END, _POLL_S, _Failure
from hotline.model import DLRM, init_embedding_table
from hotline.modes import (
    DeviceMode,
    StepStats,
    TrainMode,
    check_ids,
    loss_and_backward,
    sum_pool,
    table_offsets,
)
from hotline.placement import Placement
from hotline.sparse_optim import SparseOptimizer
from hotline.tiers import placement_for


def coalesce(ids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct ``ids`` (sorted) and the summed gradient of each: what a rank contributes to a sparse update."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    summed = torch.zeros((uniq.shape[0], grads.shape[1]), dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, inverse, grads)
    return uniq, summed


def replicated_sparse_update(
    comm, optimizer: SparseOptimizer, table: torch.Tensor, state: torch.Tensor, ids, grads, kind: str
) -> int:
    """Applies the summed gradients of every rank's lookups ``ids``/``grads`` to a replicated ``table``.

    Each rank coalesces its lookups, the ranks all-gather the (id, gradient) pairs, and every replica runs the
    same sparse update on the same concatenation (rank order): the touched set is the union over ranks, each
    row updated once with the sum of all ranks' gradients, and the replicas stay bit-identical.
    """
    D = table.shape[1]
    if ids:
        uniq, summed = coalesce(torch.cat(ids), torch.cat(grads))
    else:
        uniq, summed = torch.zeros(0, dtype=torch.int64), torch.zeros((0, D), dtype=torch.float32)
    # The ids travel bit for bit inside the float payload (an int64 is two float32 words; nothing adds them).
    packed = torch.cat([uniq.contiguous().view(torch.float32).view(-1, 2), summed], dim=1)
    parts = comm.all_gather_varlen(packed, kind)
    allp = torch.cat(parts) if len(parts) > 1 else parts[0]
    if not allp.shape[0]:
        return 0
    all_ids = allp[:, :2].contiguous().view(torch.int64).view(-1)
    return optimizer.step(table, state, all_ids, allp[:, 2:].contiguous())


class ReplicatedDeviceMode(DeviceMode):
    """``device`` mode on N ranks: all tables replicated, sparse gradients all-gathered (the reference)."""

    def __init__(self, comm, table_sizes, dim, optimizer, seed, device="cpu"):
        super().__init__(table_sizes, dim, optimizer, seed, device)
        self.comm = comm

    def step(self, model: DLRM, batch: Batch, global_size: int | None = None) -> StepStats:
        B, T, L = batch.sparse.shape
        G = B if global_size is None else global_size
        t0 = time.perf_counter()
        ids = self._fused_ids(batch.sparse).to(self.device)
        rows = self.weight.index_select(0, ids).requires_grad_(True)
        t1 = time.perf_counter()
        loss = 0.0
        if B:
            pooled = sum_pool(rows, T, L)
            dense = torch.from_numpy(batch.dense).to(self.device)
            labels = torch.from_numpy(batch.labels).to(self.device)
            loss = loss_and_backward(model, dense, pooled, labels, G)
        t2 = time.perf_counter()
        grads = [rows.grad] if B else []
        touched = replicated_sparse_update(
            self.comm, self.optimizer, self.weight, self.state, [ids] if B else [], grads, "sparse_allgather"
        )
        t3 = time.perf_counter()
        return StepStats(
            loss_sum=float(loss),
            samples=B,
            times={"gather": t1 - t0, "compute": t2 - t1, "sparse_update": t3 - t2},
            counters={"rows_touched": touched},
        )

    def shard_state(self) -> dict[str, torch.Tensor]:
        """What this rank's checkpoint file holds of the tables (rank 0: all of them; the rest: nothing)."""
        if self.comm.rank:
            return {}
        return {"weight": self.weight.detach().cpu().clone(), "state": self.state.cpu().clone()}

    def load_shard_state(self, own: dict, rank0: dict) -> None:
        with torch.no_grad():
            self.weight.copy_(rank0["weight"])
            self.state.copy_(rank0["state"])


@dataclass
class FetchedStep:
    """A rank's shard of one step after dispatch and the fetch of its working set's cold rows."""

    batch: Batch
    global_size: int
    """Samples in the whole global batch (the loss normaliser)."""
    micro: MicroBatches
    rows: torch.Tensor
    """[U, D (+ S)] the working rows (and their state), in working-set order."""
    order: np.ndarray
    """Working-set slots in send order (grouped by owner): the route of the requests and of the gradients."""
    send_counts: np.ndarray
    """Rows asked of each owner."""
    owned: np.ndarray
    """Local rows of this rank's shard that the ranks asked for, grouped by requester (their updates go there)."""
    recv_counts: np.ndarray
    """Rows each requester asked of this rank."""
    step: int = -1
    """Position in the look-ahead run (-1: fetched on the main thread, nothing can be stale)."""
    stale_slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Working-set slots their owners flagged stale, in send order (fetched again before compute)."""
    stale_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """How many flagged rows each owner sends again."""
    serve_stale: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Local rows this rank flagged, grouped by requester (it sends them again)."""
    serve_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """How many flagged rows this rank sends again to each requester."""
    times: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)


class ShardedTieredMode(TrainMode):
    """``hotline`` (or ``hybrid``) on N ranks: hot tier replicated, cold tier sharded by fused row id mod N."""

    def __init__(
        self,
        comm,
        name: str,
        table_sizes: list[int],
        pooling_factor: int,
        dim: int,
        optimizer: SparseOptimizer,
        seed: int,
        placement: Placement,
        max_shard_size: int,
        device: torch.device | str = "cpu",
        in_flight: int = 1,
    ):
        if list(placement.table_sizes) != list(table_sizes):
            raise ValueError("the placement's table sizes do not match the dataset's")
        self.comm = comm
        self.name = name
        self.table_sizes = list(table_sizes)
        self.L = int(pooling_factor)
        self.dim = dim
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.placement = placement
        self.offsets = table_offsets(self.table_sizes)
        N, r = comm.world_size, comm.rank
        self.total_rows = int(sum(self.table_sizes))
        self.shard_size = len(range(r, self.total_rows, N))
        self.hot_rows = placement.fused_hot_ids()
        # One table at a time: the initial rows of this rank's shard and of the (replicated) hot tier.
        shard_w = np.empty((self.shard_size, dim), np.float32)
        hot_w = np.empty((self.hot_rows.shape[0], dim), np.float32)
        h = 0
        for t, n in enumerate(self.table_sizes):
            w = init_embedding_table(n, dim, seed, t)
            lo = int(self.offsets[t])
            first = lo + (r - lo) % N  # the first fused row of table t that this rank owns
            if first < lo + n:
                local = np.arange(first, lo + n, N) // N
                shard_w[local] = w[first - lo :: N]
            ids = np.asarray(placement.hot_ids[t], dtype=np.int64)
            hot_w[h : h + ids.shape[0]] = w[ids]
            h += ids.shape[0]
        self.shard_w = torch.from_numpy(shard_w)
        self.shard_s = optimizer.new_state(self.shard_size)
        self.hot_w = torch.from_numpy(hot_w).to(self.device)
        self.hot_s = optimizer.new_state(self.hot_rows.shape[0], self.device)
        self.S = optimizer.state_floats_per_row
        self.dispatcher = Dispatcher(placement, self.L, max(1, max_shard_size), in_flight=max(1, in_flight))
        self.fused_remap = self.dispatcher.remap
        # Look-ahead bookkeeping of the rows this rank owns (reset by LookAhead.progress): the last step that
        # asked for each, and how many steps' updates are applied.
        self._last_request = np.full(self.shard_size, -1, np.int64)
        self._applied = 0

    # -- cold rows across ranks -------------------------------------------------------------------------
    def _fetch(self, ids: np.ndarray, with_state: bool, kind: str):
        """Rows (and state) of the distinct fused ids ``ids`` from their owners, in ``ids`` order.

        Returns ``(rows [n, D (+S)], order, send_counts, recv_local, recv_counts)``: the last four say who asked
        what, so the gradients can be sent back along the same routes.
        """
        N = self.comm.world_size
        owner = ids % N
        order = np.argsort(owner, kind="stable")
        send_counts = np.bincount(owner, minlength=N)
        asked, recv_counts = self.comm.all_to_all(torch.from_numpy(ids[order]), send_counts, kind + "_ids")
        local = asked.numpy() // N
        rows = self.shard_w.numpy()[local]
        if with_state and self.S:
            rows = np.concatenate([rows, self.shard_s.numpy()[local, None]], axis=1)
        got, _ = self.comm.all_to_all(torch.from_numpy(rows), recv_counts, kind + "_rows", send_counts)
        out = torch.empty_like(got)
        out[torch.from_numpy(order)] = got
        return out, order, send_counts, local, recv_counts

    def fetch(self, batch: Batch, global_size: int | None = None) -> FetchedStep:
        """Dispatch and fetch of one step on the main thread (look-ahead 0: every row read is fresh)."""
        t0 = time.perf_counter()
        micro = self.dispatcher.split(batch.sparse)
        t1 = time.perf_counter()
        rows, order, send_counts, owned, recv_counts = self._fetch(micro.working_set, True, "cold")
        G = batch.sparse.shape[0] if global_size is None else global_size
        times = {"dispatch": t1 - t0, "exchange": time.perf_counter() - t1}
        return FetchedStep(batch, G, micro, rows, order, send_counts, owned, recv_counts, times=times)

    def fetch_ahead(self, comm, batch: Batch, global_size: int, step: int) -> FetchedStep:
        """Dispatch and fetch of step ``step`` on the look-ahead thread, over ``comm`` (its own group).

        As the owner of the rows asked for, this rank flags each row that an earlier step asked for and whose
        update this rank has not applied yet (``_last_request[row] >= _applied``): such a read may be stale (or
        torn, if the update is running now) and is sent again by :meth:`_refresh` just before the step
        computes. ``_applied`` is read BEFORE the rows, so a row not flagged was last updated by a step whose
        update had finished, and no step before ``step`` updates it any more.
        """
        N = comm.world_size
        t0 = time.perf_counter()
        micro = self.dispatcher.split(batch.sparse)
        t1 = time.perf_counter()
        ids = micro.working_set
        owner = ids % N
        order = np.argsort(owner, kind="stable")
        send_counts = np.bincount(owner, minlength=N)
        asked, recv_counts = comm.all_to_all(torch.from_numpy(ids[order]), send_counts, "cold_ids")
        local = asked.numpy() // N
        applied = self._applied
        stale = self._last_request[local] >= applied
        self._last_request[local] = step  # only this thread reads or writes it
        parts = [self.shard_w.numpy()[local]]
        if self.S:
            parts.append(self.shard_s.numpy()[local, None])
        parts.append(stale[:, None].astype(np.float32))
        payload = torch.from_numpy(np.concatenate(parts, axis=1))
        got, _ = comm.all_to_all(payload, recv_counts, "cold_rows", send_counts)
        rows = torch.empty((got.shape[0], got.shape[1] - 1), dtype=torch.float32)
        rows[torch.from_numpy(order)] = got[:, :-1]
        # Refresh routes, known to both sides without asking: the owner sends its flagged rows again, grouped by
        # requester in the order they were asked; the requester gets them in its send order (grouped by owner).
        sent_stale = np.flatnonzero(got[:, -1].numpy() != 0)
        source = np.repeat(np.arange(N), recv_counts)
        fetched = FetchedStep(batch, global_size, micro, rows, order, send_counts, local, recv_counts, step)
        fetched.stale_slots = order[sent_stale]
        fetched.stale_counts = np.bincount(owner[order][sent_stale], minlength=N)
        fetched.serve_stale = local[stale]
        fetched.serve_counts = np.bincount(source[stale], minlength=N)
        fetched.times = {"dispatch": t1 - t0, "exchange_ahead": time.perf_counter() - t1}
        fetched.counters = {f"bytes_sent_{k}": v for k, v in comm.take_bytes().items()}
        return fetched

    def _refresh(self, fetched: FetchedStep) -> None:
        """Re-reads the rows flagged stale from their owners, now that every earlier step's update is applied.

        A collective on the main group that every rank runs every step, even with nothing flagged.
        """
        D = self.dim
        send = torch.from_numpy(self.shard_w.numpy()[fetched.serve_stale])
        got, _ = self.comm.all_to_all(send, fetched.serve_counts, "cold_refresh", fetched.stale_counts)
        if fetched.stale_slots.size:
            fetched.rows[torch.from_numpy(fetched.stale_slots), :D] = got

    def step(
        self, model: DLRM, batch: Batch, global_size: int | None = None, fetched: FetchedStep | None = None
    ) -> StepStats:
        """One step of this rank's shard: fetch cold rows (or refresh the stale ones of a step fetched ahead),
        forward/backward, hot and cold sparse updates."""
        t_start = time.perf_counter()
        if fetched is None:
            fetched = self.fetch(batch, global_size)
            refresh = 0.0
        else:
            self._refresh(fetched)
            refresh = time.perf_counter() - t_start
        batch, G, micro = fetched.batch, fetched.global_size, fetched.micro
        B, T, L = batch.sparse.shape
        C, D = T * L, self.dim
        ws = micro.working_set
        work = fetched.rows[:, :D]
        t2 = time.perf_counter()
        ix = {k: torch.from_numpy(getattr(micro, k)) for k in ("popular_samples", "non_popular_samples")}
        ix.update({k: torch.from_numpy(getattr(micro, k)) for k in ("pop_ids", "hot_pos", "hot_slot")})
        ix.update({k: torch.from_numpy(getattr(micro, k)) for k in ("cold_pos", "cold_slot")})
        ix = {k: v.to(self.device) for k, v in ix.items()}
        dense = torch.from_numpy(batch.dense).to(self.device)
        labels = torch.from_numpy(batch.labels).to(self.device)
        loss = 0.0
        hot_ids, hot_grads = [], []
        if micro.num_popular:
            rows = self.hot_w.index_select(0, ix["pop_ids"]).requires_grad_(True)
            idx = ix["popular_samples"]
            loss += loss_and_backward(model, dense[idx], sum_pool(rows, T, L), labels[idx], G)
            hot_ids.append(ix["pop_ids"])
            hot_grads.append(rows.grad)
        cold_sum = torch.zeros((ws.shape[0], D), dtype=torch.float32, device=self.device)
        if micro.num_non_popular:
            rows = torch.empty((micro.num_non_popular * C, D), dtype=torch.float32, device=self.device)
            rows[ix["hot_pos"]] = self.hot_w.index_select(0, ix["hot_slot"])
            rows[ix["cold_pos"]] = work.to(self.device).index_select(0, ix["cold_slot"])
            rows.requires_grad_(True)
            idx = ix["non_popular_samples"]
            loss += loss_and_backward(model, dense[idx], sum_pool(rows, T, L), labels[idx], G)
            hot_ids.append(ix["hot_slot"])
            hot_grads.append(rows.grad[ix["hot_pos"]])
            cold_sum.index_add_(0, ix["cold_slot"], rows.grad[ix["cold_pos"]])
        t3 = time.perf_counter()
        touched = 0
        if self.hot_rows.shape[0]:
            touched += replicated_sparse_update(
                self.comm, self.optimizer, self.hot_w, self.hot_s, hot_ids, hot_grads, "hot_allgather"
            )
        t4 = time.perf_counter()
        # The working rows' gradients go back to their owners along the routes the requests came.
        send = cold_sum.cpu()[torch.from_numpy(fetched.order)]
        grads, _ = self.comm.all_to_all(send, fetched.send_counts, "cold_grads", fetched.recv_counts)
        owned = fetched.owned
        if owned.shape[0]:  # rows asked for by several ranks: the kernel sums their gradients first
            touched += self.optimizer.step(self.shard_w, self.shard_s, torch.from_numpy(owned), grads)
        if fetched.step >= 0:  # after the update: the look-ahead thread may read these rows as fresh now
            self._applied = fetched.step + 1
        t5 = time.perf_counter()
        times = {**fetched.times, "compute": t3 - t2, "sparse_update": t4 - t3}
        times["exchange"] = times.get("exchange", 0.0) + t5 - t4 + refresh
        counters = {
            **fetched.counters,
            "popular_samples": micro.num_popular,
            "working_set_rows": int(ws.shape[0]),
            "rows_touched": touched,
        }
        if fetched.step >= 0:
            counters["stale_rows"] = int(fetched.stale_slots.shape[0])
        return StepStats(loss_sum=float(loss), samples=B, times=times, counters=counters)

    # -- evaluation, export, checkpoints ----------------------------------------------------------------
    @torch.no_grad()
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        """Pooled embeddings of this rank's eval shard (a collective: every rank must call it)."""
        check_ids(sparse, self.table_sizes)
        B, T, L = sparse.shape
        fused = (sparse.astype(np.int64) + self.offsets[None, :, None]).reshape(-1)
        slots = self.fused_remap[fused]
        cold = np.flatnonzero(slots < 0)
        uniq, inverse = np.unique(fused[cold], return_inverse=True)
        fetched = self._fetch(uniq, False, "eval")[0]
        rows = torch.empty((fused.shape[0], self.dim), dtype=torch.float32, device=self.device)
        hot = np.flatnonzero(slots >= 0)
        if hot.size:
            rows[torch.from_numpy(hot)] = self.hot_w[torch.from_numpy(slots[hot])]
        if cold.size:
            rows[torch.from_numpy(cold)] = fetched[torch.from_numpy(inverse.reshape(-1))].to(self.device)
        return sum_pool(rows, T, L)

    def _assemble(self, shard: torch.Tensor, hot: torch.Tensor) -> np.ndarray:
        """Every row (fused ids) from all ranks' shards, hot rows from the hot tier (a collective)."""
        N = self.comm.world_size
        parts = self.comm.all_gather_varlen(shard.reshape(shard.shape[0], -1), "export")
        full = np.empty((self.total_rows, *shard.shape[1:]), np.float32)
        for r, p in enumerate(parts):
            full[r::N] = p.numpy().reshape(-1, *shard.shape[1:])
        if self.hot_rows.size:
            full[self.hot_rows] = hot.detach().cpu().numpy()
        return full

    def export_tables(self) -> list[np.ndarray]:
        w = self._assemble(self.shard_w, self.hot_w)
        return [w[o : o + n] for o, n in zip(self.offsets, self.table_sizes)]

    def export_state(self) -> list[np.ndarray]:
        if not self.S:
            return [np.zeros(0, np.float32) for _ in self.table_sizes]
        s = self._assemble(self.shard_s, self.hot_s)
        return [s[o : o + n] for o, n in zip(self.offsets, self.table_sizes)]

    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        N, r = self.comm.world_size, self.comm.rank
        w = np.concatenate(tables)
        with torch.no_grad():
            self.shard_w.copy_(torch.from_numpy(w[r::N]))
            self.hot_w.copy_(torch.from_numpy(w[self.hot_rows]))
            if self.S:
                s = np.concatenate(states)
                self.shard_s.copy_(torch.from_numpy(s[r::N]))
                self.hot_s.copy_(torch.from_numpy(s[self.hot_rows]))

    def shard_state(self) -> dict[str, torch.Tensor]:
        """This rank's checkpoint share: its cold shard (every rank) and the hot tier (rank 0 only)."""
        out = {"cold_w": self.shard_w.clone(), "cold_s": self.shard_s.clone()}
        if self.comm.rank == 0:
            out.update(hot_w=self.hot_w.detach().cpu().clone(), hot_s=self.hot_s.cpu().clone())
        return out

    def load_shard_state(self, own: dict, rank0: dict) -> None:
        if own["cold_w"].shape != self.shard_w.shape or rank0["hot_w"].shape != self.hot_w.shape:
            raise ValueError(
                f"checkpoint shard has {tuple(own['cold_w'].shape)} cold and {tuple(rank0['hot_w'].shape)} hot "
                f"rows, this rank expects {tuple(self.shard_w.shape)} and {tuple(self.hot_w.shape)} "
                f"(same placement and number of ranks?)"
            )
        with torch.no_grad():
            self.shard_w.copy_(own["cold_w"])
            self.shard_s.copy_(own["cold_s"])
            self.hot_w.copy_(rank0["hot_w"])
            self.hot_s.copy_(rank0["hot_s"])


def build_distributed_mode(comm, config, dataset, optimizer: SparseOptimizer) -> TrainMode:
    """The distributed mode of ``config.mode`` for this rank (placements as in ``hotline.tiers``)."""
    if config.mode == "device":
        return ReplicatedDeviceMode(
            comm, dataset.table_sizes, config.embedding_dim, optimizer, config.seed, config.device
        )
    placement = placement_for(config, dataset, progress=False)
    max_shard = -(-config.mini_batch_size // comm.world_size)
    return ShardedTieredMode(
        comm,
        config.mode,
        dataset.table_sizes,
        dataset.pooling_factor,
        config.embedding_dim,
        optimizer,
        config.seed,
        placement,
        max_shard,
        config.device,
        in_flight=config.lookahead + 3 if config.mode == "hotline" else 1,
    )


class LookAhead:
    """Fetches the cold rows of the next ``lookahead`` steps of a :class:`ShardedTieredMode` on a thread.

    The thread dispatches and fetches step j (all-to-all of ids and rows on a gloo group of its own, created
    and destroyed by :meth:`progress` on every rank in the same order) while the main thread computes earlier
    steps; a bounded queue of ``lookahead`` steps gives back-pressure. Before each step the threads of all
    ranks agree (one all-reduce on their group) whether to go on, so they stop together at the end, when the
    main thread stops early, or when another rank stopped; an exception on the thread is raised on the main
    thread. No thread outlives :meth:`progress`.
    """

    def __init__(self, mode: ShardedTieredMode, lookahead: int, worker_threads: int = 1):
        if lookahead < 1:
            raise ValueError(f"LookAhead needs lookahead >= 1, got {lookahead}")
        self.mode = mode
        self.lookahead = lookahead
        self.worker_threads = worker_threads

    def progress(self, shards: Iterable[tuple[Batch, int]]) -> Iterator[FetchedStep]:
        """The fetched steps of ``(batch, global_size)`` shards, in order (a collective on every rank)."""
        mode = self.mode
        mode._last_request.fill(-1)
        mode._applied = 0
        comm = mode.comm.new_group()
        stop = threading.Event()
        ready: queue.Queue = queue.Queue(maxsize=self.lookahead)
        thread = threading.Thread(
            target=self._produce,
            args=(comm, iter(shards), ready, stop),
            name="hotline-fetch-ahead",
            daemon=True,
        )
        thread.start()
        finished = False
        try:
            while True:
                t0 = time.perf_counter()
                item = self._get(ready, thread)
                if item is _END:
                    break
                if isinstance(item, _Failure):
                    raise item.exc
                item.times["stall"] = time.perf_counter() - t0
                yield item
            finished = True
        finally:
            stop.set()
            thread.join()
            if finished:  # no rank destroys the group while a peer may still finish its last collective on it
                mode.comm.barrier()
            comm.destroy()

    def _produce(self, comm, shards: Iterator[tuple[Batch, int]], ready: queue.Queue, stop) -> None:
        import numba

        numba.set_num_threads(max(1, min(self.worker_threads, numba.config.NUMBA_NUM_THREADS)))
        try:
            step = 0
            while True:
                shard = None if stop.is_set() else next(shards, None)
                # Every rank's thread takes the same decision, or one would wait forever in a collective.
                if not comm.all_ok(shard is not None):
                    break
                fetched = self.mode.fetch_ahead(comm, shard[0], shard[1], step)
                step += 1
                self._put(ready, fetched, stop)  # when stopped, the next agreement ends every rank's thread
            self._put(ready, _END, stop)
        except BaseException as e:  # noqa: BLE001 - carried to the main thread
            self._put(ready, _Failure(e), stop)

    @staticmethod
    def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    @staticmethod
    def _get(q: queue.Queue, thread: threading.Thread):
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if not thread.is_alive() and q.empty():
                    raise RuntimeError("the look-ahead thread ended without a result") from None
