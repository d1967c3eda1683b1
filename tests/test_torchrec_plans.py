"""Plans for whole models: the collections found inside torchrec's DLRM (and a model with two), CPU and CUDA
topologies, torchrec's kernels or Hotline's sharder, and a plan file that loads back into
DistributedModelParallel and trains."""

from __future__ import annotations

import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tb = pytest.importorskip("hotline.torchrec_bridge")

import hotline  # noqa: E402
from hotline.cli import main  # noqa: E402
from tests.test_torchrec_bridge import write_dataset  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]
PATH = "sparse_arch.embedding_bag_collection"


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("plans") / "ds")


@pytest.fixture(scope="module")
def prof(ds):
    return hotline.profile(ds, sample_fraction=0.5, mini_batch_size=64, progress=False)


def dlrm(prof, device="meta"):
    from torchrec import EmbeddingBagCollection
    from torchrec.models.dlrm import DLRM

    configs = tb.embedding_bag_configs(prof.table_sizes, prof.profiler.embedding_dim)
    dim = configs[0].embedding_dim
    return DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=configs, device=torch.device(device)),
                dense_in_features=13, dense_arch_layer_sizes=[16, dim], over_arch_layer_sizes=[16, 1],
                dense_device=torch.device("cpu"))  # fmt: skip


def kernels(sharding_plan) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    assert list(sharding_plan.plan) == [PATH]
    return {
        n: (ps.compute_kernel, ps.sharding_type, tuple(ps.ranks))
        for n, ps in sharding_plan.plan[PATH].items()
    }


@pytest.mark.parametrize("world,device", [(1, "cpu"), (2, "cpu"), (2, "cuda")])
def test_whole_dlrm_plans_for_torchrec_kernels(prof, world, device):
    config = tb.PlanConfig(world_size=world, compute_device=device, hbm_per_device="400KiB")
    sharding_plan, inputs = tb.plan(dlrm(prof), prof, config)
    got = kernels(sharding_plan)
    assert sorted(got) == [f"t_cat_{t}" for t in range(4)]
    if device == "cpu":
        assert {k for k, _, _ in got.values()} == {"fused"}
    else:  # the big, skewed table is cached at Hotline's hot share (or more, after scale-up)
        assert got["t_cat_3"][0] == "fused_uvm_caching"
    assert set(r for _, _, ranks in got.values() for r in ranks) <= set(range(world))
    assert len(tb.plan_summary(sharding_plan, inputs, config)) == 4


@pytest.mark.parametrize("world,device", [(1, "cpu"), (2, "cpu"), (2, "cuda")])
def test_whole_dlrm_plans_for_hotline_sharder(prof, world, device):
    config = tb.PlanConfig(world_size=world, compute_device=device, hbm_per_device="400KiB")
    sharding_plan, inputs = tb.plan(dlrm(prof), prof, config, target="hotline")
    got = kernels(sharding_plan)
    assert set(got.values()) == {("customized_kernel", "row_wise", tuple(range(world)))}
    summary = tb.plan_summary(sharding_plan, inputs, config)
    want = [c.hot_rows * inputs.bytes_per_row if device == "cuda" else 0 for c in inputs.choices]
    assert summary.hbm_bytes.tolist() == want


def test_models_with_several_or_no_collections_and_mismatched_tables(prof):
    from torchrec import EmbeddingBagCollection

    configs = tb.embedding_bag_configs(prof.table_sizes, prof.profiler.embedding_dim)
    meta = torch.device("meta")

    class TwoTower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query = torch.nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=configs[:2], device=meta)})
            self.candidate = EmbeddingBagCollection(tables=configs[2:], device=meta)

    sharding_plan, _ = tb.plan(TwoTower(), prof, tb.PlanConfig(compute_device="cpu"), target="hotline")
    assert sorted(sharding_plan.plan) == ["candidate", "query.ebc"]
    assert sorted(sharding_plan.plan["candidate"]) == ["t_cat_2", "t_cat_3"]
    with pytest.raises(tb.PlanError, match="holds no embedding-bag collection"):
        tb.plan(torch.nn.Linear(2, 2), prof, tb.PlanConfig())
    small = EmbeddingBagCollection(tables=configs[:3], device=meta)
    with pytest.raises(tb.PlanError, match=r"do not match the profile's table sizes \[40, 300, 3, 20000\]"):
        tb.plan(small, prof, tb.PlanConfig())
    with pytest.raises(ValueError, match="target must be one of"):
        tb.plan(dlrm(prof), prof, tb.PlanConfig(), target="gpu")


@pytest.mark.parametrize("missing", [0, 2, 3])
def test_hotline_sharder_refuses_a_plan_missing_any_table(missing):
    """A plan for Hotline's collection with no entry for one of its tables (the first, a middle one, the last)
    is refused by the sharder, naming the table, before anything is sharded."""
    from torchrec.distributed.types import ShardingEnv

    configs = tb.embedding_bag_configs([40, 300, 3, 20], 8)
    ebc = tb.HotlineEmbeddingBagCollection(configs)
    whole = tb.hotline_sharding_plan(ebc, world_size=1).plan[""]
    assert list(whole) == [c.name for c in configs]
    name = configs[missing].name
    partial = type(whole)({k: v for k, v in whole.items() if k != name})
    with pytest.raises(ValueError, match=f"the sharding plan of {PATH} has no entry for table '{name}'"):
        tb.HotlineEmbeddingBagCollectionSharder().shard(
            ebc, partial, ShardingEnv(world_size=1, rank=0), module_fqn=PATH
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_plan_file_round_trip_into_dmp_with_hotline_sharder(ds, prof, tmp_path):
    """plan.json (module paths, kernels, shards) and plan.hot_rows.npz load back: the hot rows build Hotline's
    collection at the planned path, the plan shards it in DistributedModelParallel, and it trains."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM

    config = tb.PlanConfig(world_size=1, compute_device="cpu", hbm_per_device="100KiB")  # some rows stay cold
    sharding_plan, inputs = tb.plan(dlrm(prof), prof, config, target="hotline")
    plan_path, side = tb.export_plan(tmp_path / "plan.json", sharding_plan, inputs, config)
    loaded = tb.load_plan(plan_path)
    assert kernels(loaded) == kernels(sharding_plan)
    hot = tb.load_hot_rows(side, dataset=ds)
    assert all(np.array_equal(a, b) for a, b in zip(hot.hot_ids, inputs.placement.hot_ids))

    # the two lines of a torchrec script that change: the collection, and the sharders
    ebc = tb.HotlineEmbeddingBagCollection(inputs.configs, hot.to_placement(), optimizer_type=torch.optim.SGD,
                                           optimizer_kwargs={"lr": 0.05})  # fmt: skip
    dim = inputs.configs[0].embedding_dim
    torch.manual_seed(0)
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, dim],
                 over_arch_layer_sizes=[16, 1])  # fmt: skip
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), plan=loaded,
                                       sharders=[tb.HotlineEmbeddingBagCollectionSharder()],
                                       device=torch.device("cpu"))  # fmt: skip
        assert isinstance(
            dmp.module.sparse_arch.embedding_bag_collection, tb.ShardedHotlineEmbeddingBagCollection
        )
        dense = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n]
        opt = torch.optim.SGD(dense, lr=0.05)
        batch = prof.dataset.train.batch(0, 32)
        kjt = tb.kjt_from_sparse(batch.sparse, [c.feature_names[0] for c in inputs.configs])
        dense_x, labels = torch.from_numpy(batch.dense), torch.from_numpy(batch.labels)
        losses = []
        for _ in range(3):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(dense_x, kjt).squeeze(1), labels)
            loss.backward()
            opt.step()
            dmp.fused_optimizer.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert np.isfinite(losses).all() and losses[-1] < losses[0]
        stats = dmp.module.sparse_arch.embedding_bag_collection.last_stats
        assert 0 < stats["hot_lookups"] < stats["lookups"]

        # a plan for torchrec's kernels is refused by name
        torchrec_plan, _ = tb.plan(dlrm(prof), prof, config)
        with pytest.raises(ValueError, match="Hotline's sharder needs sharding type 'row_wise'.*'fused'"):
            tb.HotlineEmbeddingBagCollectionSharder().shard(
                tb.HotlineEmbeddingBagCollection(inputs.configs), torchrec_plan.plan[PATH],
                ShardingEnv.from_process_group(dist.group.WORLD), module_fqn=PATH)  # fmt: skip
    finally:
        dist.destroy_process_group()


def test_cli_plans_for_hotline_sharder(ds, tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", str(ds.path), "--target", "hotline", "--compute-device", "cpu", "--sample-fraction", "0.5",
               "--mini-batch-size", "64", "--out", str(out), "--no-progress"])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0 and "Hotline's sharder" in text and "customized_kernel" in text
    assert kernels(tb.load_plan(out))["t_cat_3"] == ("customized_kernel", "row_wise", (0,))
