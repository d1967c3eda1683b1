"""The torchrec bridge: reuse-distance kernel against its twin, cache statistics from a profile, constraints
and plans from torchrec's real planner (CUDA and CPU topologies), plan files, the CLI, and a DMP step."""

from __future__ import annotations

import collections
import json
import socket

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from small_data import write_zipf_dataset

import hotline
from hotline.cli import main
from hotline.kernels.reuse import lru_hit_counts, stack_distances
from tests import naive

tb = pytest.importorskip("hotline.torchrec_bridge")

# torch.jit deprecations raised inside fbgemm/torchrec code, and DMP's own FutureWarning: not ours to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning"),
]

SIZES = [40, 300, 3, 20000]


def write_dataset(out, n=3000, table_sizes=SIZES, pooling_factor=2, seed=0, s=1.1):
    """Bounded-Zipf ids per table with hot rows scattered by a permutation (as the profiler tests use)."""
    return write_zipf_dataset(out, n, table_sizes, pooling_factor, seed, s)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("trec") / "ds")


@pytest.fixture(scope="module")
def prof(ds):
    return hotline.profile(ds, sample_fraction=0.5, mini_batch_size=64, progress=False)


@pytest.fixture(scope="module")
def cuda_config():
    return tb.PlanConfig(world_size=2, hbm_per_device="400KiB", compute_device="cuda")


@pytest.fixture(scope="module")
def cuda_inputs(prof, cuda_config):
    return tb.constraints_from_profile(prof, cuda_config)


# ---------------------------------------------------------------- kernel vs twin
@pytest.mark.parametrize(
    "trace",
    [[], [7], [3, 3, 3], [1, 2, 3, 4], [1, 2, 1, 3, 2, 1, 1], [10**12, -5, 10**12, 0, -5]],
)
def test_stack_distances_match_twin(trace):
    assert np.array_equal(stack_distances(np.array(trace, dtype=np.int64)), naive.lru_stack_distances(trace))


traces_2d = st.tuples(st.integers(1, 3), st.integers(0, 40), st.integers(1, 10)).flatmap(
    lambda tnk: st.lists(
        st.lists(st.integers(0, tnk[2] - 1), min_size=tnk[1], max_size=tnk[1]),
        min_size=tnk[0],
        max_size=tnk[0],
    )
)


@settings(max_examples=30, deadline=None)
@given(traces_2d)
def test_stack_distances_of_tables_match_twin(rows):
    traces = np.array(rows, dtype=np.int32).reshape(len(rows), -1)
    d = stack_distances(traces)
    for t in range(len(rows)):
        assert np.array_equal(d[t], naive.lru_stack_distances(traces[t]))
        hits = lru_hit_counts(d[t])
        for c in range(12):
            misses = traces.shape[1] - hits[min(c, hits.size - 1)]
            assert misses == naive.lru_misses(traces[t], c)


def test_stack_distances_reject_bad_input():
    with pytest.raises(ValueError, match="integer ids"):
        stack_distances(np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match=r"\[n\] or \[T, n\]"):
        stack_distances(np.zeros((2, 2, 2), np.int64))


# ---------------------------------------------------------------- statistics from the profile
def test_lfu_miss_rate_is_one_minus_the_coverage_curve(prof):
    stats = tb.cache_stats(prof, "lfu", global_batch_size=64)
    for budget in [0, 640, 6400, 64_000]:
        table = prof.table_stats(budget)
        for t, s in enumerate(stats):
            hot, rows = int(table.hot_rows[t]), SIZES[t]
            # the global top-k restricted to a table is that table's top rows: LFU at that size
            assert s.expected_miss_rate((hot + 0.5) / rows) == pytest.approx(
                1.0 - table.coverage[t], abs=1e-12
            )
    for s in stats:
        assert s.expected_miss_rate(0.0) == 1.0 and s.expected_miss_rate(1.0) == 0.0
        assert 0.0 < s.cacheability < 1.0


def test_lru_miss_rate_is_a_simulated_lru_cache(prof):
    stats = tb.cache_stats(prof, "lru", global_batch_size=64)
    trace = tb.sampled_trace(prof)
    assert trace.shape == (prof.num_samples, len(SIZES), 2)
    for t in (1, 3):
        ids = trace[:, t, :].reshape(-1)
        for cache_rows in (1, 7, 60, 299):
            clf = (cache_rows + 0.5) / SIZES[t]
            expect = naive.lru_misses(ids, cache_rows) / ids.size
            assert stats[t].expected_miss_rate(clf) == pytest.approx(expect, abs=1e-12)
    rates = [stats[3].expected_miss_rate(x) for x in np.linspace(0, 1, 21)]
    assert all(a >= b for a, b in zip(rates, rates[1:])), "miss rate must not grow with the cache"


def test_expected_lookups_agree_with_the_profile_curve(prof):
    unique = tb.expected_unique_lookups(prof, 64)
    assert unique.sum() == pytest.approx(prof.curve([0], batch_size=64).expected_unique_rows_per_batch[0])
    assert (unique <= np.minimum(64 * 2, SIZES) + 1e-9).all()


def test_stats_reject_inconsistent_curves():
    with pytest.raises(ValueError, match="non-decreasing"):
        tb.HotlineCacheStats(10, np.array([0, 5, 3]), 10, 1.0)
    with pytest.raises(ValueError, match="more than"):
        tb.HotlineCacheStats(10, np.array([0, 11]), 10, 1.0)


def test_plan_config_checks_fields():
    with pytest.raises(ValueError, match="world_size"):
        tb.PlanConfig(world_size=0)
    with pytest.raises(ValueError, match="cannot read"):
        tb.PlanConfig(hbm_per_device="lots")
    with pytest.raises(ValueError, match="compute_device"):
        tb.PlanConfig(compute_device="tpu")
    with pytest.raises(ValueError, match="algorithm"):
        tb.PlanConfig(algorithm="fifo")
    with pytest.raises(ValueError, match="hot_budget_share"):
        tb.PlanConfig(hot_budget_share=0.0)


# ---------------------------------------------------------------- constraints and plans
def test_constraints_keep_small_tables_whole_and_cache_the_big_one(prof, cuda_config, cuda_inputs):
    placement = cuda_inputs.placement
    assert placement.hot_bytes <= cuda_config.hot_budget
    kinds = {c.name: c for c in cuda_inputs.choices}
    for name in ("t_cat_0", "t_cat_2"):
        assert kinds[name].kernel == "fused" and kinds[name].hot_rows == kinds[name].rows
        assert cuda_inputs.constraints[name].cache_params is None
    big = kinds["t_cat_3"]
    assert big.kernel == "fused_uvm_caching"
    assert big.load_factor == pytest.approx(placement.hot_ids[3].size / SIZES[3])
    cp = cuda_inputs.constraints["t_cat_3"].cache_params
    assert cp.load_factor == big.load_factor and cp.stats is big.stats and cp.algorithm.name == "LRU"
    assert cuda_inputs.constraints["t_cat_3"].compute_kernels == ["fused_uvm_caching"]


def test_plans_for_cuda_and_cpu_topologies(prof, cuda_config, cuda_inputs):
    sp = tb.plan(cuda_inputs, cuda_config)
    shardings = tb.parameter_shardings(sp)
    assert sorted(shardings) == [f"t_cat_{t}" for t in range(4)]
    _, big = shardings["t_cat_3"]
    assert big.compute_kernel == "fused_uvm_caching"
    # the scale-up proposer starts from Hotline's hot share and only grows caches
    assert big.cache_params.load_factor >= cuda_inputs.choices[3].load_factor - 1e-9
    assert {ps.compute_kernel for n, (_, ps) in shardings.items() if n != "t_cat_3"} == {"fused"}
    summary = tb.plan_summary(sp, cuda_inputs, cuda_config)
    lf = big.cache_params.load_factor
    assert summary.expected_hit_rate[3] == pytest.approx(
        1 - cuda_inputs.choices[3].stats.expected_miss_rate(lf)
    )
    assert summary.hbm_bytes[3] == int(np.ceil(lf * SIZES[3])) * prof.bytes_per_row

    cpu = tb.PlanConfig(world_size=1, compute_device="cpu")
    cpu_inputs = tb.constraints_from_profile(prof, cpu, placement=cuda_inputs.placement)
    assert all(c.kernel == "fused" and c.load_factor is None for c in cpu_inputs.choices)
    cpu_plan = tb.parameter_shardings(tb.plan(cpu_inputs, cpu))
    assert sorted(cpu_plan) == sorted(shardings)
    assert all(ps.compute_kernel == "fused" and ps.ranks == [0] for _, ps in cpu_plan.values())


class RecordingStats(tb.HotlineCacheStats):
    """Our statistics, counting which of torchrec's CacheStatistics members the planner reads."""

    def __init__(self, base: tb.HotlineCacheStats):
        super().__init__(base.rows, base.hits, base.accesses, base.expected_lookups, base.algorithm)
        self.calls = collections.Counter()

    @property
    def expected_lookups(self) -> float:
        self.calls["expected_lookups"] += 1
        return super().expected_lookups

    def expected_miss_rate(self, clf: float) -> float:
        if hasattr(self, "calls"):
            self.calls["expected_miss_rate"] += 1
        return super().expected_miss_rate(clf)

    @property
    def cacheability(self) -> float:
        self.calls["cacheability"] += 1
        return super().cacheability


def test_planner_reads_the_cache_statistics(prof, cuda_config):
    inputs = tb.constraints_from_profile(prof, cuda_config)
    recorder = RecordingStats(inputs.choices[3].stats)
    inputs.constraints["t_cat_3"].cache_params.stats = recorder
    tb.plan(inputs, cuda_config)
    assert recorder.calls["expected_miss_rate"] > 0, "the perf estimator asks for the miss rate"
    assert recorder.calls["expected_lookups"] > 0
    assert recorder.calls["cacheability"] > 0, "the scale-up proposer ranks caches by cacheability"


# ---------------------------------------------------------------- files
def test_plan_file_and_side_car_round_trip(ds, prof, cuda_config, cuda_inputs, tmp_path):
    sp = tb.plan(cuda_inputs, cuda_config)
    plan_path, side = tb.export_plan(tmp_path / "plan.json", sp, cuda_inputs, cuda_config)
    assert side == tmp_path / "plan.hot_rows.npz"
    doc = json.loads(plan_path.read_text())
    assert [t["name"] for t in doc["tables"]] == [f"t_cat_{t}" for t in range(4)]
    assert doc["dataset_fingerprint"] == ds.fingerprint and doc["hot_rows_file"] == side.name

    loaded = tb.load_plan(plan_path)
    assert loaded._serialize() == sp._serialize()
    for name, (_, ps) in tb.parameter_shardings(sp).items():
        _, back = tb.parameter_shardings(loaded)[name]
        if ps.cache_params is None:
            assert back.cache_params is None
        else:
            assert back.cache_params.algorithm == ps.cache_params.algorithm
            assert back.cache_params.load_factor == pytest.approx(ps.cache_params.load_factor)

    hot = tb.load_hot_rows(side, dataset=ds)
    assert hot.table_names == [f"t_cat_{t}" for t in range(4)] and hot.table_sizes == SIZES
    for a, b in zip(hot.hot_ids, cuda_inputs.placement.hot_ids):
        assert a.dtype == np.int64 and np.array_equal(a, b)
    again = hot.to_placement()
    assert again.dataset_fingerprint == ds.fingerprint
    assert all(np.array_equal(a, b) for a, b in zip(again.remap, cuda_inputs.placement.remap))

    other = write_dataset(tmp_path / "other", n=200, seed=1)
    with pytest.raises(tb.PlanError, match="fingerprint"):
        tb.load_hot_rows(side, dataset=other)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(tb.PlanError, match="corrupt"):
        tb.load_hot_rows(tmp_path / "bad.npz")
    with pytest.raises(tb.PlanError, match="does not exist"):
        tb.load_hot_rows(tmp_path / "missing.npz")
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(tb.PlanError, match="format"):
        tb.load_plan(tmp_path / "bad.json")


def test_cli_plan_prints_every_table_and_writes_files(ds, prof, tmp_path, capsys):
    placement_path = prof.placement(64 * 1000).save(tmp_path / "placement.npz")
    out = tmp_path / "plan.json"
    rc = main(
        ["plan", str(ds.path), "--placement", str(placement_path), "--world-size", "2", "--hbm-per-gpu",
         "400KiB", "--sample-fraction", "0.5", "--mini-batch-size", "64", "--out", str(out), "--no-progress"]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0
    for t in range(4):
        assert f"t_cat_{t}" in text
    assert "fused_uvm_caching" in text and "hit rate" in text and "HBM" in text
    doc = json.loads(out.read_text())
    assert len(doc["tables"]) == 4
    hot = tb.load_hot_rows(tmp_path / "plan.hot_rows.npz", dataset=ds)
    placement = hotline.Placement.load(placement_path)
    assert all(np.array_equal(a, b) for a, b in zip(hot.hot_ids, placement.hot_ids))

    rc = main(["plan", str(ds.path), "--world-size", "0", "--no-progress"])
    assert rc == 2 and "world_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", str(ds.path), "--hbm-per-gpu", "lots"])


# ---------------------------------------------------------------- DistributedModelParallel
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cpu_plan_trains_under_distributed_model_parallel(prof):
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from hotline.torchrec_bridge.module import kjt_from_sparse

    config = tb.PlanConfig(world_size=1, compute_device="cpu", batch_size=8)
    inputs = tb.constraints_from_profile(prof, config)
    torch.manual_seed(0)
    dim = inputs.configs[0].embedding_dim
    model = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=inputs.configs, device=torch.device("meta")),
        dense_in_features=13,
        dense_arch_layer_sizes=[16, dim],
        over_arch_layer_sizes=[16, 1],
        dense_device=torch.device("cpu"),
    )
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.parameters(), {"lr": 0.05})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        sharding_plan = tb.plan(inputs, config, module=model)
        assert "sparse_arch.embedding_bag_collection" in sharding_plan.plan
        dmp = DistributedModelParallel(
            module=model,
            env=ShardingEnv.from_process_group(dist.group.WORLD),
            plan=sharding_plan,
            sharders=[EmbeddingBagCollectionSharder()],
            device=torch.device("cpu"),
        )
        dense_params = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n]
        opt = torch.optim.SGD(dense_params, lr=0.05)
        batch = prof.dataset.train.batch(0, 8)
        kjt = kjt_from_sparse(batch.sparse, [c.feature_names[0] for c in inputs.configs])
        dense, labels = torch.from_numpy(batch.dense), torch.from_numpy(batch.labels)
        losses = []
        for _ in range(2):
            logits = dmp(dense, kjt).squeeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert np.isfinite(losses).all() and losses[1] < losses[0]
    finally:
        dist.destroy_process_group()
