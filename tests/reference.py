"""An independent DLRM for the tests: plain PyTorch, written from the definitions, sharing NO code with Hotline.

It reads a dataset directory's ``.npy`` arrays directly (``{split}_dense/sparse/labels.npy``) and a parameter
``.npz`` with the names ``hotline train --dump-params`` / ``--dump-init`` write (``model.<name>``,
``embedding.table_<t>``), and trains on the same batches in the same order:

- embedding bags: ``table[ids]`` summed over each bag of L lookups;
- bottom MLP: Linear + ReLU after every layer; top MLP: Linear + ReLU after every layer but the last;
- interaction ``dot``: the dense output, then the pairwise dot products ``<f_i, f_j>`` for i > j of the
  F = T + 1 features (i the slower index, as DLRM's strictly lower triangle); ``cat``: the features concatenated;
  ``dcn`` (DCN-v2, as the DCN-v2 paper and torchrec's LowRankCrossNet define it): x0 = the features concatenated
  [B, F*D], then per cross layer l ``x <- x0 * ((x V_l^T) W_l^T + b_l) + x`` (W_l [F*D, r], V_l [r, F*D]),
  the top MLP on the last x;
- loss: the SUM of the per-sample binary cross-entropies (written out, from the logit) divided by the mini-batch
  size; batches of ``batch_size`` in file order, epoch after epoch, the last of an epoch possibly short;
- SGD: ``p -= lr * g`` (dense parameters and every row a batch looked up);
- row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) for embedding rows, per row looked up in the batch with its
  summed gradient g [D]: ``state += mean(g^2)``; ``row -= lr * g / (sqrt(state) + eps)``; dense parameters get
  element-wise Adagrad: ``state += g^2``; ``p -= lr * g / (sqrt(state) + eps)``;
- Adagrad (FBGEMM's ADAGRAD) for embedding rows: the same element-wise rule on each looked-up row's summed
  gradient; dense parameters as with row-wise Adagrad;
- Adam (FBGEMM's ADAM with row-wise bias correction) for embedding rows: each looked-up row counts its own
  updates t, then per element (b1, b2 rounded to float32 as FBGEMM takes them) ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
  ``row -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``; dense parameters: Adam with the global step t
  as torch.optim.Adam writes it, ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

EPS = 1e-8
BETA1, BETA2 = 0.9, 0.999  # dense Adam's (torch.optim.Adam takes them as Python floats)
# FBGEMM takes the betas as float32: 1 - 0.999f = 0.00100005, not 0.001 (the rows' Adam uses these)
ROW_BETA1, ROW_BETA2 = float(np.float32(BETA1)), float(np.float32(BETA2))


def read_split(dataset_dir, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dense [N, 13] float32, sparse [N, T, L] int, labels [N] float32 of one split, read from the .npy files."""
    d = Path(dataset_dir)
    return tuple(np.load(d / f"{split}_{k}.npy", allow_pickle=False) for k in ("dense", "sparse", "labels"))


def read_params(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: np.array(z[k]) for k in z.files}


def random_params(table_sizes, dim: int, bottom: list[int], top: list[int], interaction: str, seed: int,
                  dcn_layers: int = 2, dcn_rank: int = 6):  # fmt: skip
    """Initial parameters drawn here (not by Hotline), named as ``--dump-params`` names them. The cross net's
    biases are drawn too (torchrec starts them at zero), so that the test sees them used."""
    rng = np.random.default_rng(seed)
    F = len(table_sizes) + 1
    width = F * (F - 1) // 2 + dim if interaction == "dot" else F * dim
    out = {}
    if interaction == "dcn":
        N = F * dim
        for layer in range(dcn_layers):
            std = math.sqrt(2 / (N + dcn_rank))
            out[f"model.inter_arch.crossnet.W_kernels.{layer}"] = rng.normal(0, std, (N, dcn_rank))
            out[f"model.inter_arch.crossnet.V_kernels.{layer}"] = rng.normal(0, std, (dcn_rank, N))
            out[f"model.inter_arch.crossnet.bias.{layer}"] = rng.normal(0, 0.1, N)
    for prefix, sizes in (("dense_arch", bottom), ("over_arch", [width, *top])):
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            out[f"model.{prefix}.mlp.{2 * i}.weight"] = rng.normal(
                0, math.sqrt(2 / (n_in + n_out)), (n_out, n_in)
            )
            out[f"model.{prefix}.mlp.{2 * i}.bias"] = rng.normal(0, math.sqrt(1 / n_out), n_out)
    for t, n in enumerate(table_sizes):
        out[f"embedding.table_{t}"] = rng.uniform(-1 / math.sqrt(n), 1 / math.sqrt(n), (n, dim))
    return {k: v.astype(np.float32) for k, v in out.items()}


def _layers(
    params: dict[str, np.ndarray], prefix: str, dtype: torch.dtype
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pattern = re.compile(rf"^model\.{prefix}\.mlp\.(\d+)\.weight$")
    idx = sorted(int(m.group(1)) for k in params if (m := pattern.match(k)))
    return [
        (
            torch.tensor(params[f"model.{prefix}.mlp.{i}.weight"], dtype=dtype),
            torch.tensor(params[f"model.{prefix}.mlp.{i}.bias"], dtype=dtype),
        )
        for i in idx
    ]


class ReferenceDLRM:
    """DLRM with its own tables, MLPs and optimizers (see the module docstring).

    ``dtype=torch.float64`` trains the same maths in double precision: the float32 run's distance from it is the
    rounding noise of float32 on this CPU (:func:`noise_bound`)."""

    def __init__(
        self,
        params: dict[str, np.ndarray],
        interaction: str,
        optimizer: str,
        lr: float,
        bag_sizes=None,
        dtype: torch.dtype = torch.float32,
    ):
        assert interaction in ("dot", "cat", "dcn")
        assert optimizer in ("sgd", "rowwise-adagrad", "adagrad", "adam")
        self.interaction, self.optimizer, self.lr, self.dtype = interaction, optimizer, lr, dtype
        # bag_sizes: ids come as [N, C], table t's bag in its own L_t columns, -1 an empty slot (no lookup)
        self.bag_sizes = bag_sizes
        self.bottom = _layers(params, "dense_arch", dtype)
        self.top = _layers(params, "over_arch", dtype)
        self.cross = []  # (W, V, b) per cross layer
        while interaction == "dcn" and f"model.inter_arch.crossnet.W_kernels.{len(self.cross)}" in params:
            self.cross.append(
                tuple(
                    torch.tensor(params[f"model.inter_arch.crossnet.{name}.{len(self.cross)}"], dtype=dtype)
                    for name in ("W_kernels", "V_kernels", "bias")
                )
            )
        assert (interaction == "dcn") == bool(self.cross), "dcn needs cross layers, dot and cat have none"
        T = sum(1 for k in params if k.startswith("embedding.table_"))
        self.tables = [torch.tensor(params[f"embedding.table_{t}"], dtype=dtype) for t in range(T)]
        self.dense_params = [p for layer in self.bottom + self.cross + self.top for p in layer]
        self.dense_state = [torch.zeros_like(p) for p in self.dense_params]
        self.dense_m = [torch.zeros_like(p) for p in self.dense_params]  # Adam's first moments
        self.steps = 0
        self.row_state = [torch.zeros(t.shape[0], dtype=dtype) for t in self.tables]
        self.elem_state = [torch.zeros_like(t) for t in self.tables]  # Adagrad's accumulators, Adam's v
        self.row_m = [torch.zeros_like(t) for t in self.tables]  # Adam's m
        self.row_t = [
            torch.zeros(t.shape[0], dtype=dtype) for t in self.tables
        ]  # Adam's per-row update count

    # -- the model ----------------------------------------------------------------------------------------
    def logits(self, dense: torch.Tensor, sparse: np.ndarray, tables: list[torch.Tensor]) -> torch.Tensor:
        x = dense
        for w, b in self.bottom:
            x = torch.relu(x @ w.T + b)
        features = [x]
        for t, table in enumerate(tables):
            ids = torch.from_numpy(self.bag(sparse, t))  # [B, L]
            real = (ids >= 0).unsqueeze(2)
            bags = torch.where(real, table[ids.clamp(min=0)], torch.zeros(()))  # [B, L, D], empty slots zero
            features.append(bags.sum(dim=1))
        if self.interaction == "cat":
            z = torch.cat(features, dim=1)
        elif self.interaction == "dcn":
            x0 = z = torch.cat(features, dim=1)
            for w, v, b in self.cross:
                z = x0 * ((z @ v.T) @ w.T + b) + z
        else:
            pairs = [(features[i] * features[j]).sum(dim=1) for i in range(len(features)) for j in range(i)]
            z = torch.cat([x, torch.stack(pairs, dim=1)], dim=1)
        for k, (w, b) in enumerate(self.top):
            z = z @ w.T + b
            if k < len(self.top) - 1:
                z = torch.relu(z)
        return z[:, 0]

    def bag(self, sparse: np.ndarray, t: int) -> np.ndarray:
        """int64 [B, L] ids of table t's bags (-1: an empty slot)."""
        if self.bag_sizes is None:
            return np.asarray(sparse[:, t, :], np.int64)
        start = sum(self.bag_sizes[:t])
        return np.asarray(sparse[:, start : start + self.bag_sizes[t]], np.int64)

    @staticmethod
    def bce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """sum over samples of -(y log s(z) + (1 - y) log(1 - s(z))), in the overflow-safe form."""
        return (logits.clamp(min=0) - logits * labels + torch.log1p(torch.exp(-logits.abs()))).sum()

    # -- training -----------------------------------------------------------------------------------------
    def step(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> float:
        """One mini-batch: loss = sum BCE / batch size, backward, one optimizer step; returns the summed loss."""
        for p in self.dense_params:
            p.requires_grad_(True)
            p.grad = None
        tables = [t.clone().requires_grad_(True) for t in self.tables]
        y = torch.as_tensor(np.asarray(labels), dtype=self.dtype)
        loss = self.bce_sum(
            self.logits(torch.as_tensor(np.asarray(dense), dtype=self.dtype), sparse, tables), y
        )
        (loss / len(labels)).backward()
        self.steps += 1
        with torch.no_grad():
            for p, state, m in zip(self.dense_params, self.dense_state, self.dense_m):
                g = p.grad
                if self.optimizer == "sgd":
                    p -= self.lr * g
                elif self.optimizer == "adam":
                    m.mul_(BETA1).add_((1 - BETA1) * g)
                    state.mul_(BETA2).add_((1 - BETA2) * g * g)
                    c1, c2 = 1 - BETA1**self.steps, 1 - BETA2**self.steps
                    p -= self.lr / c1 * m / (state.sqrt() / math.sqrt(c2) + EPS)
                else:
                    state += g * g
                    p -= self.lr * g / (state.sqrt() + EPS)
                p.grad = None
            for t, (table, copy) in enumerate(zip(self.tables, tables)):
                ids = self.bag(sparse, t)
                rows = torch.from_numpy(np.unique(ids[ids >= 0]))
                g = copy.grad[rows]  # each looked-up row's gradient, summed over its lookups
                if self.optimizer == "sgd":
                    table[rows] -= self.lr * g
                elif self.optimizer == "adagrad":
                    self.elem_state[t][rows] += g * g
                    table[rows] -= self.lr * g / (self.elem_state[t][rows].sqrt() + EPS)
                elif self.optimizer == "adam":
                    self.row_t[t][rows] += 1
                    step = self.row_t[t][rows][:, None]
                    b1, b2 = ROW_BETA1, ROW_BETA2
                    self.row_m[t][rows] = b1 * self.row_m[t][rows] + (1 - b1) * g
                    self.elem_state[t][rows] = b2 * self.elem_state[t][rows] + (1 - b2) * g * g
                    m_hat = self.row_m[t][rows] / (1 - b1**step)
                    v_hat = self.elem_state[t][rows] / (1 - b2**step)
                    table[rows] -= self.lr * m_hat / (v_hat.sqrt() + EPS)
                else:
                    self.row_state[t][rows] += (g * g).mean(dim=1)
                    table[rows] -= self.lr * g / (self.row_state[t][rows].sqrt()[:, None] + EPS)
        for p in self.dense_params:
            p.requires_grad_(False)
        return float(loss.detach())

    def train(
        self,
        dataset_dir,
        batch_size: int,
        nepochs: int = 1,
        num_batches: int = 0,
        order_seed: int | None = None,
    ) -> list[float]:
        """Trains over the train split in file order; returns each step's summed loss.

        ``order_seed``: the samples of each mini-batch in a seeded random order. The maths is the same (every
        sum over a batch is order-free in exact arithmetic); only the float rounding differs."""
        dense, sparse, labels = read_split(dataset_dir, "train")
        n, losses = len(labels), []
        rng = np.random.default_rng(order_seed)
        for _ in range(nepochs):
            for start in range(0, n, batch_size):
                if num_batches and len(losses) == num_batches:
                    return losses
                rows = np.arange(start, min(start + batch_size, n))
                if order_seed is not None:
                    rows = rng.permutation(rows)
                losses.append(self.step(dense[rows], sparse[rows], labels[rows]))
        return losses

    @torch.no_grad()
    def predict(self, dataset_dir, split: str) -> tuple[np.ndarray, np.ndarray]:
        dense, sparse, labels = read_split(dataset_dir, split)
        z = self.logits(torch.as_tensor(np.asarray(dense), dtype=self.dtype), sparse, self.tables)
        return torch.sigmoid(z).numpy(), np.asarray(labels)

    def named_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for prefix, layers in (("dense_arch", self.bottom), ("over_arch", self.top)):
            for i, (w, b) in enumerate(layers):
                out[f"model.{prefix}.mlp.{2 * i}.weight"] = w.numpy().copy()
                out[f"model.{prefix}.mlp.{2 * i}.bias"] = b.numpy().copy()
        for layer, params in enumerate(self.cross):
            for name, p in zip(("W_kernels", "V_kernels", "bias"), params):
                out[f"model.inter_arch.crossnet.{name}.{layer}"] = p.numpy().copy()
        for t, table in enumerate(self.tables):
            out[f"embedding.table_{t}"] = table.numpy().copy()
        return out


def max_rel_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest max|a - b| / max|a| over the tensors of two parameter sets (and its tensor's name)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    worst, name = 0.0, ""
    for k, x in a.items():
        d = float(np.abs(np.asarray(b[k], np.float64) - x).max()) / max(float(np.abs(x).max()), 1e-12)
        if d > worst:
            worst, name = d, k
    return worst, name


# -- the float32 noise floor ------------------------------------------------------------------------------
NOISE_FACTOR = 4.0
"""How far a float32 run may stand from the float64 run of the same maths, in units of the noise floor.

The noise floor is the largest distance from the float64 run among float32 runs of the reference that differ
only in rounding order (each mini-batch's samples permuted: :data:`NOISE_ORDERS` orders and file order).
Another float32 implementation (Hotline, another BLAS code path, another CPU) rounds in yet another order.
Training amplifies rounding chaotically (row-wise Adagrad divides by the root of tiny accumulated squares),
so one order's distance is a sample of a heavy-tailed spread: over the cases of tests/test_reference.py with
ATEN_CPU_CAPABILITY avx2 / avx512 / default and MKL_CBWR=COMPATIBLE, Hotline's runs stood at most 2x the floor.
4x leaves room for a CPU not measured; a real error (a missed update, a stale row) is orders of magnitude
larger."""
NOISE_ORDERS = 4
"""Permuted-batch float32 runs behind a noise floor (besides the run in file order)."""


@dataclass
class NoiseFloor:
    """The float64 reference run and the float32 rounding spread around it (:func:`noise_floor`)."""

    losses: np.ndarray
    """The float64 run's per-step summed losses."""
    params: dict[str, np.ndarray]
    """The float64 run's parameters after training."""
    probs: np.ndarray
    """The float64 run's predictions of the ``predict_split`` after training."""
    param_floor: float
    """The largest :func:`max_rel_diff` of a float32 run's parameters from the float64 run's."""
    loss_floor: float
    """The largest relative difference of a float32 run's per-step loss from the float64 run's."""
    prob_floor: float
    """The largest absolute difference of a float32 run's prediction from the float64 run's."""

    def check(self, losses, params: dict[str, np.ndarray], probs=None, what: str = "") -> None:
        """Asserts a float32 run (losses, parameters, predictions; ``None`` for one not kept) stands within
        :data:`NOISE_FACTOR` floors of the float64 run, naming the worst tensor."""
        err, where = max_rel_diff(self.params, {k: params[k] for k in self.params})
        bound = NOISE_FACTOR * self.param_floor
        assert err <= bound, (
            f"{what}: {where} differs from the float64 reference by {err:.2e} of its scale, more than "
            f"{NOISE_FACTOR:g} x the float32 noise floor {self.param_floor:.2e}"
        )
        if losses is None:
            return self._check_probs(probs, what)
        losses = np.asarray(losses, np.float64)
        assert losses.shape == self.losses.shape, (what, losses.shape, self.losses.shape)
        loss_err = float(np.max(np.abs(losses - self.losses) / np.abs(self.losses)))
        assert loss_err <= NOISE_FACTOR * self.loss_floor, (
            f"{what}: a step's loss differs from the float64 reference by {loss_err:.2e} (relative), more than "
            f"{NOISE_FACTOR:g} x the float32 noise floor {self.loss_floor:.2e}"
        )
        self._check_probs(probs, what)

    def _check_probs(self, probs, what: str) -> None:
        if probs is not None:
            prob_err = float(np.max(np.abs(np.asarray(probs, np.float64) - self.probs)))
            assert prob_err <= NOISE_FACTOR * self.prob_floor, (
                f"{what}: a prediction differs from the float64 reference by {prob_err:.2e}, more than "
                f"{NOISE_FACTOR:g} x the float32 noise floor {self.prob_floor:.2e}"
            )


def noise_floor(
    params: dict[str, np.ndarray],
    interaction: str,
    optimizer: str,
    lr: float,
    dataset_dir,
    batch_size: int,
    nepochs: int = 1,
    num_batches: int = 0,
    predict_split: str = "val",
    **kw,
) -> NoiseFloor:
    """Trains the reference in float64 and in float32 in 1 + :data:`NOISE_ORDERS` rounding orders; returns the
    float64 run and how far the float32 runs stood from it (each floor at least float32's epsilon)."""
    exact = ReferenceDLRM(params, interaction, optimizer, lr, dtype=torch.float64, **kw)
    losses = np.array(exact.train(dataset_dir, batch_size, nepochs, num_batches))
    out = NoiseFloor(
        losses, exact.named_arrays(), exact.predict(dataset_dir, predict_split)[0], 0.0, 0.0, 0.0
    )
    eps = float(np.finfo(np.float32).eps)
    out.param_floor = out.loss_floor = out.prob_floor = eps
    for order in (None, *range(NOISE_ORDERS)):
        run = ReferenceDLRM(params, interaction, optimizer, lr, **kw)
        got = np.array(run.train(dataset_dir, batch_size, nepochs, num_batches, order_seed=order))
        out.param_floor = max(out.param_floor, max_rel_diff(out.params, run.named_arrays())[0])
        out.loss_floor = max(out.loss_floor, float(np.max(np.abs(got - losses) / np.abs(losses))))
        probs = run.predict(dataset_dir, predict_split)[0]
        out.prob_floor = max(out.prob_floor, float(np.max(np.abs(probs - out.probs))))
    return out
