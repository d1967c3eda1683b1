"""Models, batches and spawned-rank workers shared by the torchrec tests (a helper module, not a test file).

The reference is torchrec's own ``DLRMTrain`` over torchrec's ``EmbeddingBagCollection`` with dense gradients
and plain torch optimizers over every parameter, trained in one process on the global batch. Hotline's side is
the same DLRM (same initial state) over :class:`HotlineEmbeddingBagCollection`, wrapped in
``DistributedModelParallel`` with Hotline's sharder on N gloo ranks, each rank training on its slice of the
global batch, plainly or through torchrec's train pipelines.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRMTrain

from hotline.placement import Placement

D, DENSE = 8, 5
SIZES = [40, 60, 12]
LR = 0.05
FEATURES = {"f0": 0, "f1": 1, "f2": 1, "f3": 2}  # table t_1 serves two features


def configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t_0", embedding_dim=D, num_embeddings=SIZES[0], feature_names=["f0"]),
        EmbeddingBagConfig(name="t_1", embedding_dim=D, num_embeddings=SIZES[1], feature_names=["f1", "f2"]),
        EmbeddingBagConfig(name="t_2", embedding_dim=D, num_embeddings=SIZES[2], feature_names=["f3"]),
    ]


def placement() -> Placement:
    """Some rows of every table hot (the popular low ids), one table all cold."""
    hot = [np.arange(0, 40, 3), np.arange(0, 20), np.zeros(0, np.int64)]
    return Placement.from_hot_ids(SIZES, hot, embedding_dim=D)


def global_batch(
    step: int, size: int, order: int | None = None
) -> tuple[torch.Tensor, list[np.ndarray], list[np.ndarray], torch.Tensor]:
    """Dense [size, DENSE], ids and lengths per feature [size] (jagged, skewed to low ids), labels; ``order``: the
    same samples permuted by that seed (the same maths, summed in another order)."""
    rng = np.random.default_rng(1000 + step)
    dense = torch.from_numpy(rng.random((size, DENSE), dtype=np.float32))
    lengths = [rng.integers(0, 4, size=size) for _ in FEATURES]
    ids = [
        np.minimum(rng.geometric(0.15, size=int(n.sum())) - 1, SIZES[t] - 1)
        for n, t in zip(lengths, FEATURES.values())
    ]
    labels = torch.from_numpy((rng.random(size) < 0.4).astype(np.float32))
    if order is not None:
        perm = np.random.default_rng(order).permutation(size)
        bags = [np.split(v, np.cumsum(n)[:-1]) for v, n in zip(ids, lengths)]
        ids = [np.concatenate([b[i] for i in perm]).astype(np.int64) for b in bags]
        lengths = [n[perm] for n in lengths]
        dense, labels = dense[perm], labels[perm]
    return dense, ids, lengths, labels


def batch(step: int, size: int, rank: int = 0, world: int = 1, order: int | None = None) -> Batch:
    """Rank ``rank``'s contiguous slice of the global batch of step ``step`` as torchrec's Batch."""
    dense, ids, lengths, labels = global_batch(step, size, order)
    lo, hi = rank * size // world, (rank + 1) * size // world
    values, lens = [], []
    for v, n in zip(ids, lengths):
        off = np.concatenate([[0], np.cumsum(n)])
        values.append(v[off[lo] : off[hi]])
        lens.append(n[lo:hi])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES),
        values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.from_numpy(np.concatenate(lens).astype(np.int64)),
    )
    return Batch(dense_features=dense[lo:hi], sparse_features=kjt, labels=labels[lo:hi])


def dlrm(ebc) -> DLRMTrain:
    return DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE, dense_arch_layer_sizes=[16, D],
                          over_arch_layer_sizes=[16, 1]))  # fmt: skip


def reference_model(seed: int = 0) -> DLRMTrain:
    torch.manual_seed(seed)
    return dlrm(EmbeddingBagCollection(tables=configs(), device=torch.device("cpu")))


def optimizer_type(kind: str):
    """The optimizer class torchrec users name Hotline's sparse ``kind`` by."""
    from torchrec.optim import RowWiseAdagrad

    return {"sgd": torch.optim.SGD, "rowwise-adagrad": RowWiseAdagrad, "adagrad": torch.optim.Adagrad,
            "adam": torch.optim.Adam}[kind]  # fmt: skip


TOLERANCE = {"sgd": 1e-6, "rowwise-adagrad": 1e-6, "adagrad": 1e-6, "adam": 1e-5}
"""Relative bound of Hotline against the reference per optimizer. Adam's is wider: where a row's gradient is a
near-cancelling sum of lookups (-8e-8 from terms of 1e-4, measured) the two sides' summation orders differ in
its 4th digit, and where sqrt(v_hat) is as small as eps Adam's step follows that digit (4.6e-6 measured in
test_adam_weight_decay_is_fbgemms; 2.5e-7 in the other Adam runs)."""
FBGEMM_KINDS = ("adagrad",)
"""Optimizers whose reference is fbgemm's own update: torchrec's FusedEmbeddingBagCollection (CPU kernels).
fbgemm's CPU TBE has no ADAM ("Optimizer adam is not supported in CPU mode"): Adam's reference is
:class:`FbgemmAdam`, FBGEMM's ADAM written out in plain PyTorch."""


class FbgemmAdam:
    """FBGEMM's ADAM as its kernels compute it (fbgemm_gpu's ``codegen/genscript/optimizers.py``, ``adam``), in
    plain PyTorch over the dense gradients of torchrec's EmbeddingBagCollection: on the rows a batch looks up,
    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w)`` with ``t`` the module's iteration (1 at the
    first step, the same for every row; ``b^t`` a float power, fbgemm's ``powf``, whose rounding matters where
    ``1 - b2^t`` is small); rows the batch does not look up keep their weights and moments."""

    def __init__(self, model: torch.nn.Module, lr: float = LR, eps: float = 1e-8, beta1: float = 0.9,
                 beta2: float = 0.999, weight_decay: float = 0.0):  # fmt: skip
        self.tables = {n.split(".")[-2]: p for n, p in model.named_parameters() if "embedding_bags" in n}
        # fbgemm keeps its hyper-parameters as C++ floats: 1 - beta of a float beta (1 - 0.999f is not 0.001f)
        self.lr, self.eps, self.beta1, self.beta2, self.wd = (
            float(np.float32(x)) for x in (lr, eps, beta1, beta2, weight_decay)
        )
        self.m = {k: torch.zeros_like(p) for k, p in self.tables.items()}
        self.v = {k: torch.zeros_like(p) for k, p in self.tables.items()}
        self.iteration = 0

    @torch.no_grad()
    def step(self, b: Batch) -> None:
        self.iteration += 1
        t = self.iteration
        ids = b.sparse_features.to_dict()
        for k, p in self.tables.items():
            feats = [f for f, table in FEATURES.items() if f"t_{table}" == k]
            rows = torch.unique(torch.cat([ids[f].values() for f in feats]))
            g = p.grad[rows]
            m = self.beta1 * self.m[k][rows] + (1 - self.beta1) * g
            v = self.beta2 * self.v[k][rows] + (1 - self.beta2) * g * g
            self.m[k][rows], self.v[k][rows] = m, v
            c1, c2 = (1.0 - float(np.float32(b) ** np.float32(t)) for b in (self.beta1, self.beta2))  # powf
            p[rows] -= self.lr * (m / c1 / (torch.sqrt(v / c2) + self.eps) + self.wd * p[rows])

    def zero_grad(self) -> None:
        for p in self.tables.values():
            p.grad = None

    def state_dict(self) -> dict:
        """The moments as torchrec's fused collection names them (fbgemm's ADAM: momentum1, momentum2)."""
        return {"state": {f"{k}.weight": {f"{k}.weight.momentum_1": self.m[k].clone(),
                                          f"{k}.weight.momentum_2": self.v[k].clone()} for k in self.tables}}  # fmt: skip


def fused_reference_model(kind: str, seed: int = 0) -> DLRMTrain:
    """torchrec's DLRM over its FusedEmbeddingBagCollection (fbgemm's CPU TBE applies ``kind`` in backward),
    from the reference's initial state."""
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    ebc = FusedEmbeddingBagCollection(
        configs(), optimizer_type=optimizer_type(kind), optimizer_kwargs={"lr": LR}
    )
    model = dlrm(ebc)
    model.load_state_dict(copy.deepcopy(reference_model(seed).state_dict()))
    return model


def reference_optimizer(model: DLRMTrain, kind: str) -> list[torch.optim.Optimizer]:
    """Plain torch SGD over every parameter; for ``rowwise-adagrad`` torchrec's RowWiseAdagrad on the tables;
    for the fbgemm kinds SGD on the dense layers only (the fused collection updates its tables itself); for
    ``adam`` :class:`FbgemmAdam` on the tables."""
    from torchrec.optim import RowWiseAdagrad

    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    dense = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    if kind == "sgd":
        return [torch.optim.SGD(dense + tables, lr=LR)]
    if kind in FBGEMM_KINDS:
        return [torch.optim.SGD(dense, lr=LR)]
    if kind == "adam":
        return [torch.optim.SGD(dense, lr=LR), FbgemmAdam(model)]
    return [torch.optim.SGD(dense, lr=LR), RowWiseAdagrad(tables, lr=LR)]


def train_reference(kind: str, steps: int, size: int, seed: int = 0) -> tuple[DLRMTrain, dict | None]:
    """The reference trained ``steps`` steps, and its tables' optimizer state as torchrec's fused collection
    names it (None for SGD and row-wise Adagrad)."""
    model = fused_reference_model(kind, seed) if kind in FBGEMM_KINDS else reference_model(seed)
    opts = reference_optimizer(model, kind)
    for s in range(steps):
        b = batch(s, size)
        loss, _ = model(b)
        loss.backward()
        for o in opts:
            if isinstance(o, FbgemmAdam):
                o.step(b)  # it updates the rows b looked up
            else:
                o.step()
            o.zero_grad()
    if kind in FBGEMM_KINDS:
        return model, model.model.sparse_arch.embedding_bag_collection.fused_optimizer().state_dict()
    return model, (opts[-1].state_dict() if kind == "adam" else None)


def reference_results(kinds, steps: int, size: int) -> dict:
    """kind -> (the reference's state_dict after ``steps`` steps of ``size``, its logits on a held-out batch)."""
    out = {}
    for kind in kinds:
        model, _ = train_reference(kind, steps, size)
        model.eval()
        with torch.no_grad():
            _, (_, logits, _) = model(batch(999, size))
        out[kind] = (model.state_dict(), logits.reshape(-1))
    return out


def hotline_model(kind: str, seed: int = 0, **kwargs) -> DLRMTrain:
    """torchrec's DLRM over Hotline's collection, from the reference's initial state (strict load)."""
    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    ref = reference_model(seed)
    ebc = HotlineEmbeddingBagCollection(configs(), placement(), optimizer_type=optimizer_type(kind),
                                        optimizer_kwargs={"lr": LR}, **kwargs)  # fmt: skip
    model = dlrm(ebc)
    model.load_state_dict(copy.deepcopy(ref.state_dict()))
    return model


def combined_optimizer(model: torch.nn.Module):
    """torchrec's usual optimizer: the fused one of the collections plus plain SGD on the dense layers."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    from hotline.torchrec_bridge.sharding import find_collections

    dense = {n: p for n, p in model.named_parameters() if "embedding_bags" not in n}
    if hasattr(model, "fused_optimizer"):  # DMP collects the fused optimizers of its sharded modules
        fused = model.fused_optimizer
    else:
        fused = CombinedOptimizer([(path, m.fused_optimizer) for path, m in find_collections(model).items()])
    return CombinedOptimizer([fused, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=LR))])


def train_dmp(comm, jobs: list[tuple[str, str, int, int, str]]) -> None:
    """Spawned rank: for each (kind, pipeline, steps, global batch, out file) trains Hotline's DLRM under DMP with
    Hotline's sharder; rank 0 saves the final state_dict, the fused optimizer's state and eval predictions."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from hotline.torchrec_bridge.pipelines import CpuPrefetchTrainPipelineSparseDist
    from hotline.torchrec_bridge.sharding import HotlineEmbeddingBagCollectionSharder, hotline_sharding_plan

    N, r = comm.world_size, comm.rank
    for kind, pipeline, steps, size, out in jobs:
        model = hotline_model(kind)
        dmp = DistributedModelParallel(model, device=torch.device("cpu"),
                                       sharders=[HotlineEmbeddingBagCollectionSharder()],
                                       plan=hotline_sharding_plan(model, N))  # fmt: skip
        opt = combined_optimizer(dmp)
        batches = [batch(s, size, r, N) for s in range(steps)]
        if pipeline == "plain":
            for b in batches:
                loss, _ = dmp(b)
                loss.backward()
                opt.step()
                opt.zero_grad()
        else:
            cls = TrainPipelineSparseDist if pipeline == "sparse_dist" else CpuPrefetchTrainPipelineSparseDist
            pipe = cls(dmp, opt, torch.device("cpu"))
            it = iter(batches)
            done = 0
            while True:
                try:
                    pipe.progress(it)
                    done += 1
                except StopIteration:
                    break
            assert done == steps, (done, steps)
            pipe.detach()  # torchrec restores the modules' own forward
        ebc = dmp.module.model.sparse_arch.embedding_bag_collection
        refreshed = sum(g.refreshed_rows for g in ebc._core.groups)
        save_result(comm, dmp, opt, size, out, refreshed=refreshed)


def full(value, rank: int):
    """A ShardedTensor gathered whole on rank 0 (a collective; None elsewhere), anything else as it is."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if not isinstance(value, ShardedTensor):
        return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
    out = torch.empty(value.shape, dtype=value.dtype) if rank == 0 else None
    value.gather(dst=0, out=out)
    return out


def save_result(comm, dmp, opt, size: int, out: str, **extra) -> None:
    """Rank 0 saves the model's and the optimizer's state (ShardedTensors gathered whole: test sizes only) and
    the eval predictions of the global batch 999. ``opt`` None: no optimizer state (torchrec's table-wise
    collection keys each table's state on its own rank only)."""
    r, N = comm.rank, comm.world_size
    state = {k: full(v, r) for k, v in dmp.state_dict().items()}
    optim = (
        {}
        if opt is None
        else {k: {n: full(t, r) for n, t in v.items()} for k, v in opt.state_dict()["state"].items()}
    )
    dmp.eval()
    with torch.no_grad():
        _, (_, logits, _) = dmp(batch(999, size, r, N))
    logits = comm.all_gather_varlen(logits.reshape(-1, 1), "eval")
    if r == 0:
        torch.save({"state": state, "optim": {"state": optim}, "logits": torch.cat(logits).reshape(-1), **extra},
                   out)  # fmt: skip


def idiom_optimizer(dmp) -> tuple[dict, object]:
    """torchrec's usual optimizer under DMP: the fused one plus SGD over what ``in_backward_optimizer_filter``
    leaves (the dense parameters); the dense parameters too."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    opt = CombinedOptimizer(
        [dmp.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=LR))]
    )
    return dense, opt


def in_backward_kwargs(kind: str) -> dict:
    """apply_optimizer_in_backward's kwargs matching the reference (row-wise Adagrad: torchrec's class's eps)."""
    return {"lr": LR, "eps": 1e-10} if kind == "rowwise-adagrad" else {"lr": LR}


def hotline_dmp(comm, kind: str | None, fused_params: dict | None = None, seed: int = 0, plan: bool = True):
    """torchrec's DLRM over Hotline's collection (built with the constructor's default SGD, lr 0.01) under DMP
    with Hotline's sharder; ``kind``: the optimizer ``apply_optimizer_in_backward`` gives the tables first;
    ``plan`` False: no plan (torchrec's own planner plans, the 2-line switch)."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection
    from hotline.torchrec_bridge.sharding import HotlineEmbeddingBagCollectionSharder, hotline_sharding_plan

    ref = reference_model()
    ebc = HotlineEmbeddingBagCollection(configs(), placement(), seed=seed)
    model = dlrm(ebc)
    if seed == 0:
        model.load_state_dict(copy.deepcopy(ref.state_dict()))
    if kind is not None:
        apply_optimizer_in_backward(optimizer_type(kind), ebc.parameters(), in_backward_kwargs(kind))
    sharders = [HotlineEmbeddingBagCollectionSharder(fused_params)]
    if not plan:
        return DistributedModelParallel(model, device=torch.device("cpu"), sharders=sharders)
    return DistributedModelParallel(model, device=torch.device("cpu"), sharders=sharders,
                                    plan=hotline_sharding_plan(model, comm.world_size))  # fmt: skip


def torchrec_dmp(comm, kind: str):
    """torchrec's DLRM over its own EmbeddingBagCollection under DMP: tables fused (fbgemm's CPU kernels),
    table-wise (torchrec's CPU sharding), the optimizer given by ``apply_optimizer_in_backward``."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    model = reference_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    apply_optimizer_in_backward(optimizer_type(kind), ebc.parameters(), in_backward_kwargs(kind))
    cons = {
        c.name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
        for c in configs()
    }
    planner = EmbeddingShardingPlanner(
        Topology(world_size=comm.world_size, compute_device="cpu"), constraints=cons
    )
    plan = planner.collective_plan(model, [EmbeddingBagCollectionSharder()])
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    start = reference_model().state_dict()  # torchrec's sharded tables start from their own init: set them
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            for shard in getattr(value, "local_shards", list)():  # views of fbgemm's weights
                (r0, c0), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(start[key][r0 : r0 + rows, c0 : c0 + cols])
    return dmp


def train_steps(comm, dmp, opt, start: int, stop: int, size: int) -> None:
    for s in range(start, stop):
        loss, _ = dmp(batch(s, size, comm.rank, comm.world_size))
        loss.backward()
        opt.step()
        opt.zero_grad()


def train_in_backward(comm, jobs: list[tuple[str, str, int, int, str]]) -> None:
    """Spawned rank: for each (kind, how, steps, global batch, out): the optimizer ``kind`` given by
    ``apply_optimizer_in_backward`` (how ``in_backward``; ``no_plan``: DMP given no plan) or by the sharder's
    ``fused_params`` (``fused_params``), torchrec's usual dense filter, trained plainly; rank 0 saves the result
    (and the dense keys)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    for kind, how, steps, size, out in jobs:
        if how in ("in_backward", "no_plan"):
            dmp = hotline_dmp(comm, kind, plan=how == "in_backward")
        else:
            emb = {"sgd": EmbOptimType.EXACT_SGD, "rowwise-adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                   "adagrad": EmbOptimType.EXACT_ADAGRAD, "adam": EmbOptimType.ADAM}[kind]  # fmt: skip
            fused = {"optimizer": emb, "learning_rate": LR}
            dmp = hotline_dmp(comm, None, {**fused, **({"eps": 1e-10} if kind == "rowwise-adagrad" else {})})
        dense, opt = idiom_optimizer(dmp)
        train_steps(comm, dmp, opt, 0, steps, size)
        save_result(comm, dmp, opt, size, out, dense=sorted(dense))


def check_ranks_agree(comm, out: str) -> None:
    """Spawned rank: (1) ranks that built different initial tables (seed = rank) agree once sharded: the same
    batch gives the same predictions on every rank; (2) an unsharded collection trained on N ranks (DMP without
    Hotline's sharder) is refused by its first training forward. Rank 0 saves both."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    dmp = hotline_dmp(comm, "sgd", seed=comm.rank)
    dmp.eval()
    with torch.no_grad():
        _, (_, logits, _) = dmp(batch(7, 8))  # every rank the whole batch
    every = comm.all_gather_varlen(logits.reshape(-1, 1), "eval")
    model = dlrm(HotlineEmbeddingBagCollection(configs(), placement()))
    unsharded = DistributedModelParallel(model, device=torch.device("cpu"))  # torchrec's default sharders
    try:
        loss, _ = unsharded(batch(0, 8, comm.rank, comm.world_size))
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    if comm.rank == 0:
        torch.save({"logits": [t.reshape(-1) for t in every], "refused": refused}, out)


def train_dcp(comm, jobs: list[tuple]) -> None:
    """Spawned rank: for each (side, kind, start, stop, global batch, load_dir, save_dir, out): torchrec's DLRM
    under DMP (side ``hotline``: Hotline's collection and sharder; ``torchrec``: torchrec's own), the optimizer by
    ``apply_optimizer_in_backward``; loads a torch.distributed.checkpoint of model and optimizer (if
    ``load_dir``), trains steps [start, stop), saves one (if ``save_dir``) and the result (if ``out``)."""
    import torch.distributed.checkpoint as dcp

    for side, kind, start, stop, size, load, save, out in jobs:
        dmp = hotline_dmp(comm, kind) if side == "hotline" else torchrec_dmp(comm, kind)
        _, opt = idiom_optimizer(dmp)
        if load:
            sd = {"model": dmp.state_dict(), "optim": opt.state_dict()}
            dcp.load(sd, checkpoint_id=load)
            dmp.load_state_dict(sd["model"])
            opt.load_state_dict(sd["optim"])
            opt.set_optimizer_step(start)
        train_steps(comm, dmp, opt, start, stop, size)
        if save:
            dcp.save({"model": dmp.state_dict(), "optim": opt.state_dict()}, checkpoint_id=save)
        if out:
            save_result(comm, dmp, opt if side == "hotline" else None, size, out)
