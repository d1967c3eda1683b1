"""What every training mode shares: the ``TrainMode`` interface, step statistics, pooling and the loss.

A mode decides where embedding rows live and runs one exact mini-batch step: ``step(model, batch)``. Every
mode takes the same batches and the same dense model and must produce the same parameters as ``device``
(up to floating-point summation order); the tests compare them step by step. On N ranks a batch is this
rank's shard of the global mini-batch (``batch.loss_normaliser`` is the global size).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from hotline._malloc import huge_copy, huge_zeros
from hotline.datasets.format import Batch
from hotline.models.dlrm import DLRM, init_embedding_table
from hotline.table_layout import PAD_ID, BagLayout, TableLayout


class DeferredLoss:
    """A step's loss copied to pinned host memory on the side of the step (no synchronisation when the step is
    issued); ``float()`` waits for that copy alone, by when the step has long finished."""

    def __init__(self, loss: torch.Tensor):
        self.device_value = loss
        """The loss on its device (what a distributed step sums before anything reads it)."""
        self._host = torch.empty((), dtype=loss.dtype, pin_memory=loss.device.type == "cuda")
        self._host.copy_(loss, non_blocking=True)
        self._done = None
        if loss.device.type == "cuda":
            # On the stream of the loss's own device (the copy's stream), named: a bare record() would go on
            # the current device's stream, GPU 0's on a rank of another GPU, and float() would not wait.
            self._done = torch.cuda.Event()
            self._done.record(torch.cuda.current_stream(loss.device))

    def __float__(self) -> float:
        if self._done is not None:
            self._done.synchronize()
        return float(self._host)


def step_loss(loss) -> float | DeferredLoss:
    """The loss a step reports: a float on the CPU (free), a :class:`DeferredLoss` on a device."""
    if isinstance(loss, torch.Tensor) and loss.device.type != "cpu":
        return DeferredLoss(loss)
    return float(loss)


@dataclass
class StepStats:
    """What one training step did (summed into the report of each print interval)."""

    loss_sum: float | DeferredLoss = 0.0
    """Sum of the per-sample losses of the mini-batch (on a device: read it with ``float()``, late)."""
    samples: int = 0
    """Samples in the mini-batch."""
    times: dict[str, float] = field(default_factory=dict)
    """Seconds per phase (dispatch, gather, compute, optimizer, ...)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Counts: popular samples, working-set rows, bytes gathered, ..."""


def sum_pool(rows: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """Pooled embeddings [B, T, D] from looked-up rows [B*T*L, D] (sum over each bag of L lookups).

    One-hot (L = 1) is a view, not a sum: no copy forward, no expand backward."""
    D = rows.shape[1]
    return rows.view(-1, T, D) if L == 1 else rows.view(-1, T, L, D).sum(dim=2)


def bag_pool(rows: torch.Tensor, bags: BagLayout) -> torch.Tensor:
    """Pooled embeddings [B, T, D] from looked-up rows [B*C, D] laid out as ``bags`` (sum over each table's
    columns; a padding slot's row is zero, so only real ids count). Uniform bags take :func:`sum_pool`."""
    L = bags.pooling_factor
    if L:
        return sum_pool(rows, bags.layout.num_tables, L)
    x = rows.view(-1, bags.num_columns, rows.shape[1])
    return torch.stack([part.sum(dim=1) for part in x.split(bags.bag_sizes, dim=1)], dim=1)


def bags_of(bags: BagLayout | None, layout: TableLayout, sparse: np.ndarray) -> BagLayout:
    """A mode's bag layout, or (a mode built without one) the uniform layout of a ``[B, T, L]`` batch."""
    if bags is not None:
        return bags
    return BagLayout.uniform(layout, sparse.shape[2] if sparse.ndim == 3 else 1)


def real_positions(fused: np.ndarray) -> np.ndarray | None:
    """int64 positions of the lookups of fused ids that are not padding (None when none is padding)."""
    pad = fused == PAD_ID
    return np.flatnonzero(~pad) if pad.any() else None


def padded_rows(table: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor | None, n: int) -> torch.Tensor:
    """Rows [n, D] of ``table`` at ``ids`` placed at ``pos`` (every position when None), zero elsewhere (the
    padding slots); a leaf that takes the lookups' gradients."""
    if pos is None:
        return table.index_select(0, ids).requires_grad_(True)
    rows = torch.zeros((n, table.shape[1]), dtype=table.dtype, device=table.device)
    rows.index_copy_(0, pos, table.index_select(0, ids))
    return rows.requires_grad_(True)


_shared_tables: dict | None = None  # while reusing_initial_tables() is active: (sizes, dim, seed) -> array


@contextlib.contextmanager
def reusing_initial_tables():
    """Inside, every mode built for the same tables, dim and seed starts from one computed set of initial
    weights (each gets its own copy, which it updates): a benchmark of several modes computes them once."""
    global _shared_tables
    _shared_tables = {}
    try:
        yield
    finally:
        _shared_tables = None


def initial_tables(layout: TableLayout, dim: int, seed: int, copy: bool = True) -> np.ndarray:
    """The initial weights of every table (identical for every mode), fused: [num_rows, dim].

    Filled table by table into one array, so start-up holds the embedding once, not as parts plus a copy.
    ``copy=False`` (a caller that only copies them elsewhere, e.g. to a device): inside
    :func:`reusing_initial_tables` the shared array itself, which the caller must not write, instead of a
    host copy of it."""
    key = (tuple(layout.table_sizes), int(dim), int(seed))
    if _shared_tables is not None and key in _shared_tables:
        return huge_copy(_shared_tables[key]) if copy else _shared_tables[key]
    out = huge_zeros((layout.num_rows, dim), np.float32)  # looked up at random rows: huge pages
    for t, part in enumerate(layout.split(out)):
        part[:] = init_embedding_table(part.shape[0], dim, seed, t)
    if _shared_tables is not None:
        _shared_tables[key] = out.copy()
    return out


def loss_and_backward(
    model: DLRM, dense: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """Forward + backward of a (micro-)batch with the loss normalised over the whole mini-batch; returns the
    summed loss as a detached 0-d tensor (read it once per step: on CUDA each read waits for the device).

    Normalising by the full (global) mini-batch size, not the micro-batch's, is what makes the gradients of
    the popular and non-popular micro-batches, and of the ranks, add up to the gradient of the mini-batch.
    """
    logits = model(dense, pooled)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    (loss / batch_size).backward()
    return loss.detach()


class TrainMode(ABC):
    """A training mode: where embedding rows live, and one exact mini-batch step over them."""

    name: str
    layout: TableLayout

    @abstractmethod
    def step(self, model: DLRM, batch: Batch) -> StepStats:
        """Forward, backward and the sparse update of one batch (dense gradients left in ``model``)."""

    @abstractmethod
    def pooled_eval(self, sparse: np.ndarray) -> torch.Tensor:
        """Pooled embeddings [B, T, D] for evaluation (no gradient, no update; a collective on N ranks)."""

    @abstractmethod
    def export_tables(self) -> list[np.ndarray]:
        """Every table's current weights, in original row order (a collective on N ranks)."""

    @abstractmethod
    def export_state(self) -> list[np.ndarray]:
        """Every table's sparse optimizer state in original row order (empty arrays for SGD)."""

    def export_tables_and_state(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """:meth:`export_tables` and :meth:`export_state` together (a mode whose export gathers every row
        overrides it to gather once)."""
        return self.export_tables(), self.export_state()

    @abstractmethod
    def load_tables(self, tables: list[np.ndarray], states: list[np.ndarray]) -> None:
        """Replaces weights and optimizer state of every row (each rank keeps what it holds)."""

    @abstractmethod
    def shard_state(self) -> dict[str, torch.Tensor]:
        """What this rank's checkpoint file holds of the rows (N > 1; with one rank checkpoints hold tables)."""

    @abstractmethod
    def load_shard_state(self, own: dict, rank0: dict) -> None:
        """Restores :meth:`shard_state` from this rank's file and rank 0's."""

    def close(self) -> None:  # noqa: B027 - an optional hook, not an abstract verb
        """Releases threads and buffers (nothing by default)."""
