"""Spawned-rank workers of the torchrec idiom tests (meta-device construction, torchrec's train pipeline against
torchrec's sharded EBC), over the models and batches of ``torchrec_workers`` (a helper module, not a test file)."""

from __future__ import annotations

import torch
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec_workers import (
    DENSE,
    D,
    batch,
    configs,
    full,
    hotline_dmp,
    idiom_optimizer,
    in_backward_kwargs,
    optimizer_type,
    placement,
    save_result,
    torchrec_dmp,
    train_steps,
)


def check_meta_construction(comm, out: str) -> None:
    """Spawned rank: torchrec's DLRM built on the meta device over Hotline's collection, RowWiseAdagrad by
    ``apply_optimizer_in_backward``, DMP with Hotline's sharder and no plan, torch seeded by rank. Rank 0 saves the
    forward refused before DMP, the parameters' devices and shapes before it, the tables after it (gathered), and
    every rank's predictions of one whole batch, initially and after 3 training steps."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection
    from hotline.torchrec_bridge.sharding import HotlineEmbeddingBagCollectionSharder

    torch.manual_seed(100 + comm.rank)
    meta = torch.device("meta")
    ebc = HotlineEmbeddingBagCollection(configs(), placement(), device=meta)
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE, dense_arch_layer_sizes=[16, D],
                           over_arch_layer_sizes=[16, 1], dense_device=meta))  # fmt: skip
    before = {n.split(".")[-2]: (p.device.type, tuple(p.shape)) for n, p in ebc.named_parameters()}
    try:
        ebc(batch(0, 8).sparse_features)
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    apply_optimizer_in_backward(
        optimizer_type("rowwise-adagrad"), ebc.parameters(), in_backward_kwargs("rowwise-adagrad")
    )
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), sharders=[HotlineEmbeddingBagCollectionSharder()]
    )
    tables = {k: full(v, comm.rank) for k, v in dmp.state_dict().items() if "embedding_bags" in k}

    def predictions() -> list[torch.Tensor]:
        dmp.eval()
        with torch.no_grad():
            _, (_, logits, _) = dmp(batch(7, 8))  # every rank the whole batch
        dmp.train()
        return [t.reshape(-1) for t in comm.all_gather_varlen(logits.reshape(-1, 1), "eval")]

    initial = predictions()
    _, opt = idiom_optimizer(dmp)
    train_steps(comm, dmp, opt, 0, 3, 8)
    trained = predictions()
    if comm.rank == 0:
        torch.save({"refused": refused, "before_dmp": before, "tables": tables, "initial": initial,
                    "trained": trained}, out)  # fmt: skip


def train_pipelined(comm, jobs: list[tuple]) -> None:
    """Spawned rank: for each (side, kind, order, steps, global batch, out): torchrec's DLRM under DMP (side
    ``hotline``: Hotline's collection and sharder; ``torchrec``: torchrec's sharded EBC), the tables' optimizer by
    ``apply_optimizer_in_backward``, trained through torchrec's TrainPipelineSparseDist on the global batches
    (samples permuted by ``order``, None: as made); rank 0 saves the result and every step's global loss."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    for side, kind, order, steps, size, out in jobs:
        dmp = hotline_dmp(comm, kind) if side == "hotline" else torchrec_dmp(comm, kind)
        _, opt = idiom_optimizer(dmp)
        pipe = TrainPipelineSparseDist(dmp, opt, torch.device("cpu"))
        it = iter([batch(s, size, comm.rank, comm.world_size, order) for s in range(steps)])
        losses = []
        for _ in range(steps):
            loss = pipe.progress(it)[0]  # DLRMTrain's (loss, logits, labels), as the pipeline returns them
            losses.append(comm.all_gather_varlen(loss.detach().reshape(1, 1), "loss"))
        pipe.detach()
        losses = [float(torch.cat(ls).mean()) for ls in losses]  # equal slices: the global batch's mean
        save_result(comm, dmp, None, size, out, losses=losses)
