"""``device`` mode: every table in one fused tensor on the compute device (the GPU-only upper bound, and the
reference every other mode must equal), replicated on every rank of a distributed run."""

from __future__ import annotations

import time

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.distributed.comm import Comm
from hotline.kernels import sparse_update
from hotline.models.dlrm import DLRM
from hotline.table_layout import BagLayout, TableLayout
from hotline.tiers.base import (
    StepStats,
    TrainMode,
    bag_pool,
    bags_of,
    initial_tables,
    loss_and_backward,
    padded_rows,
    real_positions,
    step_loss,
)
from hotline.tiers.replicated import all_ranks_gradients
from hotline.tiers.sparse_optim import SparseOptimizer


class DeviceMode(TrainMode):
    """All tables in one fused tensor on the compute device; on N ranks every rank holds all of them and the
    sparse gradients are exchanged (a no-op with one rank)."""

    name = "device"

    def __init__(
        self,
        layout: TableLayout,
        dim: int,
        optimizer: SparseOptimizer,
        seed: int,
        device: torch.device | str = "cpu",
        comm: Comm | None = None,
        bags: BagLayout | None = None,
    ):
        self.layout = layout
        self.bags = bags  # None: uniform bags, read from each batch's [B, T, L] shape
        self.table_sizes = layout.table_sizes
        self.dim = dim
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.comm = comm if comm is not None else Comm()
        self.weight = torch.from_numpy(initial_tables(layout, dim, seed)).to(self.device)
        self.state = optimizer.new_state(self.weight.shape[0], self.device)
        self.scratch = optimizer.new_scratch(self.weight.shape[0], self.device)
        # Off the CPU the update runs as torch ops; its distinct rows are found on the host (as the tiered
        # modes do), so the device never waits for a torch.unique (tests set it on CPU, too).
        self.device_updates = self.device.type != "cpu"
        self._host_scratch = None

    def _distinct(self, fused: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's distinct rows and each lookup's index into them, found on the host."""
        if self._host_scratch is None:
            self._host_scratch = sparse_update.new_scratch(self.layout.num_rows)
        rows, inverse = sparse_update.distinct(fused, self._host_scratch)
        return torch.from_numpy(rows).to(self.device), torch.from_numpy(inverse).to(self.device)

    def _lookups(self, sparse: np.ndarray) -> tuple[BagLayout, np.ndarray, torch.Tensor, torch.Tensor | None]:
        """(bags, fused ids of the real lookups, the same on the device, their positions among the batch's id
        slots on the device or None when no slot is padding)."""
        bags = bags_of(self.bags, self.layout, sparse)
        fused = bags.fuse(sparse)
        real = real_positions(fused) if bags.padded else None
        ids = fused if real is None else fused[real]
        pos = None if real is None else torch.from_numpy(real).to(self.device)
        return bags, ids, torch.from_numpy(ids).to(self.device), pos

    def step(self, model: DLRM, batch: Batch) -> StepStats:
        B = batch.sparse.shape[0]
        t0 = time.perf_counter()
        bags, fused, ids, pos = self._lookups(batch.sparse)
        distinct = self._distinct(fused) if self.device_updates and self.comm.world_size == 1 else None
        rows = padded_rows(self.weight, ids, pos, B * bags.num_columns)
        t1 = time.perf_counter()
        loss = 0.0
        if B:  # a rank's shard of a global batch smaller than N may be empty: it still takes part below
            pooled = bag_pool(rows, bags)
            dense = torch.from_numpy(batch.dense).to(self.device)
            labels = torch.from_numpy(batch.labels).to(self.device)
            loss = loss_and_backward(model, dense, pooled, labels, batch.loss_normaliser)
        t2 = time.perf_counter()
        grad = rows.grad if pos is None or rows.grad is None else rows.grad.index_select(0, pos)
        if self.comm.world_size > 1:
            ids, grads = all_ranks_gradients(
                self.comm, [ids] if B else [], [grad] if B else [], self.dim, "sparse_allgather"
            )
            touched = self.optimizer.step(self.weight, self.state, ids, grads) if ids.shape[0] else 0
        elif distinct is not None:
            self.optimizer.step_coalesced(self.weight, self.state, *distinct, grad)
            touched = int(distinct[0].shape[0])
        else:
            touched = self.optimizer.step(self.weight, self.state, ids, grad, self.scratch)
        t3 = time.perf_counter()
        return StepStats(
            loss_sum=step_loss(loss),
            samples=B,
            times={"gather": t1 - t0, "compute": t2 - t1, "sparse_update": t3 - t2},
            counters={"rows_touched": touched},
        )

    @torch.no_grad()
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        bags, _, ids, pos = self._lookups(sparse)
        return bag_pool(padded_rows(self.weight, ids, pos, sparse.shape[0] * bags.num_columns).detach(), bags)

    def export_tables(self) -> list[np.ndarray]:
        return [w.copy() for w in self.layout.split(self.weight.detach().cpu().numpy())]

    def export_state(self) -> list[np.ndarray]:
        return [s.copy() for s in self.layout.split_state(self.state.cpu().numpy())]

    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        with torch.no_grad():
            self.weight.copy_(torch.from_numpy(np.concatenate(tables)))
            if self.state.numel():
                self.state.copy_(torch.from_numpy(np.concatenate(states)))

    def shard_state(self) -> dict[str, torch.Tensor]:
        """Rank 0's file holds the tables (every rank has the same); the others hold nothing of them."""
        if self.comm.rank:
            return {}
        return {"weight": self.weight.detach().cpu().clone(), "state": self.state.cpu().clone()}

    def load_shard_state(self, own: dict, rank0: dict) -> None:
        with torch.no_grad():
            self.weight.copy_(rank0["weight"])
            self.state.copy_(rank0["state"])
