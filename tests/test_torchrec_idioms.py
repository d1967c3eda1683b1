"""torchrec's usual DMP idioms with Hotline's collection (gloo, CPU), against the one-process torchrec reference of
tests/test_torchrec_dmp.py on the same global batches:

- ``apply_optimizer_in_backward`` (SGD, RowWiseAdagrad, Adagrad, Adam) on the unsharded tables, then DMP with
  Hotline's sharder: the sharded tables train with that optimizer (the constructor's default SGD at lr 0.01
  would leave them far from the reference), inside backward;
- the optimizer named by the sharder's ``fused_params`` instead (torchrec's ``EmbeddingBagCollectionSharder(
  fused_params)``);
- DMP given Hotline's sharder and no plan (torchrec's own planner prices and places Hotline's kernel);
- ``in_backward_optimizer_filter(dmp.named_parameters())`` leaves Hotline's tables out of the dense optimizer,
  and ``CombinedOptimizer([dmp.fused_optimizer, dense])`` keeps working;
- ranks that built different initial tables agree once sharded; an unsharded collection trained on 2 ranks (DMP
  without Hotline's sharder) is refused by its first training forward;
- a collection built on the meta device is materialised on the shards (no rank makes a whole table).
Bounds: torchrec_workers.TOLERANCE (1e-6 relative; Adam 1e-5), as in tests/test_torchrec_dmp.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torchrec_idiom_workers as iw  # noqa: E402
import torchrec_workers as w  # noqa: E402
from ranks import spawn  # noqa: E402
from test_torchrec_dmp import KINDS, assert_matches_reference  # noqa: E402

STEPS, BATCH = 12, 16


@pytest.fixture(scope="module")
def references() -> dict:
    return w.reference_results(KINDS, STEPS, BATCH)


@pytest.mark.parametrize("world", [1, 2])
def test_apply_optimizer_in_backward_and_fused_params_are_honoured_under_dmp(world, references, tmp_path):
    hows = [(kind, "in_backward") for kind in KINDS] + [("rowwise-adagrad", "fused_params")]
    hows.append(
        ("adam", "no_plan")
    )  # DMP(model, sharders=[Hotline's]) with no plan: torchrec's planner plans
    jobs = [(kind, how, STEPS, BATCH, str(tmp_path / f"{kind}_{how}.pt")) for kind, how in hows]
    spawn(world, w.train_in_backward, jobs)
    for kind, _how, _, _, out in jobs:
        got = torch.load(out)
        assert not [k for k in got["dense"] if "embedding_bags" in k], got["dense"]  # the dense filter
        assert len(got["dense"]) == 8
        assert_matches_reference(got, *references[kind], w.TOLERANCE[kind])


def test_ranks_agree_and_an_unsharded_collection_on_two_ranks_is_refused(tmp_path):
    out = str(tmp_path / "agree.pt")
    spawn(2, w.check_ranks_agree, out)
    got = torch.load(out)
    assert torch.equal(got["logits"][0], got["logits"][1])
    assert "training unsharded on rank 0 of 2" in got["refused"]
    assert "HotlineEmbeddingBagCollectionSharder" in got["refused"]


def test_sharder_takes_fused_params_as_torchrecs_and_refuses_what_it_cannot_do():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from hotline.torchrec_bridge import HotlineEmbeddingBagCollection, HotlineEmbeddingBagCollectionSharder
    from hotline.torchrec_bridge.sharding import requested_optimizer

    # positional, as torchrec's EmbeddingBagCollectionSharder(fused_params)
    sharder = HotlineEmbeddingBagCollectionSharder(
        {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}
    )
    ebc = HotlineEmbeddingBagCollection(w.configs(), w.placement())
    assert requested_optimizer(ebc, None) is None  # nothing asked: the constructor's rule stays
    rule = requested_optimizer(ebc, sharder.fused_params)
    assert (rule.kind, rule.lr, rule.eps) == ("rowwise-adagrad", 0.1, 1e-8)  # fbgemm's default eps
    with pytest.raises(
        ValueError, match=r"fused_params \['cache_load_factor'\] are not supported by Hotline's sharder"
    ):
        requested_optimizer(ebc, {"cache_load_factor": 0.2})
    with pytest.raises(ValueError, match="no 'optimizer'"):
        requested_optimizer(ebc, {"learning_rate": 0.1})
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.3})  # wins, as in torchrec
    assert (requested_optimizer(ebc, sharder.fused_params).kind, requested_optimizer(ebc, {}).lr) == (
        "adagrad",
        0.3,
    )
    with pytest.raises(ValueError, match="device='meta'. takes no weights"):
        HotlineEmbeddingBagCollection(w.configs(), device="meta", weights=[None] * 3)
    from torchrec import EmbeddingBagCollection

    meta = HotlineEmbeddingBagCollection.from_embedding_bag_collection(
        EmbeddingBagCollection(w.configs(), device=torch.device("meta")), w.placement()
    )  # torchrec's collection on the meta device: Hotline's is too, rows made by the sharder
    assert meta.device.type == "meta" and {p.device.type for p in meta.parameters()} == {"meta"}
    with pytest.raises(RuntimeError, match="built on the meta device and holds no rows"):
        meta.export_tables()


def test_meta_device_collection_is_materialised_on_the_shards_and_ranks_agree(tmp_path):
    """Built on the meta device (dense layers too), no plan: DMP with Hotline's sharder makes each rank's rows
    with torchrec's sharded init (each rank seeded differently), and every rank's hot replicas come from their
    owners: the same batch gives the same predictions on both ranks, before and after training."""
    out = str(tmp_path / "meta.pt")
    spawn(2, iw.check_meta_construction, out)
    got = torch.load(out)
    assert "built on the meta device and holds no rows" in got["refused"]
    assert got["before_dmp"] == {f"t_{t}": ("meta", (n, w.D)) for t, n in enumerate(w.SIZES)}
    for when in ("initial", "trained"):
        assert torch.equal(got[when][0], got[when][1]), when
    for t, n in enumerate(w.SIZES):
        table = got["tables"][f"model.sparse_arch.embedding_bag_collection.embedding_bags.t_{t}.weight"]
        bound = (1.0 / n) ** 0.5  # torchrec's default weight_init_min / max
        assert table.shape == (n, w.D) and table.abs().max() <= bound
        assert (table != 0).all(), f"t_{t}: rows never materialised (or hot rows not read from their owners)"


def test_hotline_planner_plans_hotline_collections_and_hands_the_rest_to_torchrecs_planner():
    """torchrec's planner cannot price Hotline's kernel; HotlinePlanner (torchrec's planner arguments) plans
    Hotline's collections as hotline_sharding_plan does and every other module with torchrec's planner."""
    import torch.distributed as dist
    from ranks import free_port
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import Topology

    from hotline.distributed.comm import Comm
    from hotline.torchrec_bridge import (
        HotlineEmbeddingBagCollection,
        HotlineEmbeddingBagCollectionSharder,
        HotlinePlanner,
        hotline_sharding_plan,
    )

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = w.dlrm(HotlineEmbeddingBagCollection(w.configs(), w.placement()))
        table = EmbeddingBagConfig(name="u", embedding_dim=4, num_embeddings=10, feature_names=["g"])
        both = torch.nn.ModuleDict(
            {"dlrm": model, "other": EmbeddingBagCollection([table], device=torch.device("meta"))}
        )
        sharders = [HotlineEmbeddingBagCollectionSharder(), EmbeddingBagCollectionSharder()]
        planner = HotlinePlanner(topology=Topology(world_size=1, compute_device="cpu"))
        plan = planner.collective_plan(both, sharders, dist.group.WORLD)
        path = "dlrm.model.sparse_arch.embedding_bag_collection"
        assert sorted(plan.plan) == [path, "other"]
        assert str(plan.plan[path]) == str(hotline_sharding_plan(model, 1).plan[path[5:]])
        assert plan.plan["other"]["u"].compute_kernel != "customized_kernel"  # torchrec's planner chose it
        with pytest.raises(ValueError, match="no HotlineEmbeddingBagCollectionSharder"):
            planner.plan(model, [EmbeddingBagCollectionSharder()])
        dmp = DistributedModelParallel(model, device=torch.device("cpu"), sharders=sharders,
                                       plan=planner.collective_plan(model, sharders, dist.group.WORLD))  # fmt: skip
        _, opt = w.idiom_optimizer(dmp)
        w.train_steps(Comm(), dmp, opt, 0, 2, 8)
        assert dmp.module.model.sparse_arch.embedding_bag_collection.last_stats["lookups"] > 0
    finally:
        dist.destroy_process_group()
