"""``device`` mode: every table in one fused tensor on the compute device (the GPU-only upper bound, and the
reference every other mode must equal), replicated on every rank of a distributed run."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.distributed.comm import Comm
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
from hotline.tiers.packing import PackRing
from hotline.tiers.replicated import update_replicas
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
        # Off the CPU the update runs as torch ops that find the distinct rows on the device by a sort and read
        # nothing back (SparseOptimizer.step_sorted): no host work per lookup, no wait for a torch.unique, as an
        # all-in-HBM trainer would do it (tests set it on CPU, too).
        self.device_updates = self.device.type != "cpu"
        # Off the CPU a step's ids (and distinct rows), dense inputs and labels go to the device in two
        # asynchronous copies from pinned packs, not five pageable ones that would each synchronise the
        # upper bound every mode is compared with (tests set it on CPU, too).
        self.pack_copies = self.device.type == "cuda"
        self._packs = PackRing(self.device)
        self.phases = None  # set to time phases on the device's clock (gpu_bench)
        self._steps = 0  # steps taken (tags the device-clock phases)

    def _phase(self, name: str):
        return (
            self.phases.phase(name, step=self._steps) if self.phases is not None else contextlib.nullcontext()
        )

    def _to_device(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        if self.pack_copies:
            return self._packs.copy(arrays)
        return {k: torch.from_numpy(a).to(self.device) for k, a in arrays.items()}

    def _lookups(self, sparse: np.ndarray) -> tuple[BagLayout, np.ndarray, np.ndarray | None]:
        """(bags, fused ids of the real lookups, their positions among the batch's id slots or None when no slot
        is padding)."""
        bags = bags_of(self.bags, self.layout, sparse)
        fused = bags.fuse(sparse)
        real = real_positions(fused) if bags.padded else None
        return bags, (fused if real is None else fused[real]), real

    def step(self, model: DLRM, batch: Batch) -> StepStats:
        B = batch.sparse.shape[0]
        t0 = time.perf_counter()
        bags, fused, pos = self._lookups(batch.sparse)
        arrays = {"ids": fused, "dense": batch.dense, "labels": batch.labels}
        if pos is not None:  # padded bags: where the real lookups stand among the batch's id slots
            arrays["pos"] = pos
        ix = self._to_device(arrays)
        ids = ix["ids"]
        t1 = time.perf_counter()
        loss = 0.0
        with self._phase("compute"):
            rows = padded_rows(self.weight, ids, ix.get("pos"), B * bags.num_columns)
            if B:  # a rank's shard of a global batch smaller than N may be empty: it still takes part below
                pooled = bag_pool(rows, bags)
                loss = loss_and_backward(model, ix["dense"], pooled, ix["labels"], batch.loss_normaliser)
        t2 = time.perf_counter()
        with self._phase("sparse_update"):
            grad = rows.grad if "pos" not in ix or rows.grad is None else rows.grad.index_select(0, ix["pos"])
            if self.comm.world_size > 1:  # off the CPU: nothing read back, the same bits on every replica
                touched = update_replicas(
                    self.comm, self.optimizer, self.weight, self.state, [ids] if B else [],
                    [grad] if B else [], "sparse_allgather", None, self.device_updates, self.scratch,
                )  # fmt: skip
            elif self.device_updates:  # the count of touched rows would be a read back: not counted
                self.optimizer.step_sorted(self.weight, self.state, ids, grad)
                touched = None
            else:
                touched = self.optimizer.step(self.weight, self.state, ids, grad, self.scratch)
        t3 = time.perf_counter()
        self._steps += 1
        return StepStats(
            loss_sum=step_loss(loss),
            samples=B,
            times={"gather": t1 - t0, "compute": t2 - t1, "sparse_update": t3 - t2},
            counters={} if touched is None else {"rows_touched": touched},
        )

    @torch.no_grad()
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        bags, ids, pos = self._lookups(sparse)
        ids_d = torch.from_numpy(ids).to(self.device)
        pos_d = None if pos is None else torch.from_numpy(pos).to(self.device)
        return bag_pool(
            padded_rows(self.weight, ids_d, pos_d, sparse.shape[0] * bags.num_columns).detach(), bags
        )

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
