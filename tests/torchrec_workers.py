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
    step: int, size: int
) -> tuple[torch.Tensor, list[np.ndarray], list[np.ndarray], torch.Tensor]:
    """Dense [size, DENSE], ids and lengths per feature [size] (jagged, skewed to low ids), labels."""
    rng = np.random.default_rng(1000 + step)
    dense = torch.from_numpy(rng.random((size, DENSE), dtype=np.float32))
    lengths = [rng.integers(0, 4, size=size) for _ in FEATURES]
    ids = [
        np.minimum(rng.geometric(0.15, size=int(n.sum())) - 1, SIZES[t] - 1)
        for n, t in zip(lengths, FEATURES.values())
    ]
    labels = torch.from_numpy((rng.random(size) < 0.4).astype(np.float32))
    return dense, ids, lengths, labels


def batch(step: int, size: int, rank: int = 0, world: int = 1) -> Batch:
    """Rank ``rank``'s contiguous slice of the global batch of step ``step`` as torchrec's Batch."""
    dense, ids, lengths, labels = global_batch(step, size)
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


def reference_optimizer(model: DLRMTrain, kind: str) -> list[torch.optim.Optimizer]:
    """Plain torch SGD over every parameter; for ``rowwise-adagrad`` torchrec's RowWiseAdagrad on the tables."""
    from torchrec.optim import RowWiseAdagrad

    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    dense = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    if kind == "sgd":
        return [torch.optim.SGD(dense + tables, lr=LR)]
    return [torch.optim.SGD(dense, lr=LR), RowWiseAdagrad(tables, lr=LR)]


def train_reference(kind: str, steps: int, size: int, seed: int = 0) -> DLRMTrain:
    model = reference_model(seed)
    opts = reference_optimizer(model, kind)
    for s in range(steps):
        loss, _ = model(batch(s, size))
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad()
    return model


def hotline_model(kind: str, seed: int = 0, **kwargs) -> DLRMTrain:
    """torchrec's DLRM over Hotline's collection, from the reference's initial state (strict load)."""
    from torchrec.optim import RowWiseAdagrad

    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    ref = reference_model(seed)
    opt_type = torch.optim.SGD if kind == "sgd" else RowWiseAdagrad
    ebc = HotlineEmbeddingBagCollection(configs(), placement(), optimizer_type=opt_type,
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
        state = {k: v.detach().clone() for k, v in dmp.state_dict().items()}
        optim_state = copy.deepcopy(opt.state_dict())
        dmp.eval()
        with torch.no_grad():
            _, (_, logits, _) = dmp(batch(999, size, r, N))
        logits = comm.all_gather_varlen(logits.reshape(-1, 1), "eval")
        if r == 0:
            torch.save({"state": state, "optim": optim_state, "logits": torch.cat(logits).reshape(-1),
                        "refreshed": refreshed}, out)  # fmt: skip
