"""Sparse optimizers for embedding rows: each touched row updated once with its summed gradient.

On CPU tensors the Numba kernels of ``hotline.kernels.sparse_update`` do the work (in place, through the
tensors' numpy views); on CUDA tensors the same arithmetic runs as torch ops on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hotline._malloc import huge_full, huge_zeros
from hotline.kernels import sparse_update
from hotline.table_layout import check_optimizer, state_floats_per_row


@dataclass(frozen=True)
class SparseOptimizer:
    """The update rule for embedding rows (and, by ``dense_optimizer``, the matching dense one)."""

    kind: str = "sgd"
    """``sgd``, ``rowwise-adagrad`` (FBGEMM's EXACT_ROWWISE_ADAGRAD: one state float per row), ``adagrad``
    (FBGEMM's ADAGRAD: one accumulator per element) or ``adam`` (FBGEMM's ADAM with row-wise bias correction:
    two moments per element and a step count per row)."""
    lr: float = 0.1
    """Learning rate, shared with the dense layers."""
    eps: float = 1e-8
    """Adagrad and Adam epsilon (dense and sparse)."""
    dim: int = 0
    """Embedding row width D (needed by the per-element optimizers, whose state is D or 2 D + 1 floats)."""
    beta1: float = 0.9
    """Adam's first-moment decay."""
    beta2: float = 0.999
    """Adam's second-moment decay."""
    iteration: int = 0
    """Adam's bias correction: 0 corrects each row by its own step count (row-wise, the training modes' rule);
    n > 0 corrects every row by step n (FBGEMM's ADAM, whose correction is its module's iteration: the torchrec
    collection sets it at every update)."""
    weight_decay: float = 0.0
    """Adam's L2 weight decay as FBGEMM's ADAM applies it, ``w -= lr * (m_hat / (sqrt(v_hat) + eps) +
    weight_decay * w)`` (the other optimizers have none: 0)."""

    def __post_init__(self) -> None:
        check_optimizer(self.kind, self.lr)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"Adam's betas must be in [0, 1), got {self.beta1} and {self.beta2}")
        if not isinstance(self.iteration, int) or self.iteration < 0:
            raise ValueError(
                f"Adam's iteration must be an int >= 0 (0: each row's own step count), got {self.iteration}"
            )
        if not 0 <= self.weight_decay < float("inf") or (self.weight_decay and self.kind != "adam"):
            raise ValueError(f"weight decay is Adam's (>= 0), got {self.weight_decay} for {self.kind}")
        state_floats_per_row(self.kind, self.dim)  # a per-element optimizer needs the dim

    def set_lr(self, lr: float) -> None:
        """Sets the learning rate of the next updates (the schedule's one change to this rule, between steps;
        every tier that shares this rule sees it)."""
        if not lr > 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        object.__setattr__(self, "lr", float(lr))

    @property
    def state_floats_per_row(self) -> int:
        """Optimizer state kept per embedding row (bytes per row = 4 * (dim + this))."""
        return state_floats_per_row(self.kind, self.dim)

    def state_shape(self, rows: int) -> tuple[int, ...]:
        """The state array of ``rows`` rows: ``(0,)`` for SGD, ``(rows,)`` for one float per row, else
        ``(rows, state_floats_per_row)`` (a row's state is then one row of the array, as its weights are)."""
        S = self.state_floats_per_row
        return (0,) if S == 0 else (rows,) if S == 1 else (rows, S)

    def new_scratch(self, rows: int, device: torch.device | str = "cpu") -> np.ndarray | None:
        """Reusable scratch for ``step`` on a table of ``rows`` rows (None where the device path needs none)."""
        if torch.device(device).type != "cpu":
            return None
        # sparse_update.new_scratch's array (all -1), in huge pages: the update reads it at random rows
        return huge_full(rows, -1, np.int32)

    def new_state(self, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Zero optimizer state for ``rows`` rows (shape :meth:`state_shape`; empty for SGD)."""
        if torch.device(device).type == "cpu":  # read and written at random rows: huge pages
            return torch.from_numpy(huge_zeros(self.state_shape(rows), np.float32))
        return torch.zeros(self.state_shape(rows), dtype=torch.float32, device=device)

    def dense_optimizer(self, params) -> torch.optim.Optimizer:
        """The dense-layer optimizer that matches this sparse rule (Adagrad for both Adagrads, Adam for Adam)."""
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr)
        if self.kind == "adam":
            return torch.optim.Adam(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps)
        return torch.optim.Adagrad(params, lr=self.lr, eps=self.eps)

    def step(
        self,
        table: torch.Tensor,
        state: torch.Tensor,
        ids: torch.Tensor,
        grads: torch.Tensor,
        scratch: np.ndarray | None = None,
    ) -> int:
        """Updates ``table`` (and ``state``) in place for the rows ``ids`` with per-lookup ``grads``.

        ``scratch`` (``new_scratch(table rows)``, kept by the caller) spares the CPU kernels an allocation."""
        if table.device.type == "cpu":
            t, i, g = table.detach().numpy(), ids.numpy(), grads.detach().contiguous().numpy()
            if self.kind == "sgd":
                return sparse_update.sparse_sgd_(t, i, g, self.lr, scratch)
            if self.kind == "adagrad":
                return sparse_update.sparse_adagrad_(t, state.numpy(), i, g, self.lr, self.eps, scratch)
            if self.kind == "adam":
                return sparse_update.sparse_adam_(
                    t,
                    state.numpy(),
                    i,
                    g,
                    self.lr,
                    self.beta1,
                    self.beta2,
                    self.eps,
                    scratch,
                    self.iteration,
                    self.weight_decay,
                )
            return sparse_update.sparse_rowwise_adagrad_(t, state.numpy(), i, g, self.lr, self.eps, scratch)
        return self._step_torch(table, state, ids, grads)

    def step_parts(self, table: torch.Tensor, state: torch.Tensor, parts: list, scratch: np.ndarray) -> int:
        """CPU: one update from gradients spread over several matrices, ``parts`` of ``(ids, grads, pos)`` numpy
        arrays (see ``sparse_update.sparse_update_parts_``), without concatenating them first."""
        return sparse_update.sparse_update_parts_(
            self.kind, table.detach().numpy(), state.numpy(), parts, self.lr, self.eps, scratch,
            beta1=self.beta1, beta2=self.beta2, iteration=self.iteration, weight_decay=self.weight_decay,
        )  # fmt: skip

    def step_sorted(
        self, table: torch.Tensor, state: torch.Tensor, ids: torch.Tensor, grads: torch.Tensor
    ) -> None:
        """The torch update with the distinct rows found where ``ids`` live, by a sort, and nothing read back
        on the host: on CUDA it queues without synchronising (``torch.unique`` waits for its count).

        The ``n`` lookups are sorted; the first of each run of equal ids numbers a distinct row (a cumulative
        sum), and the gradients are summed per distinct row in lookup order, as :meth:`step_coalesced` sums
        them. The update then runs over ``n`` slots, not the unknown count ``U``: slot ``k < U`` holds distinct
        row ``k`` and its summed gradient; a slot ``k >= U`` holds a row that is also among the first ``U`` and
        a zero gradient, which adds exactly zero to its weights and state (SGD, both Adagrads). Adam writes
        its state instead of adding to it: there every sorted lookup is a slot carrying its row's summed
        gradient, so the slots of one row compute and write the same values. Equal to :meth:`step_coalesced`
        fed with the distinct rows bit for bit on the CPU (tests/test_sparse_update.py)."""
        n = int(ids.shape[0])
        if n == 0:
            return
        sorted_ids, order = torch.sort(ids, stable=True)
        first = torch.ones(n, dtype=torch.bool, device=ids.device)
        torch.ne(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
        number = torch.cumsum(first, 0) - 1  # the distinct row of each sorted lookup, 0..U-1
        inverse = torch.empty_like(number).index_copy_(0, order, number)  # ... of each lookup
        gsum = torch.zeros((n, table.shape[1]), dtype=grads.dtype, device=grads.device)
        gsum.index_add_(0, inverse, grads)  # rows >= U stay zero
        if self.kind == "adam":
            self._adam_torch(table, state, sorted_ids, gsum.index_select(0, number), duplicates=True)
            return
        rows = sorted_ids.clone().index_copy_(0, number, sorted_ids)  # slots of one row write the same id
        self._apply_torch(table, state, rows, gsum)

    def _step_torch(self, table, state, ids, grads) -> int:
        rows, inverse = torch.unique(ids, return_inverse=True)  # synchronises on CUDA: see step_coalesced
        self.step_coalesced(table, state, rows, inverse, grads)
        return int(rows.shape[0])

    def step_coalesced(
        self,
        table: torch.Tensor,
        state: torch.Tensor,
        rows: torch.Tensor | None,
        inverse: torch.Tensor,
        grads: torch.Tensor,
        num_rows: int | None = None,
    ) -> None:
        """The torch update when the distinct rows are already known: ``rows`` [U] (unique) and ``inverse``
        (lookup -> index into ``rows``), computed on the host ahead of time. Nothing here needs a result back
        on the host, so on CUDA it queues without synchronising. ``rows=None`` means rows ``0..num_rows-1``
        (a working buffer, whose slots are already distinct)."""
        n = int(rows.shape[0]) if rows is not None else int(num_rows)
        gsum = torch.zeros((n, table.shape[1]), dtype=grads.dtype, device=grads.device)
        gsum.index_add_(0, inverse, grads)
        if rows is None:
            rows = torch.arange(n, device=table.device)
        self._apply_torch(table, state, rows, gsum)

    def _apply_torch(self, table, state, rows, gsum) -> None:
        """The update of rows ``rows`` by their summed gradients ``gsum`` (torch ops)."""
        if self.kind == "sgd":
            table.index_add_(0, rows, gsum, alpha=-self.lr)
        elif self.kind == "adagrad":  # at dim 1 the state is one float per row: [rows], not [rows, 1]
            state.index_add_(0, rows, (gsum * gsum).reshape(-1, *state.shape[1:]))
            acc = state.index_select(0, rows).reshape(gsum.shape)
            table.index_add_(0, rows, -self.lr * gsum / (acc.sqrt() + self.eps))
        elif self.kind == "adam":
            self._adam_torch(table, state, rows, gsum)
        else:
            state.index_add_(0, rows, gsum.pow(2).mean(dim=1))
            scale = self.lr / (state.index_select(0, rows).sqrt() + self.eps)
            table.index_add_(0, rows, -gsum * scale[:, None])

    def _adam_torch(self, table, state, rows, gsum, duplicates: bool = False) -> None:
        """FBGEMM's ADAM (row-wise bias correction) on distinct ``rows``, as the kernel's ``_adam_apply``.

        ``duplicates``: a row may stand in several slots, each with the same summed gradient (see
        :meth:`step_sorted`); the weights are then written (the same value from each slot), not added to."""
        D = table.shape[1]
        # 1 - beta in float32, as the kernel (and FBGEMM, from a float beta) has it: 1 - 0.999f != 0.001f
        a1, a2 = (float(np.float32(1) - np.float32(b)) for b in (self.beta1, self.beta2))
        old = state.index_select(0, rows)
        t = old[:, 2 * D] + 1  # the row's count (kept), and its bias correction unless an iteration is given
        tc = t if self.iteration == 0 else torch.full_like(t, float(self.iteration))
        m = self.beta1 * old[:, :D] + a1 * gsum
        v = self.beta2 * old[:, D : 2 * D] + a2 * gsum * gsum
        state.index_copy_(0, rows, torch.cat([m, v, t[:, None]], dim=1))
        # beta ** t from a tensor filled on the device: no host-to-device copy (a blocking one from pageable
        # memory) in every update
        c1 = 1 - torch.full_like(tc, self.beta1) ** tc
        c2 = 1 - torch.full_like(tc, self.beta2) ** tc
        if self.weight_decay:
            step = (m / c1[:, None]) / ((v / c2[:, None]).sqrt() + self.eps)
            delta = -self.lr * (step + self.weight_decay * table.index_select(0, rows))
        else:
            delta = -self.lr * (m / c1[:, None]) / ((v / c2[:, None]).sqrt() + self.eps)
        if duplicates:
            table.index_copy_(0, rows, table.index_select(0, rows) + delta)
        else:
            table.index_add_(0, rows, delta)
