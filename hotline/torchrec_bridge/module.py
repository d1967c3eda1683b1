"""``HotlineEmbeddingBagCollection``: a torchrec-compatible embedding-bag collection on Hotline's tiers.

It takes a ``KeyedJaggedTensor`` and returns a ``KeyedTensor`` like torchrec's ``EmbeddingBagCollection`` (sum
pooling over variable-length bags), so it drops into ``torchrec.models.dlrm.DLRM``. Underneath, rows live in
two tiers as in ``hotline.tiers``: the hot rows of a :class:`~hotline.placement.Placement` in one device tensor,
every row in host memory. Each forward

1. flattens the KJT's lookups of every feature (jagged: no padding) into fused row ids and bag ids;
2. splits them with the :class:`~hotline.dispatcher.Dispatcher` into hot lookups (hot slots) and cold
   lookups (slots of the working set: the unique cold rows of the batch);
3. gathers the working set from host memory, builds the looked-up rows as one leaf tensor and sums each bag.

Training: embedding rows are not ``nn.Parameter``s (a dense optimizer never sees them). After
``loss.backward()``, autograd has the gradient of every looked-up row; :meth:`sparse_step` applies the sparse
optimizer (``hotline.sparse_optim.SparseOptimizer``) once per touched row, to hot rows and working rows, and
writes the working rows back to host memory. With ``update_in_backward=True`` this happens inside
``backward()`` (a post-accumulate-grad hook), like torchrec's fused kernels::

    model = DLRM(embedding_bag_collection=HotlineEmbeddingBagCollection(configs, placement), ...)
    dense_opt = torch.optim.SGD(model.parameters(), lr=0.1)  # the dense layers only
    loss = loss_fn(model(dense, kjt), labels)
    loss.backward()
    dense_opt.step(); dense_opt.zero_grad()
    model.sparse_arch.embedding_bag_collection.sparse_step()  # the embedding rows

A training forward keeps its working set until :meth:`sparse_step`; another training forward whose
predecessor has gradients but was never stepped raises, so a forgotten update cannot pass silently.
Forwards under ``torch.no_grad()`` or in ``eval()`` mode keep nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(fbgemm_gpu|torchrec)(\.|$)")

from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType  # noqa: E402
from torchrec.modules.embedding_modules import (  # noqa: E402
    EmbeddingBagCollectionInterface,
    get_embedding_names_by_table,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor  # noqa: E402

from hotline.dispatch import Dispatcher  # noqa: E402
from hotline.models.dlrm import init_embedding_table  # noqa: E402
from hotline.placement import Placement  # noqa: E402
from hotline.table_layout import TableLayout  # noqa: E402
from hotline.tiers.cold_store import HostRows  # noqa: E402
from hotline.tiers.sparse_optim import SparseOptimizer  # noqa: E402


def kjt_from_sparse(sparse: np.ndarray, feature_names: Sequence[str]) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of a Hotline batch's ids ``[B, T, L]`` (every bag of length L), feature t = table t."""
    sparse = np.asarray(sparse)
    if sparse.ndim != 3 or sparse.shape[1] != len(feature_names):
        raise ValueError(f"sparse ids must be [B, {len(feature_names)}, L], got shape {sparse.shape}")
    B, T, L = sparse.shape
    values = torch.from_numpy(np.ascontiguousarray(sparse.transpose(1, 0, 2)).reshape(-1).astype(np.int64))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(feature_names), values=values, lengths=torch.full((T * B,), L, dtype=torch.int64)
    )


@dataclass
class _PendingStep:
    """What a training forward leaves for :meth:`HotlineEmbeddingBagCollection.sparse_step`."""

    rows: torch.Tensor  # [N, D] leaf: every looked-up row; autograd fills rows.grad
    hot_pos: torch.Tensor  # lookups that hit a hot row ...
    hot_slot: torch.Tensor  # ... and its hot slot
    cold_pos: torch.Tensor  # lookups of cold rows ...
    cold_slot: torch.Tensor  # ... and their slot in the working set
    working_set: np.ndarray  # fused row ids of the working rows
    work: torch.Tensor  # [U, D] working rows (updated in place, then written back)
    work_state: torch.Tensor  # [U] their optimizer state (empty for SGD)


class HotlineEmbeddingBagCollection(EmbeddingBagCollectionInterface):
    """A torchrec embedding-bag collection (KJT in, KeyedTensor out) whose rows live in Hotline's tiers.

    Args:
        tables: torchrec ``EmbeddingBagConfig`` per table (sum pooling, one embedding dim for all).
        placement: hot rows per table (``table_sizes`` must equal the tables' ``num_embeddings``).
        optimizer: sparse update rule of :meth:`sparse_step` (default SGD, lr 0.1).
        device: where the hot rows and the computation live (default cpu).
        weights: initial weights per table ([rows, D] arrays); default ``hotline.model.init_embedding_table``.
        seed: seed of the default initial weights.
        is_weighted: multiply each looked-up row by the KJT's per-value weight before summing.
        update_in_backward: apply :meth:`sparse_step` inside ``backward()``.
        max_lookups: lookups per batch to size the dispatcher for (it grows when a batch needs more).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        placement: Placement,
        optimizer: SparseOptimizer | None = None,
        device: torch.device | str | None = None,
        weights: Sequence[np.ndarray] | None = None,
        seed: int = 0,
        is_weighted: bool = False,
        update_in_backward: bool = False,
        max_lookups: int = 1 << 16,
    ):
        super().__init__()
        tables = list(tables)
        if not tables:
            raise ValueError("tables must hold at least one EmbeddingBagConfig")
        dims = {t.embedding_dim for t in tables}
        if len(dims) != 1:
            raise ValueError(f"every table must have the same embedding_dim, got {sorted(dims)}")
        for t in tables:
            if t.pooling != PoolingType.SUM:
                raise ValueError(f"table {t.name}: only sum pooling is supported, got {t.pooling}")
            if not t.feature_names:
                t.feature_names = [t.name]
        sizes = [int(t.num_embeddings) for t in tables]
        if placement.table_sizes != sizes:
            raise ValueError(
                f"placement has table sizes {placement.table_sizes}, the tables have num_embeddings {sizes}"
            )
        self.dim = dims.pop()
        if placement.embedding_dim != self.dim:
            raise ValueError(
                f"placement was made for embedding dim {placement.embedding_dim}, the tables have {self.dim}"
            )
        self._configs = tables
        self._is_weighted = bool(is_weighted)
        self.placement = placement
        self.optimizer = optimizer or SparseOptimizer("sgd", lr=0.1)
        self.update_in_backward = bool(update_in_backward)
        device = torch.device(device or "cpu")
        self.table_sizes = sizes
        self.layout = TableLayout(sizes)
        self.offsets = self.layout.offsets
        # (table, feature, output name) per output slot, in torchrec's order
        names = get_embedding_names_by_table(tables)
        self._slots = [
            (t, f, names[t][i]) for t, cfg in enumerate(tables) for i, f in enumerate(cfg.feature_names)
        ]
        self._embedding_names = [s[2] for s in self._slots]

        if weights is None:
            weights = [init_embedding_table(n, self.dim, seed, t) for t, n in enumerate(sizes)]
        if len(weights) != len(sizes):
            raise ValueError(f"{len(weights)} weight arrays for {len(sizes)} tables")
        for t, (w, n) in enumerate(zip(weights, sizes)):
            if np.shape(w) != (n, self.dim):
                raise ValueError(
                    f"weights of table {tables[t].name} must be [{n}, {self.dim}], got {np.shape(w)}"
                )
        fused = np.ascontiguousarray(np.concatenate([np.asarray(w, dtype=np.float32) for w in weights]))
        self.cold = HostRows(fused, self.optimizer, pin=device.type == "cuda")
        self.hot_rows = self.layout.fuse_rows(placement.hot_ids)
        # Non-persistent: the rows of a model are exported with export_tables(), cold rows are not module state.
        self.register_buffer(
            "hot_weight", torch.from_numpy(self.cold.w[self.hot_rows]).to(device), persistent=False
        )
        state = self.cold.s[self.hot_rows] if self.cold.s.size else np.zeros(0, np.float32)
        self.register_buffer("hot_state", torch.from_numpy(state).to(device), persistent=False)
        # One fused table for the dispatcher: each lookup is a one-lookup "sample", so jagged bags need no padding.
        self._lookup_placement = Placement.from_hot_ids(
            [int(sum(sizes))], [self.hot_rows], embedding_dim=self.dim, bytes_per_row=placement.bytes_per_row
        )
        self._capacity = max(1, int(max_lookups))
        self._dispatcher = Dispatcher(self._lookup_placement, 1, self._capacity)
        self._pending: _PendingStep | None = None
        self.last_stats: dict[str, int] = {}
        """Figures of the last forward: lookups, hot_lookups, working_set_rows, popular_samples, samples."""

    # ------------------------------------------------------------------ torchrec interface
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def device(self) -> torch.device:
        return self.hot_weight.device

    @classmethod
    def from_embedding_bag_collection(
        cls, ebc, placement: Placement, **kwargs
    ) -> HotlineEmbeddingBagCollection:
        """The same tables and current weights as a torchrec ``EmbeddingBagCollection``."""
        configs = ebc.embedding_bag_configs()
        weights = [ebc.embedding_bags[c.name].weight.detach().cpu().numpy() for c in configs]
        kwargs.setdefault("is_weighted", ebc.is_weighted())
        return cls(configs, placement, weights=weights, **kwargs)

    # ------------------------------------------------------------------ forward
    def _lookups(self, features: KeyedJaggedTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """Fused row ids, bag ids (slot * B + sample) and per-lookup weights of every output slot."""
        if features.variable_stride_per_key():
            raise ValueError("KeyedJaggedTensor with a variable batch size per key is not supported")
        B = int(features.stride())
        keys = features.keys()
        index = {k: i for i, k in enumerate(keys)}
        lengths = features.lengths().detach().cpu().numpy().astype(np.int64).reshape(len(keys), B)
        values = features.values().detach().cpu().numpy()
        offsets = features.offset_per_key()
        kjt_weights = features.weights_or_none()
        if self._is_weighted and kjt_weights is None:
            raise ValueError("this collection is weighted but the KeyedJaggedTensor has no weights")
        w_all = kjt_weights.detach().cpu().numpy() if self._is_weighted else None
        ids, bags, ws = [], [], []
        for j, (t, f, _) in enumerate(self._slots):
            if f not in index:
                raise KeyError(
                    f"feature {f!r} (table {self._configs[t].name}) is not among the KJT's keys {keys}"
                )
            k = index[f]
            v = values[offsets[k] : offsets[k + 1]].astype(np.int64)
            if v.size and (v.min() < 0 or v.max() >= self.table_sizes[t]):
                bad = int(v[(v < 0) | (v >= self.table_sizes[t])][0])
                raise IndexError(
                    f"feature {f!r}: id {bad} out of range [0, {self.table_sizes[t]}) of table {self._configs[t].name}"
                )
            ids.append(v + self.offsets[t])
            bags.append(j * B + np.repeat(np.arange(B, dtype=np.int64), lengths[k]))
            if w_all is not None:
                ws.append(w_all[offsets[k] : offsets[k + 1]])
        cat = np.concatenate
        return cat(ids), cat(bags), (cat(ws) if w_all is not None else None), B

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pooled embeddings [B, F * D] of every feature (KeyedTensor keyed by embedding name)."""
        dev, D = self.device, self.dim
        training = self.training and torch.is_grad_enabled()
        if training and self._pending is not None and self._pending.rows.grad is not None:
            raise RuntimeError(
                "the previous training step's gradients were never applied: call sparse_step() after backward()"
            )
        ids, bags, weights, B = self._lookups(features)
        N = ids.shape[0]
        if N > self._capacity:
            self._capacity = max(N, 2 * self._capacity)
            self._dispatcher = Dispatcher(self._lookup_placement, 1, self._capacity)
        micro = self._dispatcher.split(ids.reshape(N, 1, 1))

        # The dispatcher's arrays are ring buffers reused by the next split: copy what the step keeps.
        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(a, dtype=np.int64, copy=True)).to(dev)

        hot_pos, hot_slot = tensor(micro.popular_samples), tensor(micro.pop_ids)
        cold_pos, cold_slot = tensor(micro.non_popular_samples), tensor(micro.cold_slot)
        working_set = np.array(micro.working_set, copy=True)
        U = working_set.shape[0]
        w_np, s_np = self.cold.gather(
            working_set, np.empty((U, D), np.float32), np.empty(self.optimizer.state_shape(U), np.float32)
        )
        work = torch.from_numpy(w_np).to(dev)
        work_state = torch.from_numpy(s_np).to(dev)

        rows = torch.empty((N, D), dtype=torch.float32, device=dev)
        rows[hot_pos] = self.hot_weight.index_select(0, hot_slot)
        rows[cold_pos] = work.index_select(0, cold_slot)
        if training:
            rows.requires_grad_(True)
            self._pending = _PendingStep(
                rows, hot_pos, hot_slot, cold_pos, cold_slot, working_set, work, work_state
            )
            if self.update_in_backward:
                rows.register_post_accumulate_grad_hook(self._update_in_backward)
        contrib = (
            rows if weights is None else rows * torch.from_numpy(weights).to(dev, torch.float32)[:, None]
        )
        F = len(self._slots)
        pooled = torch.zeros((F * B, D), dtype=torch.float32, device=dev).index_add(
            0, torch.from_numpy(bags).to(dev), contrib
        )
        values = pooled.view(F, B, D).transpose(0, 1).reshape(B, F * D)
        cold_samples = np.unique(bags[micro.non_popular_samples] % B) if B else np.zeros(0)
        self.last_stats = {
            "samples": B,
            "lookups": N,
            "hot_lookups": int(micro.num_popular),
            "working_set_rows": U,
            "popular_samples": B - int(cold_samples.shape[0]),
        }
        return KeyedTensor(keys=list(self._embedding_names), length_per_key=[D] * F, values=values, key_dim=1)

    # ------------------------------------------------------------------ update
    def _update_in_backward(self, rows: torch.Tensor) -> None:
        self.sparse_step()  # a post-accumulate-grad hook must return None

    @torch.no_grad()
    def sparse_step(self) -> int:
        """Applies the sparse optimizer to the rows the last training forward looked up (each touched row
        once, duplicate lookups summed) and writes the working rows back to host memory; returns the number
        of rows updated (0 if there is no pending step). Call it after ``loss.backward()``."""
        p = self._pending
        if p is None:
            return 0
        if p.rows.grad is None:
            raise RuntimeError(
                "sparse_step() needs gradients: call loss.backward() after the training forward"
            )
        g = p.rows.grad
        touched = 0
        if p.hot_pos.numel():
            touched += self.optimizer.step(
                self.hot_weight, self.hot_state, p.hot_slot, g.index_select(0, p.hot_pos)
            )
        if p.cold_pos.numel():
            touched += self.optimizer.step(p.work, p.work_state, p.cold_slot, g.index_select(0, p.cold_pos))
            self.cold.scatter(p.working_set, p.work.cpu().numpy(), p.work_state.cpu().numpy())
        self._pending = None
        return touched

    # ------------------------------------------------------------------ weights
    def export_tables(self) -> dict[str, np.ndarray]:
        """Every table's current weights (hot rows from the device), by table name, in original row order."""
        w = self.cold.w.copy()
        if self.hot_rows.size:
            w[self.hot_rows] = self.hot_weight.detach().cpu().numpy()
        return {c.name: w[o : o + n] for c, o, n in zip(self._configs, self.offsets, self.table_sizes)}

    @torch.no_grad()
    def load_tables(self, tables: dict[str, np.ndarray]) -> None:
        """Sets every table's weights (by table name) in both tiers."""
        for c, o, n in zip(self._configs, self.offsets, self.table_sizes):
            if c.name not in tables or np.shape(tables[c.name]) != (n, self.dim):
                raise ValueError(f"load_tables: table {c.name} needs a [{n}, {self.dim}] array")
            self.cold.w[o : o + n] = tables[c.name]
        self.hot_weight.copy_(torch.from_numpy(self.cold.w[self.hot_rows]))
