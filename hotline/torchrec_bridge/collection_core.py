"""What Hotline's torchrec collection does, sharded or not: KJT in, KeyedTensor out, over :class:`TieredTables`.

:class:`CollectionCore` groups the tables by embedding dim (one :class:`TieredTables` per dim), turns a
``KeyedJaggedTensor`` into fused row ids and bag ids per group, pools each bag (sum, mean, per-value weights)
and keeps the lookups of a training forward until :meth:`CollectionCore.step` applies the sparse update. The
modules (``HotlineEmbeddingBagCollection`` and its sharded twin) add torchrec's state and optimizer around it
through :class:`TieredCollectionMixin`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import get_embedding_names_by_table
from torchrec.optim.fused import EmptyFusedOptimizer
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from hotline.distributed.comm import Comm
from hotline.tiers.sparse_optim import SparseOptimizer
from hotline.torchrec_bridge.fused_optim import HotlineFusedOptimizer, state_names, state_views
from hotline.torchrec_bridge.kjt_checks import check_kjt
from hotline.torchrec_bridge.tiered_tables import Lookup, TieredTables, to_device

_POOLINGS = (PoolingType.SUM, PoolingType.MEAN)


def host_features(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """The KJT in host memory: itself when it is there; the host copy an earlier :func:`start_host_copy` made,
    once that copy has landed (waiting for it alone, not for the device); else a copy made now (a device
    KJT handed straight to a forward: that copy waits for the stream)."""
    ready = getattr(features, "_hotline_host", None)
    if ready is not None:
        host, event = ready
        event.synchronize()
        return host
    if features.values().device.type == "cpu":
        return features
    return features.to(torch.device("cpu"))


def start_host_copy(features: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """Starts copying a CUDA KJT's ids to (pinned) host memory without blocking, and marks the KJT with the
    copy and its event (:func:`host_features` picks it up); any other KJT is returned as it is."""
    if features.values().device.type != "cuda":
        return features
    host = features.to(torch.device("cpu"), non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    features._hotline_host = (host, event)
    return features


class CollectionCore:
    """The tables of a collection over Hotline's tiers (see the module docstring)."""

    def __init__(self, configs: Sequence[EmbeddingBagConfig], hot_ids: Sequence[np.ndarray],
                 weights: Sequence[np.ndarray] | None, optimizer: SparseOptimizer, comm: Comm, device: torch.device,
                 is_weighted: bool, max_lookups: int, init=None):  # fmt: skip
        """``weights``: every table's rows; None: ``init(config, count)`` makes this rank's ``count`` rows of each
        table (those its cold store keeps), and no rank ever holds a whole table."""
        self.configs = list(configs)
        self.optimizer = optimizer
        self.comm = comm
        self.device = torch.device(device)
        self.is_weighted = bool(is_weighted)
        self.sizes = [int(c.num_embeddings) for c in self.configs]
        self.dims = [int(c.embedding_dim) for c in self.configs]
        # groups of tables with one dim, in order of first appearance; table t = group g, position i
        order: dict[int, list[int]] = {}
        for t, d in enumerate(self.dims):
            order.setdefault(d, []).append(t)
        self.group_tables = list(order.values())
        self.where = {t: (g, i) for g, ts in enumerate(self.group_tables) for i, t in enumerate(ts)}
        self.groups = []
        N, r = comm.world_size, comm.rank
        for ts in self.group_tables:
            if weights is None:  # the rank's rows of each table: fused rows lo + (r - lo) % N + k N
                lo = np.concatenate([[0], np.cumsum([self.sizes[t] for t in ts])])
                parts = [init(self.configs[t], len(range(lo[i] + (r - lo[i]) % N, lo[i + 1], N)))
                         for i, t in enumerate(ts)]  # fmt: skip
            else:
                parts = [weights[t] for t in ts]
            fused = np.concatenate([np.asarray(w, dtype=np.float32) for w in parts])
            rule = replace(optimizer, dim=self.dims[ts[0]])  # per-element state is sized by the group's dim
            self.groups.append(TieredTables([self.sizes[t] for t in ts], self.dims[ts[0]], [hot_ids[t] for t in ts],
                                            np.ascontiguousarray(fused), rule, comm, self.device, max_lookups,
                                            local=weights is None))  # fmt: skip
        names = get_embedding_names_by_table(self.configs)
        # (table, feature, output name) per output slot, in torchrec's order
        self.slots = [
            (t, f, names[t][i]) for t, c in enumerate(self.configs) for i, f in enumerate(c.feature_names)
        ]
        # slot j lives in group slot_group[j] at local position slot_local[j] (its group's slots in slot order)
        self.slot_group = [self.where[t][0] for t, _, _ in self.slots]
        counts = [0] * len(self.groups)
        self.slot_local = []
        for g in self.slot_group:
            self.slot_local.append(counts[g])
            counts[g] += 1
        self.group_slots = counts
        # runs of consecutive slots of one group: the output is one reshape per run (no per-slot slicing, whose
        # backward would allocate a whole pooled tensor per slot)
        self.runs: list[tuple[int, int, int]] = []
        for j, g in enumerate(self.slot_group):
            if self.runs and self.runs[-1][0] == g and self.runs[-1][2] == self.slot_local[j]:
                self.runs[-1] = (g, self.runs[-1][1], self.slot_local[j] + 1)
            else:
                self.runs.append((g, self.slot_local[j], self.slot_local[j] + 1))
        self.mean = np.array([self.configs[t].pooling == PoolingType.MEAN for t, _, _ in self.slots])
        self.pending: list[Lookup] | None = None
        self.last_stats: dict[str, int] = {}

    # -- forward ------------------------------------------------------------------------------------------------
    def group_ids(
        self, features: KeyedJaggedTensor
    ) -> tuple[list[np.ndarray], list[np.ndarray], list, np.ndarray, int]:
        """Per group: fused row ids and bag ids (group-local slot * B + sample) of its lookups, their KJT weights; the length
        of every bag [slots, B]; the batch size B."""
        if features.variable_stride_per_key():
            raise ValueError("KeyedJaggedTensor with a variable batch size per key is not supported")
        features = host_features(features)  # the ids are read on the host (the dispatcher runs there)
        check_kjt(features)  # ids, lengths and weights that make a batch, named by key (kjt_checks.py)
        B = int(features.stride())
        keys = features.keys()
        index = {k: i for i, k in enumerate(keys)}
        lengths = features.lengths().detach().cpu().numpy().astype(np.int64).reshape(len(keys), B)
        values = features.values().detach().cpu().numpy()
        offsets = features.offset_per_key()
        kjt_weights = features.weights_or_none()
        if self.is_weighted and kjt_weights is None:
            raise ValueError("this collection is weighted but the KeyedJaggedTensor has no weights")
        w_all = kjt_weights.detach().cpu().numpy() if self.is_weighted else None
        G = len(self.groups)
        ids, bags, ws = [[] for _ in range(G)], [[] for _ in range(G)], [[] for _ in range(G)]
        bag_len = np.zeros((len(self.slots), B), np.int64)
        for j, (t, f, _) in enumerate(self.slots):
            if f not in index:
                raise KeyError(
                    f"feature {f!r} (table {self.configs[t].name}) is not among the KJT's keys {keys}"
                )
            k = index[f]
            v = values[offsets[k] : offsets[k + 1]].astype(np.int64)
            n = self.sizes[t]
            if v.size and (v.min() < 0 or v.max() >= n):
                bad = int(v[(v < 0) | (v >= n)][0])
                raise IndexError(
                    f"feature {f!r}: id {bad} out of range [0, {n}) of table {self.configs[t].name}"
                )
            g, i = self.where[t]
            ids[g].append(v + self.groups[g].layout.offsets[i])
            bags[g].append(self.slot_local[j] * B + np.repeat(np.arange(B, dtype=np.int64), lengths[k]))
            bag_len[j] = lengths[k]
            if w_all is not None:
                ws[g].append(w_all[offsets[k] : offsets[k + 1]])
        cat = np.concatenate
        empty = np.zeros(0, np.int64)
        return ([cat(x) if x else empty for x in ids], [cat(x) if x else empty for x in bags],
                [cat(x) if x else None for x in ws], bag_len, B)  # fmt: skip

    def forward(self, features: KeyedJaggedTensor, training: bool) -> KeyedTensor:
        """Pooled embeddings [B, sum of the slots' dims] keyed by embedding name (torchrec's layout)."""
        if training and self.pending is not None and any(look.rows.grad is not None for look in self.pending):
            raise RuntimeError(
                "the previous training step's gradients were never applied: call fused_optimizer.step() (or "
                "sparse_step()) after backward()"
            )
        ids, bags, weights, bag_len, B = self.group_ids(features)
        dev = self.device
        looks = [grp.lookup(ids[g], training) for g, grp in enumerate(self.groups)]
        outs = []
        stats = {"samples": B, "lookups": 0, "hot_lookups": 0, "working_set_rows": 0}
        cold_samples = []
        for g, (grp, look) in enumerate(zip(self.groups, looks)):
            contrib = look.rows
            if weights[g] is not None:
                contrib = contrib * to_device(weights[g].astype(np.float32, copy=False), dev)[:, None]
            S = self.group_slots[g]
            mine = np.array(self.slot_group) == g
            if bags[g].shape[0] == S * B and (bag_len[mine] == 1).all():  # one lookup per bag, in bag order
                pooled = contrib.view(S, B, grp.dim)
            else:
                pooled = torch.zeros((S * B, grp.dim), dtype=torch.float32, device=dev)
                pooled = pooled.index_add(0, to_device(bags[g], dev), contrib).view(S, B, grp.dim)
            if self.mean[mine].any():  # mean bags divided by their length (an empty bag stays 0)
                div = np.where(self.mean[mine][:, None], np.maximum(bag_len[mine], 1), 1).astype(np.float32)
                pooled = pooled / to_device(div, dev)[:, :, None]
            outs.append(pooled)
            stats["lookups"] += int(ids[g].shape[0])
            stats["hot_lookups"] += int(look.hot_pos.numel())
            stats["working_set_rows"] += int(look.fetch.rows.shape[0])
            cold_samples.append(bags[g][look.cold_pos] % B if B else bags[g][:0])
        stats["popular_samples"] = B - int(np.unique(np.concatenate(cold_samples)).shape[0]) if B else 0
        self.last_stats = stats
        self.pending = looks if training else self.pending
        parts = []
        for g, lo, hi in self.runs:
            run = outs[g] if (lo, hi) == (0, self.group_slots[g]) else outs[g][lo:hi]
            parts.append(run.transpose(0, 1).reshape(B, (hi - lo) * self.groups[g].dim))
        values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return KeyedTensor(keys=[s[2] for s in self.slots], length_per_key=[self.dims[s[0]] for s in self.slots],
                           values=values, key_dim=1)  # fmt: skip

    def step(self, optimizer: SparseOptimizer | None = None, grad_scale: float = 1.0) -> int:
        """Applies the sparse update to the rows the last training forward looked up; the rows updated."""
        looks, self.pending = self.pending, None
        if looks is None:
            return 0
        optimizer = optimizer or self.optimizer
        return sum(grp.update(look, optimizer, grad_scale) for grp, look in zip(self.groups, looks))

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Fetches a coming training batch's cold rows now, under the claim rule (see TieredTables.prefetch)."""
        ids, _, _, _, _ = self.group_ids(features)
        for g, grp in enumerate(self.groups):
            grp.prefetch(ids[g])

    # -- tables -------------------------------------------------------------------------------------------------
    def table_views(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Each table's rows (this rank's) and optimizer state ([rows], or [rows, S] for the per-element
        optimizers) in host memory, as views, by table name."""
        weights, states = {}, {}
        for t, c in enumerate(self.configs):
            g, i = self.where[t]
            grp = self.groups[g]
            rows = grp.local_rows(i)
            weights[c.name] = grp.host_weight[rows]
            if grp.host_state.numel():
                states[c.name] = grp.host_state[rows]
        return weights, states

    def sync_to_host(self) -> None:
        for grp in self.groups:
            grp.sync_to_host()

    def export(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Every table's weights and state (full tables, hot rows current), by name (a collective on N ranks)."""
        tables, states = {}, {}
        for g, grp in enumerate(self.groups):
            w, s = grp.export()
            for i, t in enumerate(self.group_tables[g]):
                lo = int(grp.layout.offsets[i])
                tables[self.configs[t].name] = w[lo : lo + self.sizes[t]]
                states[self.configs[t].name] = s[lo : lo + self.sizes[t]] if s.size else s
        return tables, states

    def load(self, tables: dict[str, np.ndarray], states: dict[str, np.ndarray] | None = None) -> None:
        """Sets every table's weights (and state) in both tiers from full tables by name."""
        for g, grp in enumerate(self.groups):
            ts = self.group_tables[g]
            w = np.concatenate([np.asarray(tables[self.configs[t].name], np.float32) for t in ts])
            s = None
            if states is not None and grp.host_state.numel():
                s = np.concatenate([np.asarray(states[self.configs[t].name], np.float32) for t in ts])
            grp.load(np.ascontiguousarray(w), s)

    def close(self) -> None:
        for grp in self.groups:
            grp.close()


def in_backward_request(bags: nn.ModuleDict) -> tuple[type, dict] | None:
    """The optimizer class and kwargs ``torchrec.optim.apply_optimizer_in_backward`` gave the tables' parameters
    (None when it was not called); a one-line error when the tables were given different ones."""
    found = {(cls, tuple(sorted(kw.items())))
             for view in bags.values()
             for cls, kw in zip(getattr(view.weight, "_optimizer_classes", []),
                                getattr(view.weight, "_optimizer_kwargs", []))}  # fmt: skip
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(
            "apply_optimizer_in_backward: Hotline's collection needs one optimizer for all tables"
        )
    cls, kw = found.pop()
    return cls, dict(kw)


class _TableView(nn.Module):
    """``embedding_bags[<table>]``: the table's weight parameter (this rank's rows, in host memory)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=True)

    def _apply(self, fn, recurse=True):  # the rows stay in host memory: .to()/.cuda() never copy a table
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Nothing: the collection saves its full tables under this key (see TieredCollectionMixin)."""

    def _load_from_state_dict(self, state_dict, prefix, *args):
        """Nothing: the collection loads its full tables from this key (see TieredCollectionMixin)."""


class TieredCollectionMixin:
    """torchrec's state and optimizer around a :class:`CollectionCore` (shared by the sharded and unsharded
    modules): ``embedding_bags.<table>.weight`` parameters and state-dict keys, full tables in the state dict
    (hot rows merged in), a :class:`HotlineFusedOptimizer`, and ``apply_optimizer_in_backward`` honoured."""

    _core: CollectionCore
    update_in_backward: bool

    def _init_tables(self, core: CollectionCore, update_in_backward: bool) -> None:
        self._core = core
        self.update_in_backward = bool(update_in_backward)
        weights, states = core.table_views()
        bags = nn.ModuleDict({name: _TableView(w) for name, w in weights.items()})
        self.embedding_bags = bags
        for (
            view
        ) in bags.values():  # torchrec's mark of a fused table: in_backward_optimizer_filter leaves it out
            view.weight._in_backward_optimizers = [EmptyFusedOptimizer()]
            view.weight._optimizer_classes, view.weight._optimizer_kwargs = [], []
        self._fused_optimizer = self._new_fused_optimizer(bags, states)
        self._in_backward_checked = False
        self._update_iteration = 0  # the iteration of the last training forward (its update's, for Adam)

    def _new_fused_optimizer(
        self, bags: nn.ModuleDict, states: dict[str, torch.Tensor]
    ) -> HotlineFusedOptimizer:
        """The fused optimizer over ``bags``' parameters, with FusedEmbeddingBagCollection's keys."""
        core = self._core
        params = {f"{name}.weight": view.weight for name, view in bags.items()}
        dims = {c.name: int(c.embedding_dim) for c in core.configs}
        momentum = {
            f"{name}.weight": state_views(core.optimizer, s, dims[name]) for name, s in states.items()
        }
        return HotlineFusedOptimizer(params, momentum, core.optimizer, self._apply_update, core.sync_to_host,
                                     self._after_optimizer_load)  # fmt: skip

    # -- torchrec's view of the collection ---------------------------------------------------------------------
    @property
    def embedding_bags(self) -> nn.ModuleDict:
        """``<table>`` -> a module whose ``weight`` is the table (this rank's rows, in host memory; the hot rows'
        current values are written into them whenever this is read)."""
        self._core.sync_to_host()
        return self._modules["embedding_bags"]

    @property
    def fused_optimizer(self) -> HotlineFusedOptimizer:
        """The KeyedOptimizer that applies the sparse update (``CombinedOptimizer([ebc.fused_optimizer, dense])``)."""
        return self._fused_optimizer

    @property
    def last_stats(self) -> dict[str, int]:
        """Figures of the last forward: samples, lookups, hot_lookups, working_set_rows, popular_samples."""
        return self._core.last_stats

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._core.configs

    def is_weighted(self) -> bool:
        return self._core.is_weighted

    def _apply(self, fn, recurse=True):
        """``.to()`` / ``.cuda()`` leave the tiers where the constructor put them (no table is ever copied)."""
        return self

    # -- the update ---------------------------------------------------------------------------------------------
    def _grad_scale(self) -> float:
        return 1.0

    def _apply_update(self, rule: SparseOptimizer) -> int:
        if rule.kind == "adam" and rule.iteration > 0:  # FBGEMM's bias correction: the forward's iteration
            rule = replace(rule, iteration=max(1, self._update_iteration))
        return self._core.step(rule, self._grad_scale())

    @torch.no_grad()
    def sparse_step(self) -> int:
        """Applies the pending sparse update now (what ``fused_optimizer.step()`` does); the rows updated."""
        return self._apply_update(self._fused_optimizer.current_rule())

    def _check_in_backward(self) -> None:
        """Honours ``torchrec.optim.apply_optimizer_in_backward`` on the tables' parameters (once, at the first
        forward): their optimizer class and kwargs become the fused rule, applied inside backward()."""
        if self._in_backward_checked:
            return
        self._in_backward_checked = True
        from hotline.torchrec_bridge.fused_optim import sparse_optimizer

        found = in_backward_request(self.embedding_bags)
        if found is None:
            return
        cls, kw = found
        rule = sparse_optimizer(cls, dict(kw), self._core.dims[0])
        old = self._core.optimizer
        if (rule.kind, state_names(rule)) != (old.kind, state_names(old)):
            self._rebuild(rule, cls, dict(kw))  # the tables need (or drop) the rule's state
        self._core.optimizer = rule
        self._fused_optimizer.rule = rule
        for group in self._fused_optimizer.param_groups:
            group["lr"], group["eps"] = rule.lr, rule.eps
        self.update_in_backward = True
        for (
            view
        ) in self.embedding_bags.values():  # torch's in-backward hooks never fire (no .grad): drop them
            view.weight._in_backward_optimizers = [EmptyFusedOptimizer()]

    def _rebuild(self, rule: SparseOptimizer, cls, kwargs: dict) -> None:
        """The same tables (current weights) over a new core whose rows carry ``rule``'s optimizer state."""
        old = self._core
        tables, _ = old.export()
        core = CollectionCore(old.configs, [np.asarray(h) for h in self.placement.hot_ids],
                              [tables[c.name] for c in old.configs], rule, old.comm, old.device, old.is_weighted,
                              max(g._capacity for g in old.groups))  # fmt: skip
        old.close()
        self._init_tables(core, True)
        self._in_backward_checked = True
        for view in self._modules["embedding_bags"].values():  # the new parameters carry the request too
            view.weight._optimizer_classes, view.weight._optimizer_kwargs = [cls], [kwargs]

    def _tiered_forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        self._check_in_backward()
        training = self.training and torch.is_grad_enabled()
        self._fused_optimizer.iteration += (
            1  # every forward counts, as fbgemm's iter (Adam's bias correction)
        )
        if training:
            self._update_iteration = self._fused_optimizer.iteration
        kt = self._core.forward(features, training)
        if training and self.update_in_backward:
            for look in self._core.pending:
                look.rows.register_post_accumulate_grad_hook(self._update_in_backward_hook)
        return kt

    def _update_in_backward_hook(self, rows: torch.Tensor) -> None:
        pending = self._core.pending
        if pending is not None and all(look.rows.grad is not None for look in pending):
            self.sparse_step()

    def _after_optimizer_load(self) -> None:
        for grp in self._core.groups:
            grp.load_hot_from_host(weights=False, state=True)

    # -- state --------------------------------------------------------------------------------------------------
    def export_tables(self) -> dict[str, np.ndarray]:
        """Every table's current weights (full tables, hot rows merged in), by table name (a collective on N ranks)."""
        return self._core.export()[0]

    def load_tables(self, tables: dict[str, np.ndarray]) -> None:
        """Sets every table's weights (full tables, by name) in both tiers; optimizer state unchanged."""
        for c in self._core.configs:
            want = (int(c.num_embeddings), int(c.embedding_dim))
            if c.name not in tables or tuple(np.shape(tables[c.name])) != want:
                raise ValueError(f"load_tables: table {c.name} needs a [{want[0]}, {want[1]}] array")
        self._core.load(tables)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Full ``[num_embeddings, dim]`` tables under ``embedding_bags.<table>.weight`` (torchrec's keys), the hot
        rows' current values merged in. On one rank they are the host rows themselves (after syncing the hot
        rows into them); on N ranks each table is gathered (a collective: every rank calls state_dict)."""
        if self._core.comm.world_size == 1:
            self._core.sync_to_host()
            for name, view in self.embedding_bags.items():
                w = view.weight
                destination[f"{prefix}embedding_bags.{name}.weight"] = w if keep_vars else w.detach()
        else:
            tables, _ = self._core.export()
            for name in self.embedding_bags:
                destination[f"{prefix}embedding_bags.{name}.weight"] = torch.from_numpy(tables[name])

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):  # fmt: skip
        tables = {}
        for c in self._core.configs:
            key = f"{prefix}embedding_bags.{c.name}.weight"
            if key not in state_dict:
                missing_keys.append(key)
                continue
            w = state_dict[key]
            w = w.full_tensor() if hasattr(w, "full_tensor") else w
            want = (int(c.num_embeddings), int(c.embedding_dim))
            if tuple(w.shape) != want:
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)}, the "
                                  f"table is {want}")  # fmt: skip
                continue
            tables[c.name] = w.detach().cpu().numpy()
        if len(tables) == len(self._core.configs):
            self._core.load(tables)
