"""``HotlineEmbeddingBagCollection``: a torchrec embedding-bag collection whose rows live in Hotline's tiers.

It takes a ``KeyedJaggedTensor`` and returns a ``KeyedTensor`` like torchrec's ``EmbeddingBagCollection`` (sum
or mean pooling over jagged bags, per-value weights, several features on one table, a dim per table), and it
is built and trained like torchrec's ``FusedEmbeddingBagCollection``::

    ebc = HotlineEmbeddingBagCollection(tables, placement, optimizer_type=torchrec.optim.RowWiseAdagrad,
                                        optimizer_kwargs={"lr": 0.02})
    model = DLRM(embedding_bag_collection=ebc, ...)
    opt = CombinedOptimizer([ebc.fused_optimizer, KeyedOptimizerWrapper(dense_params, dense_factory)])
    loss.backward(); opt.step()

Underneath, the hot rows of a :class:`~hotline.placement.Placement` live in one device tensor and every row
in host memory (``hotline.tiers``' ColdStore; see ``collection_core`` and ``tiered_tables``). The tables are
also torchrec's: ``state_dict()`` holds ``embedding_bags.<table>.weight`` (full tables, hot rows merged in),
``load_state_dict`` takes them (from torchrec's collections too), ``parameters()`` are the host rows (for state
and inspection; no ``.grad``: the fused optimizer updates them), and ``fused_optimizer`` (a KeyedOptimizer)
saves the optimizer state as torchrec's fused collection names it: the Adagrads' accumulators as
``<table>.weight.momentum_1``, Adam's moments as ``momentum_1`` and ``momentum_2``. ``fused_optimizer.step()`` applies the
update; ``torchrec.optim.apply_optimizer_in_backward`` (or ``update_in_backward=True``) applies it inside
``backward()``. A training forward keeps its lookups until the update; another training forward whose
predecessor has gradients but was never updated raises, so a forgotten update cannot pass silently.
Forwards under ``torch.no_grad()`` or in ``eval()`` mode keep nothing. Under ``torchrec.fx.symbolic_trace``
the collection is a leaf of the graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(fbgemm_gpu|torchrec)(\.|$)")

from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollectionInterface  # noqa: E402
from torchrec.optim.fused import FusedOptimizerModule  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor  # noqa: E402

from hotline.distributed.comm import Comm  # noqa: E402
from hotline.models.dlrm import init_embedding_table  # noqa: E402
from hotline.placement import Placement  # noqa: E402
from hotline.tiers.sparse_optim import SparseOptimizer  # noqa: E402
from hotline.torchrec_bridge.collection_core import _POOLINGS, CollectionCore, TieredCollectionMixin  # noqa: E402
from hotline.torchrec_bridge.fused_optim import sparse_optimizer, state_names  # noqa: E402


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


def check_tables(tables: Sequence[EmbeddingBagConfig], placement: Placement | None) -> Placement:
    """The tables' configs checked (feature names defaulted to the table name) and their placement (all rows
    cold when None); a one-line error naming the table otherwise."""
    if not tables:
        raise ValueError("tables must hold at least one EmbeddingBagConfig")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"table names must be distinct, got {names}")
    for t in tables:
        if t.pooling not in _POOLINGS:
            raise ValueError(f"table {t.name}: only sum and mean pooling are supported, got {t.pooling}")
        if not t.feature_names:
            t.feature_names = [t.name]
    sizes = [int(t.num_embeddings) for t in tables]
    dims = {int(t.embedding_dim) for t in tables}
    if placement is None:
        return Placement.all_cold(sizes, embedding_dim=min(dims))
    if placement.table_sizes != sizes:
        raise ValueError(
            f"placement has table sizes {placement.table_sizes}, the tables have num_embeddings {sizes}"
        )
    if len(dims) == 1 and placement.embedding_dim != next(iter(dims)):
        raise ValueError(
            f"placement was made for embedding dim {placement.embedding_dim}, the tables have {next(iter(dims))}"
        )
    return placement


class HotlineEmbeddingBagCollection(
    TieredCollectionMixin, EmbeddingBagCollectionInterface, FusedOptimizerModule
):
    """A torchrec embedding-bag collection (KJT in, KeyedTensor out) whose rows live in Hotline's tiers.

    Args:
        tables: torchrec ``EmbeddingBagConfig`` per table (sum or mean pooling, any dims).
        placement: hot rows per table (``table_sizes`` must equal the tables' ``num_embeddings``); None: all
            rows cold.
        optimizer_type: the fused optimizer, as torchrec's FusedEmbeddingBagCollection names it:
            ``torch.optim.SGD``, ``torchrec.optim.RowWiseAdagrad``, ``torch.optim.Adagrad`` or ``torch.optim.Adam``
            (or torchrec.optim's, or fbgemm's ``EmbOptimType``), with FBGEMM's semantics.
        optimizer_kwargs: its ``lr``, ``eps``, and Adam's ``beta1``/``beta2`` (or ``betas``), ``weight_decay``
            and ``use_rowwise_bias_correction``.
        is_weighted: multiply each looked-up row by the KJT's per-value weight before pooling.
        device: where the hot rows and the computation live (default cpu); ``"meta"``: no rows at all until
            DistributedModelParallel with Hotline's sharder materialises them on the shards (torchrec's init).
        optimizer: Hotline's :class:`SparseOptimizer` instead of ``optimizer_type``/``optimizer_kwargs``.
        weights: initial weights per table ([rows, dim] arrays); default ``hotline.models.dlrm.init_embedding_table``.
        seed: seed of the default initial weights.
        update_in_backward: apply the update inside ``backward()`` (as torchrec's fused kernels do).
        max_lookups: lookups per batch to size the dispatcher for (it grows when a batch needs more).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        placement: Placement | None = None,
        optimizer_type: Any = torch.optim.SGD,
        optimizer_kwargs: dict[str, Any] | None = None,
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        *,
        optimizer: SparseOptimizer | None = None,
        weights: Sequence[np.ndarray] | None = None,
        seed: int = 0,
        update_in_backward: bool = False,
        max_lookups: int = 1 << 16,
    ):
        super().__init__()
        tables = list(tables)
        self.placement = check_tables(tables, placement)
        dim = int(tables[0].embedding_dim) if tables else 1
        rule = optimizer if optimizer is not None else sparse_optimizer(optimizer_type, optimizer_kwargs, dim)
        sizes = [int(t.num_embeddings) for t in tables]
        self.table_sizes = sizes
        if device is not None and torch.device(device).type == "meta":
            if weights is not None:
                raise ValueError(
                    "HotlineEmbeddingBagCollection(device='meta') takes no weights (it holds no rows)"
                )
            self._init_tables(MetaCore(tables, rule, is_weighted, max_lookups), update_in_backward)
            return
        if weights is None:
            weights = [
                init_embedding_table(n, int(c.embedding_dim), seed, t)
                for t, (n, c) in enumerate(zip(sizes, tables))
            ]
        if len(weights) != len(sizes):
            raise ValueError(f"{len(weights)} weight arrays for {len(sizes)} tables")
        for c, w in zip(tables, weights):
            if np.shape(w) != (int(c.num_embeddings), int(c.embedding_dim)):
                raise ValueError(
                    f"weights of table {c.name} must be [{c.num_embeddings}, {c.embedding_dim}], got {np.shape(w)}"
                )
        core = CollectionCore(tables, self.placement.hot_ids, weights, rule, Comm(), torch.device(device or "cpu"),
                              is_weighted, max_lookups)  # fmt: skip
        self._init_tables(core, update_in_backward)

    @property
    def device(self) -> torch.device:
        return self._core.device

    @property
    def optimizer(self) -> SparseOptimizer:
        """The sparse rule the fused optimizer applies (its lr follows ``fused_optimizer.param_groups``)."""
        return self._fused_optimizer.current_rule()

    @classmethod
    def from_embedding_bag_collection(
        cls, ebc, placement: Placement | None = None, **kwargs
    ) -> HotlineEmbeddingBagCollection:
        """The same tables and current weights as a torchrec ``EmbeddingBagCollection`` (one on the meta device
        gives one on the meta device: no rows until DMP materialises them)."""
        configs = ebc.embedding_bag_configs()
        kwargs.setdefault("is_weighted", ebc.is_weighted())
        params = [ebc.embedding_bags[c.name].weight for c in configs]
        if any(p.device.type == "meta" for p in params):
            return cls(configs, placement, device="meta", **kwargs)
        weights = [p.detach().cpu().numpy() for p in params]
        return cls(configs, placement, weights=weights, **kwargs)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pooled embeddings [B, sum of dims] of every feature (a KeyedTensor keyed by embedding name)."""
        if isinstance(features, torch.fx.Proxy):  # traced: the collection is one leaf node of the graph
            tracer = features.tracer
            return tracer.create_proxy("call_module", tracer.path_of_module(self), (features,), {})
        if self._core.device.type == "meta":
            raise RuntimeError(
                "HotlineEmbeddingBagCollection was built on the meta device and holds no rows: shard it with "
                "DistributedModelParallel(model, sharders=[HotlineEmbeddingBagCollectionSharder(), ...]) first"
            )
        if self.training and torch.is_grad_enabled():
            _refuse_unsharded_ranks()
        return self._tiered_forward(features)


class MetaCore:
    """The tables of a collection built on the meta device: configs, shapes and the rule, no rows.

    Its parameters are meta tensors (so ``apply_optimizer_in_backward`` and torchrec's planner see the tables);
    Hotline's sharder materialises the rows on the shards, each rank only its own (``sharding.torchrec_init``).
    Anything that needs rows (a forward, a state load or export) is refused with one line."""

    def __init__(self, configs, optimizer: SparseOptimizer, is_weighted: bool, max_lookups: int):
        self.configs = list(configs)
        self.optimizer = optimizer
        self.is_weighted = bool(is_weighted)
        self.max_lookups = int(max_lookups)
        self.device = torch.device("meta")
        self.comm = Comm()
        self.dims = [int(c.embedding_dim) for c in self.configs]
        self.groups: list = []
        self.pending = None
        self.last_stats: dict[str, int] = {}

    def table_views(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        weights, states = {}, {}
        for c, d in zip(self.configs, self.dims):
            n = int(c.num_embeddings)
            weights[c.name] = torch.empty((n, d), device="meta")
            if state_names(self.optimizer):
                states[c.name] = torch.empty(replace(self.optimizer, dim=d).state_shape(n), device="meta")
        return weights, states

    def sync_to_host(self) -> None:
        """Nothing to sync: no rows."""

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(
            "HotlineEmbeddingBagCollection was built on the meta device and holds no rows: shard it with "
            "DistributedModelParallel (Hotline's sharder materialises the rows) before reading or loading them"
        )

    export = load = forward = prefetch = _refuse

    def step(self, optimizer=None, grad_scale: float = 1.0) -> int:
        return 0

    def close(self) -> None:
        """Nothing to release."""


def _refuse_unsharded_ranks() -> None:
    """An unsharded collection trained on N > 1 ranks updates each rank's own copy of every table: the copies
    drift apart, silently. Refused, naming the fix."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise RuntimeError(
            f"HotlineEmbeddingBagCollection is training unsharded on rank {dist.get_rank()} of "
            f"{dist.get_world_size()}: each rank would update its own copy of the tables; shard it with "
            "DistributedModelParallel(model, sharders=[HotlineEmbeddingBagCollectionSharder()], ...)"
        )
