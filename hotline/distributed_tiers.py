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
  Only look-ahead 0 is supported here: the next step's rows are fetched after this step's owners updated them,
  so every read is fresh.

All collectives run on the main thread in the same order on every rank, so a rank with an empty shard (a
global batch smaller than N) still takes part with empty payloads.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.dispatcher import Dispatcher
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
            loss_sum=loss,
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
        self.hot_rows = (
            np.concatenate(
                [self.offsets[t] + np.asarray(h, dtype=np.int64) for t, h in enumerate(placement.hot_ids)]
            )
            if placement.num_hot
            else np.zeros(0, np.int64)
        )
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
        self.dispatcher = Dispatcher(placement, self.L, max(1, max_shard_size), in_flight=1)
        self.fused_remap = self.dispatcher.remap

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

    def step(self, model: DLRM, batch: Batch, global_size: int | None = None) -> StepStats:
        """One step of this rank's shard: fetch cold rows, forward/backward, hot and cold sparse updates."""
        B, T, L = batch.sparse.shape
        G = B if global_size is None else global_size
        C, D = T * L, self.dim
        t0 = time.perf_counter()
        micro = self.dispatcher.split(batch.sparse)
        t1 = time.perf_counter()
        ws = micro.working_set
        fetched, order, send_counts, owned, recv_counts = self._fetch(ws, True, "cold")
        work = fetched[:, :D]
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
        send = cold_sum.cpu()[torch.from_numpy(order)]
        grads, _ = self.comm.all_to_all(send, send_counts, "cold_grads", recv_counts)
        if owned.shape[0]:  # rows asked for by several ranks: the kernel sums their gradients first
            touched += self.optimizer.step(self.shard_w, self.shard_s, torch.from_numpy(owned), grads)
        t5 = time.perf_counter()
        return StepStats(
            loss_sum=loss,
            samples=B,
            times={
                "dispatch": t1 - t0,
                "exchange": t2 - t1 + t5 - t4,
                "compute": t3 - t2,
                "sparse_update": t4 - t3,
            },
            counters={
                "popular_samples": micro.num_popular,
                "working_set_rows": int(ws.shape[0]),
                "rows_touched": touched,
            },
        )

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
    )
