"""Training modes: where embedding rows live and how one exact mini-batch step runs.

Every mode takes the same batches and the same dense model and must produce the same parameters as
``device`` (up to floating-point summation order); the tests compare them step by step.

- ``device``: every table in one fused ``[rows, D]`` tensor on the compute device (the GPU-only upper bound,
  and the reference the other modes must equal).
- ``hybrid`` and ``hotline`` live in ``hotline.tiers`` / ``hotline.executor``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.model import DLRM, init_embedding_table
from hotline.sparse_optim import SparseOptimizer


@dataclass
class StepStats:
    """What one training step did (summed into the report of each print interval)."""

    loss_sum: float = 0.0
    """Sum of the per-sample losses of the mini-batch."""
    samples: int = 0
    """Samples in the mini-batch."""
    times: dict[str, float] = field(default_factory=dict)
    """Seconds per phase (dispatch, gather, compute, optimizer, ...)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Counts: popular samples, working-set rows, bytes gathered, ..."""


def table_offsets(table_sizes: list[int]) -> np.ndarray:
    """int64 [T]: where each table starts in the fused row space."""
    return np.concatenate([[0], np.cumsum(table_sizes[:-1], dtype=np.int64)]).astype(np.int64)


def sum_pool(rows: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """Pooled embeddings [B, T, D] from looked-up rows [B*T*L, D] (sum over each bag of L lookups).

    One-hot (L = 1) is a view, not a sum: no copy forward, no expand backward."""
    D = rows.shape[1]
    return rows.view(-1, T, D) if L == 1 else rows.view(-1, T, L, D).sum(dim=2)


def check_ids(sparse: np.ndarray, table_sizes: list[int]) -> None:
    """Raises IndexError naming the table and id if any id of ``sparse`` [B, T, L] is out of range."""
    sizes = np.asarray(table_sizes, dtype=np.int64)
    if sparse.ndim != 3 or sparse.shape[1] != sizes.size:
        raise ValueError(f"sparse ids must be [B, {sizes.size}, L], got shape {sparse.shape}")
    bad = (sparse < 0) | (sparse >= sizes[None, :, None])
    if bad.any():
        b, t, l = (int(x[0]) for x in np.nonzero(bad))
        raise IndexError(
            f"table {t}: id {int(sparse[b, t, l])} out of range [0, {table_sizes[t]}) (sample {b} of the batch)"
        )


def initial_tables(table_sizes: list[int], dim: int, seed: int) -> np.ndarray:
    """The initial weights of every table (identical for every mode), fused: [sum(table_sizes), dim].

    Filled table by table into one array, so start-up holds the embedding once, not as parts plus a copy."""
    out = np.empty((int(sum(table_sizes)), dim), dtype=np.float32)
    for t, (offset, n) in enumerate(zip(table_offsets(table_sizes), table_sizes)):
        out[offset : offset + n] = init_embedding_table(n, dim, seed, t)
    return out


class TrainMode:
    """Interface of a training mode; ``step`` runs forward, backward and the sparse update of one batch."""

    name = "base"

    def step(self, model: DLRM, batch: Batch) -> StepStats:
        raise NotImplementedError

    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        """Pooled embeddings [B, T, D] for evaluation (no gradient, no update)."""
        raise NotImplementedError

    def export_tables(self) -> list[np.ndarray]:
        """Every table's current weights, in original row order."""
        raise NotImplementedError

    def export_state(self) -> list[np.ndarray]:
        """Every table's sparse optimizer state in original row order (empty arrays for SGD)."""
        raise NotImplementedError

    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        """Replaces weights and optimizer state (from a checkpoint)."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases threads and buffers."""


def loss_and_backward(
    model: DLRM, dense: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """Forward + backward of a (micro-)batch with the loss normalised over the whole mini-batch; returns the
    summed loss as a detached 0-d tensor (read it once per step: on CUDA each read waits for the device).

    Normalising by the full mini-batch size, not the micro-batch's, is what makes the gradients of the
    popular and non-popular micro-batches add up to the gradient of the whole mini-batch.
    """
    logits = model(dense, pooled)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    (loss / batch_size).backward()
    return loss.detach()


class DeviceMode(TrainMode):
    """All tables in one fused tensor on the compute device: the reference every other mode must equal."""

    name = "device"

    def __init__(
        self,
        table_sizes: list[int],
        dim: int,
        optimizer: SparseOptimizer,
        seed: int,
        device: torch.device | str = "cpu",
    ):
        self.table_sizes = list(table_sizes)
        self.dim = dim
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.offsets = table_offsets(self.table_sizes)
        self.weight = torch.from_numpy(initial_tables(self.table_sizes, dim, seed)).to(self.device)
        self.state = optimizer.new_state(self.weight.shape[0], self.device)
        self.scratch = optimizer.new_scratch(self.weight.shape[0], self.device)

    def _fused_ids(self, sparse: np.ndarray) -> torch.Tensor:
        check_ids(sparse, self.table_sizes)
        fused = sparse.astype(np.int64) + self.offsets[None, :, None]
        return torch.from_numpy(fused.reshape(-1))

    def step(self, model: DLRM, batch: Batch) -> StepStats:
        B, T, L = batch.sparse.shape
        t0 = time.perf_counter()
        ids = self._fused_ids(batch.sparse).to(self.device)
        rows = self.weight.index_select(0, ids).requires_grad_(True)
        t1 = time.perf_counter()
        pooled = sum_pool(rows, T, L)
        dense = torch.from_numpy(batch.dense).to(self.device)
        labels = torch.from_numpy(batch.labels).to(self.device)
        loss = loss_and_backward(model, dense, pooled, labels, B)
        t2 = time.perf_counter()
        touched = self.optimizer.step(self.weight, self.state, ids, rows.grad, self.scratch)
        t3 = time.perf_counter()
        return StepStats(
            loss_sum=float(loss),
            samples=B,
            times={"gather": t1 - t0, "compute": t2 - t1, "sparse_update": t3 - t2},
            counters={"rows_touched": touched},
        )

    @torch.no_grad()
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        B, T, L = sparse.shape
        rows = self.weight.index_select(0, self._fused_ids(sparse).to(self.device))
        return sum_pool(rows, T, L)

    def export_tables(self) -> list[np.ndarray]:
        w = self.weight.detach().cpu().numpy()
        return [w[o : o + n].copy() for o, n in zip(self.offsets, self.table_sizes)]

    def export_state(self) -> list[np.ndarray]:
        s = self.state.cpu().numpy()
        if s.size == 0:
            return [np.zeros(0, np.float32) for _ in self.table_sizes]
        return [s[o : o + n].copy() for o, n in zip(self.offsets, self.table_sizes)]

    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        with torch.no_grad():
            self.weight.copy_(torch.from_numpy(np.concatenate(tables)))
            if self.state.numel():
                self.state.copy_(torch.from_numpy(np.concatenate(states)))
