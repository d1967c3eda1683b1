"""The popularity profiler: counting kernels against their twins, sampling, curves, summary and CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from small_data import write_zipf_dataset

import hotline
from hotline.cli import main
from hotline.datasets.format import DatasetError
from hotline.kernels import profile as kp
from hotline.placement import Placement
from hotline.profiling.profiler import Profiler
from tests import naive


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return write_zipf_dataset(
        tmp_path_factory.mktemp("ds") / "small", 3000, [50, 400, 3, 2000], pooling_factor=2
    )


def sampled_sparse(prof) -> np.ndarray:
    split = prof.dataset.split(prof.profiler.split)
    if prof.sample_indices is None:
        return np.asarray(split.sparse[: prof.num_samples])
    return np.asarray(split.sparse[prof.sample_indices])


# ---------------------------------------------------------------- kernels vs twins

sparse_cases = st.integers(1, 4).flatmap(
    lambda T: st.tuples(
        st.lists(st.integers(1, 6), min_size=T, max_size=T),
        st.integers(0, 30),
        st.integers(1, 3),
        st.integers(0, 2**31 - 1),
    )
)


def random_sparse(sizes, n, L, seed):
    rng = np.random.default_rng(seed)
    return (
        np.stack([rng.integers(0, s, size=(n, L)) for s in sizes], axis=1)
        .astype(np.int32)
        .reshape(n, len(sizes), L)
    )


@settings(max_examples=30, deadline=None)
@given(sparse_cases, st.integers(1, 9), st.sampled_from(["private", "owned", None]))
def test_lookup_counts_match_twin(case, num_slots, method):
    sizes, n, L, seed = case
    sparse = random_sparse(sizes, n, L, seed)
    counts = np.zeros(sum(sizes), dtype=np.int64)
    kp.count_lookups(sparse[: n // 2], sizes, counts, num_slots, method)  # accumulates over chunks
    kp.count_lookups(sparse[n // 2 :], sizes, counts, num_slots, method)
    np.testing.assert_array_equal(counts, naive.profile_lookup_counts(sparse, sizes))


@pytest.mark.parametrize("num_slots", [1, 2, 3, 16])
def test_count_work_plan_tiles_every_table_once(num_slots):
    sizes = [5, 1, 0, 40, 7]
    item_table, lo, hi, ptr = kp.plan_count_work(sizes, num_slots)
    assert ptr[0] == 0 and ptr[-1] == len(item_table) and len(ptr) == num_slots + 1
    for t, size in enumerate(sizes):
        ranges = sorted(
            (int(a), int(b)) for a, b in zip(lo[item_table == t], hi[item_table == t], strict=True)
        )
        covered = [r for a, b in ranges for r in range(a, b)]
        assert covered == list(range(size))
    if num_slots <= 2:
        assert len(item_table) == len(sizes)  # enough tables: whole tables per thread
    sparse = random_sparse([5, 1, 1, 40, 7], 200, 2, 0)
    sparse[:, 2] = 0
    sizes = [5, 1, 1, 40, 7]
    np.testing.assert_array_equal(
        kp.lookup_counts(sparse, sizes, num_slots), naive.profile_lookup_counts(sparse, sizes)
    )


@settings(max_examples=30, deadline=None)
@given(sparse_cases)
def test_sample_max_rank_matches_twin(case):
    sizes, n, L, seed = case
    sparse = random_sparse(sizes, n, L, seed)
    rank = np.random.default_rng(seed + 1).permutation(sum(sizes)).astype(np.int64)
    expect = naive.profile_sample_max_rank(sparse, sizes, rank)
    np.testing.assert_array_equal(kp.sample_max_rank(sparse, sizes, rank), expect)
    np.testing.assert_array_equal(kp.sample_max_rank(sparse, sizes, rank.astype(np.int32)), expect)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=50), st.sampled_from([np.int64, np.uint16]))
def test_add_histogram_matches_twin(values, dtype):
    hist = np.arange(10, dtype=dtype)
    expect = naive.profile_add_histogram(values, hist)
    kp.add_histogram(np.array(values, dtype=np.int64), hist)
    np.testing.assert_array_equal(hist, expect)
    assert hist.dtype == dtype
    with pytest.raises(ValueError, match="int64 or uint16"):
        kp.add_histogram(np.array(values, dtype=np.int64), hist.astype(np.int32))


def test_kernels_match_twins_over_several_sample_blocks():
    sizes = [7, 300, 2]
    sparse = random_sparse(sizes, 3 * kp.BLOCK + 17, 2, 9)
    sparse[kp.BLOCK + 3, 1, 1] = 299
    rank = np.random.default_rng(1).permutation(sum(sizes))
    for method in ("private", "owned"):
        np.testing.assert_array_equal(
            kp.lookup_counts(sparse, sizes, method=method), naive.profile_lookup_counts(sparse, sizes)
        )
    np.testing.assert_array_equal(
        kp.sample_max_rank(sparse, sizes, rank), naive.profile_sample_max_rank(sparse, sizes, rank)
    )
    sparse[2 * kp.BLOCK + 5, 2, 0] = 2
    sparse[2 * kp.BLOCK + 9, 0, 1] = -3
    for method in ("private", "owned"):
        with pytest.raises(kp.BadIdError, match=f"sample {2 * kp.BLOCK + 5}, table 2, lookup 0: row id 2"):
            kp.lookup_counts(sparse, sizes, method=method)
    with pytest.raises(kp.BadIdError, match=f"sample {2 * kp.BLOCK + 5}, table 2"):
        kp.sample_max_rank(sparse, sizes, rank)


def test_kernels_on_empty_and_two_dimensional_input():
    sizes = [3, 4]
    empty = np.zeros((0, 2, 1), dtype=np.int32)
    assert kp.lookup_counts(empty, sizes).tolist() == [0] * 7
    assert kp.sample_max_rank(empty, sizes, np.arange(7)).shape == (0,)
    one_hot = np.array([[2, 0], [2, 3]], dtype=np.int64)  # [n, T] is read as L = 1
    assert kp.lookup_counts(one_hot, sizes).tolist() == [0, 0, 2, 1, 0, 0, 1]
    assert kp.sample_max_rank(one_hot, sizes, np.arange(7)).tolist() == [3, 6]
    assert kp.lookup_counts(np.zeros((5, 0, 1), np.int32), []).shape == (0,)


@pytest.mark.parametrize("bad", [-1, 4])
@pytest.mark.parametrize("num_slots", [1, 2, 5])
@pytest.mark.parametrize("method", ["private", "owned"])
def test_kernels_name_an_out_of_range_id(bad, num_slots, method):
    sparse = np.array([[[0], [1]], [[2], [bad]], [[3], [0]]], dtype=np.int32)
    with pytest.raises(kp.BadIdError, match=rf"sample 1, table 1, lookup 0: row id {bad} .*0 <= id < 4"):
        kp.lookup_counts(sparse, [3, 4], num_slots, method)
    with pytest.raises(ValueError, match="sample 0, table 0, lookup 0: row id 3"):
        kp.lookup_counts(sparse[2:], [3, 4], num_slots, method)
    with pytest.raises(ValueError, match="sample 1, table 1"):
        kp.sample_max_rank(sparse, [3, 4], np.arange(7))
    with pytest.raises(ValueError, match="shape"):
        kp.lookup_counts(sparse, [3, 4, 5])


# ---------------------------------------------------------------- sampling


def test_fraction_sample_is_seeded_uniform_without_replacement():
    p = Profiler(sample_fraction=0.1, seed=3, progress=False)
    idx = p.sample_indices(1000)
    assert idx.shape == (100,) and np.all(np.diff(idx) > 0) and idx.min() >= 0 and idx.max() < 1000
    np.testing.assert_array_equal(idx, Profiler(sample_fraction=0.1, seed=3).sample_indices(1000))
    assert not np.array_equal(idx, Profiler(sample_fraction=0.1, seed=4).sample_indices(1000))
    assert Profiler(sample_fraction=1.0).sample_indices(1000) is None  # the whole split, in order
    assert Profiler(sample_fraction=1e-9).sample_size(1000) == 1


def test_batches_sample_is_the_first_mini_batches(small):
    prof = hotline.profile(small, sample_batches=3, mini_batch_size=100, progress=False)
    assert prof.num_samples == 300 and prof.sample_indices is None
    expect = naive.profile_lookup_counts(np.asarray(small.train.sparse[:300]), small.table_sizes)
    np.testing.assert_array_equal(prof.counts, expect)
    assert (
        hotline.profile(small, sample_batches=1000, mini_batch_size=100, progress=False).num_samples == 3000
    )


@pytest.mark.parametrize(
    "bad",
    [
        dict(sample_fraction=0.0),
        dict(sample_fraction=1.5),
        dict(sample_batches=0),
        dict(mini_batch_size=0),
        dict(optimizer="lamb"),
        dict(embedding_dim=0),
    ],
)
def test_profiler_rejects_bad_settings(bad):
    with pytest.raises(ValueError):
        Profiler(**bad)


# ---------------------------------------------------------------- profile figures vs independent computations


@pytest.mark.parametrize("chunk_size", [7, 65536])
@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_counts_match_twin_on_the_sample(small, chunk_size, cache_bytes, monkeypatch):
    # cache_bytes 0: the ranking and evaluate passes re-read the sample from the memory map
    monkeypatch.setattr("hotline.profiling.profiler._CACHE_SAMPLE_BYTES", cache_bytes)
    prof = Profiler(sample_fraction=0.3, seed=1, chunk_size=chunk_size, progress=False).profile(small.path)
    assert prof.num_samples == 900
    np.testing.assert_array_equal(
        prof.counts, naive.profile_lookup_counts(sampled_sparse(prof), small.table_sizes)
    )
    assert prof.counts.sum() == prof.total_lookups == 900 * 4 * 2
    max_rank = naive.profile_sample_max_rank(
        sampled_sparse(prof), small.table_sizes, prof.rank.astype(np.int64)
    )
    k = 25
    assert prof.curve([k * prof.bytes_per_row]).popular_sample_share[0] == np.mean(max_rank < k)
    assert prof.evaluate(prof.placement(k * prof.bytes_per_row))["popular_sample_share"] == np.mean(
        max_rank < k
    )


def test_ranking_is_by_count_then_table_then_row(small):
    prof = hotline.profile(small, sample_fraction=0.2, progress=False)
    c = prof.counts[prof.order]
    assert np.all(c > 0) and prof.num_accessed == np.count_nonzero(prof.counts)
    assert np.all((c[:-1] > c[1:]) | ((c[:-1] == c[1:]) & (prof.order[:-1] < prof.order[1:])))


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_curve_matches_a_per_sample_naive_check(small, fraction):
    prof = hotline.profile(small, sample_fraction=fraction, mini_batch_size=16, progress=False)
    sparse = sampled_sparse(prof)
    offsets = np.concatenate([[0], np.cumsum(small.table_sizes)])
    fused = sparse + offsets[:-1][None, :, None]
    bpr = prof.bytes_per_row
    rows = [0, 1, 2, 17, prof.num_accessed - 1, prof.num_accessed, prof.num_accessed + 50]
    curve = prof.curve([k * bpr for k in rows] + [bpr + bpr // 2])
    for k, line in zip(rows + [1], curve.itertuples(), strict=True):
        hot = set(prof.order[: min(k, prof.num_accessed)].tolist())
        popular = sum(all(int(f) in hot for f in sample.ravel()) for sample in fused)
        covered = sum(int(f) in hot for f in fused.ravel())
        assert line.hot_rows == min(k, prof.num_accessed)
        assert line.popular_sample_share == popular / len(fused)
        assert line.access_coverage == covered / fused.size
        # E[unique cold rows] = sum over cold rows of 1 - (1 - p)^(B*L), p = count / lookups of the table
        p = np.array([prof.counts[f] for f in range(offsets[-1]) if f not in hot]) / (len(fused) * 2)
        assert line.expected_cold_rows_per_batch == pytest.approx(np.sum(1 - (1 - p) ** (16 * 2)), rel=1e-9)
        assert line.hotline_bytes_per_batch == pytest.approx(line.expected_cold_rows_per_batch * bpr)
        assert line.hybrid_bytes_per_batch == 16 * 4 * 2 * bpr
    assert curve.popular_sample_share.iloc[6] == 1.0 and curve.access_coverage.iloc[6] == 1.0
    assert curve.expected_cold_rows_per_batch.iloc[6] == 0.0 and curve.hot_rows.iloc[-1] == 1
    assert curve.popular_sample_share.iloc[0] == 0.0 and curve.access_coverage.iloc[0] == 0.0


def test_expected_unique_rows_match_simulated_mini_batches(tmp_path):
    ds = write_zipf_dataset(tmp_path / "d", 4000, [30, 300], seed=5)
    prof = hotline.profile(ds, sample_fraction=1.0, mini_batch_size=32, progress=False)
    curve = prof.curve([0, 20 * prof.bytes_per_row])
    # Mini-batches drawn i.i.d. from the sample's empirical distribution: the mean unique count converges.
    rng = np.random.default_rng(0)
    sparse = np.asarray(ds.train.sparse)[:, :, 0] + np.array([0, 30])
    hot = set(prof.order[:20].tolist())
    draws = [sparse[rng.integers(0, 4000, 32)] for _ in range(3000)]
    unique = np.mean([len(np.unique(d)) for d in draws])
    cold = np.mean([len({int(f) for f in np.unique(d)} - hot) for d in draws])
    assert curve.expected_cold_rows_per_batch[0] == pytest.approx(unique, rel=0.02)
    assert curve.expected_cold_rows_per_batch[1] == pytest.approx(cold, rel=0.03)


def test_evaluate_agrees_with_curve_and_handles_baselines(small):
    prof = hotline.profile(small, sample_fraction=0.5, progress=False)
    for rows in (0, 1, 40, 10**6):
        budget = rows * prof.bytes_per_row
        line = prof.curve([budget]).iloc[0]
        ev = prof.evaluate(prof.placement(budget))
        assert ev["access_coverage"] == line.access_coverage
        assert ev["popular_sample_share"] == line.popular_sample_share
        assert ev["expected_cold_rows_per_batch"] == pytest.approx(line.expected_cold_rows_per_batch)
    assert prof.evaluate(Placement.all_hot(small.table_sizes))["popular_sample_share"] == 1.0
    assert prof.evaluate(Placement.all_cold(small.table_sizes))["access_coverage"] == 0.0


def test_matches_pandas_on_a_medium_dataset(tmp_path):
    """The acceptance check: coverage and popular-sample share equal an independent pandas computation."""
    sizes = [10, 5000, 200, 30000, 4, 800]
    ds = write_zipf_dataset(tmp_path / "medium", 60000, sizes, seed=11)
    prof = hotline.profile(ds, sample_fraction=0.05, seed=2, mini_batch_size=64, progress=False)
    budget = "20KiB"
    summary = prof.summary(budget)
    placement = prof.placement(budget)

    rng = np.random.default_rng(2)
    idx = np.sort(rng.choice(60000, size=3000, replace=False, shuffle=False))
    np.testing.assert_array_equal(prof.sample_indices, idx)
    wide = pd.DataFrame(np.asarray(ds.train.sparse)[idx, :, 0], columns=[f"t{t}" for t in range(len(sizes))])
    long = wide.reset_index(names="sample").melt(id_vars="sample", var_name="table", value_name="row")
    long["table"] = long["table"].str[1:].astype(int)
    counts = long.value_counts(["table", "row"]).rename("n").reset_index()
    counts = counts.sort_values(["n", "table", "row"], ascending=[False, True, True], kind="stable")
    hot_rows = 20 * 1024 // 64
    hot = counts.head(hot_rows)[["table", "row"]].assign(hot=True)
    long = long.merge(hot, on=["table", "row"], how="left")
    long["hot"] = long["hot"].astype("boolean").fillna(False).astype(bool)
    coverage = long["hot"].mean()
    popular = long.groupby("sample")["hot"].all().mean()

    assert summary["hot_rows"] == hot_rows == placement.num_hot
    assert summary["access_coverage"] == coverage
    assert summary["popular_sample_share"] == popular
    for t in range(len(sizes)):
        expect = hot[hot.table == t]["row"].to_numpy()
        np.testing.assert_array_equal(placement.hot_ids[t], expect)  # slot order = rank order
    stats = prof.table_stats(budget).set_index("table")
    per_table = long.groupby("table")["hot"].mean()
    np.testing.assert_allclose(stats["coverage"].to_numpy(), per_table.to_numpy(), rtol=0, atol=1e-15)
    assert 0.8 < stats.loc[3, "zipf_exponent"] < 1.3  # the data were drawn with s = 1.05


def test_summary_and_table_stats_have_the_promised_fields(small):
    prof = hotline.profile(
        small, sample_fraction=0.5, progress=False, optimizer="rowwise-adagrad", embedding_dim=8
    )
    s = prof.summary("1KiB")
    assert s["bytes_per_row"] == 8 * 4 + 4 and s["hbm_budget_bytes"] == 1024 and s["hot_rows"] == 1024 // 36
    assert 0 <= s["access_coverage"] <= 1 and 0 <= s["popular_sample_share"] <= 1
    assert s["dataset_fingerprint"] == small.fingerprint and len(s["tables"]) == 4
    json.dumps(s, allow_nan=False)
    stats = prof.table_stats("1KiB")
    assert list(stats.columns) == [
        "table",
        "rows",
        "accessed_rows",
        "hot_rows",
        "hot_pct",
        "coverage",
        "lookups",
        "top1pct_share",
        "zipf_exponent",
    ]
    assert stats.hot_rows.sum() == s["hot_rows"]
    assert (
        stats.loc[2, "top1pct_share"] == prof.table_counts(2).max() / prof.lookups_per_table
    )  # 1% of 3 rows = 1


def test_summary_with_always_hot_rescans_the_sample(small):
    prof = hotline.profile(small, sample_fraction=0.5, progress=False)
    s = prof.summary(60 * prof.bytes_per_row, always_hot=[0])
    ev = prof.evaluate(prof.placement(60 * prof.bytes_per_row, [0]))
    assert s["popular_sample_share"] == ev["popular_sample_share"]
    assert s["always_hot"] == [0] and s["tables"][0]["hot_rows"] == 50
    assert s["hot_rows"] == 60


def test_plots_return_figures(small):
    prof = hotline.profile(small, sample_fraction=0.5, progress=False)
    figs = prof.plot("1KiB", batch_sizes=[1, 8, 64])
    assert set(figs) == {"rank_frequency", "budget", "working_set"}
    assert all(len(f.axes[0].lines) > 0 for f in figs.values())
    ws = prof.working_set("1KiB", [1, 8, 64])
    assert (
        ws.expected_cold_rows.is_monotonic_increasing and (ws.expected_unique_rows <= ws.looked_up_rows).all()
    )


def test_bad_ids_and_empty_splits_are_reported_with_the_dataset(tmp_path):
    bad = write_zipf_dataset(tmp_path / "bad", 100, [5, 6], bad_id=True)
    with pytest.raises(DatasetError, match=r"bad.*sample 50, table 1, lookup 0: row id 6"):
        hotline.profile(bad, sample_fraction=1.0, progress=False)
    with pytest.raises(DatasetError, match="no samples"):
        hotline.profile(bad, split="val", progress=False)


# ---------------------------------------------------------------- CLI


def test_cli_writes_placement_and_json(small, tmp_path, capsys):
    out, js, csv = tmp_path / "p.npz", tmp_path / "s.json", tmp_path / "c.csv"
    rc = main(
        [
            "profile",
            str(small.path),
            "--hbm-budget",
            "2KiB",
            "--sample-fraction",
            "0.5",
            "--seed",
            "4",
            "--out",
            str(out),
            "--json",
            str(js),
            "--curve-csv",
            str(csv),
            "--no-progress",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "hot %" in text and "zipf s" in text and "popular-sample share" in text
    s = json.loads(js.read_text())
    prof = hotline.profile(small, sample_fraction=0.5, seed=4, progress=False)
    assert s == json.loads(json.dumps(prof.summary(2048)))
    placement = Placement.load(out, small)
    assert placement.hbm_budget_bytes == 2048 and placement.num_hot == s["hot_rows"] == 32
    assert len(pd.read_csv(csv)) > 2


def test_cli_takes_dlrm_flag_names_and_optimizer_state(small, tmp_path):
    js = tmp_path / "s.json"
    argv = ["profile", str(small.path), "--arch-sparse-feature-size", "8", "--optimizer", "rowwise-adagrad"]
    assert main(argv + ["--hbm-budget", "360", "--json", str(js), "--no-progress"]) == 0
    s = json.loads(js.read_text())
    assert s["bytes_per_row"] == 36 and s["hot_rows"] == 10 and s["embedding_dim"] == 8


def test_cli_batches_mode_and_errors(small, tmp_path, capsys):
    assert (
        main(
            ["profile", str(small.path), "--sample-batches", "2", "--mini-batch-size", "10", "--no-progress"]
        )
        == 0
    )
    assert "20 samples" in capsys.readouterr().out
    assert main(["profile", str(small.path), "--out", str(tmp_path / "x.npz")]) == 2
    assert main(["profile", str(small.path), "--hbm-budget", "10", "--always-hot", "1", "--no-progress"]) == 2
    assert "always-hot tables [1] have 400 rows" in capsys.readouterr().err
    assert main(["profile", str(tmp_path / "missing"), "--no-progress"]) == 2
    with pytest.raises(SystemExit):
        main(["profile", str(small.path), "--hbm-budget", "12 parsecs"])


def test_table_coverage_is_over_each_tables_own_lookups(tmp_path):
    """Bags of different sizes per table (MLPerf's): a table's coverage is its hot rows' lookups over ITS
    lookups (it divided by the last table's, printing 300% and more on the MLPerf preset)."""
    from hotline.datasets.synthetic import generate

    path = generate(
        tmp_path / "bags", 1500, seed=1, table_sizes=[300, 200, 100], bag_sizes=[1, 7, 3], progress=False
    )
    prof = hotline.profile(path, sample_fraction=0.5, progress=False)
    stats = prof.table_stats("2KiB").set_index("table")
    placement = prof.placement("2KiB")
    for t in range(3):
        counts = prof.table_counts(t)
        assert stats.loc[t, "coverage"] == pytest.approx(counts[placement.hot_ids[t]].sum() / counts.sum())
    assert (stats["coverage"] <= 1).all() and (stats["coverage"] > 0).all()


def test_counts_are_no_wider_than_the_sample_and_the_order_is_a_counting_sort():
    """The counts of a sample with fewer than 2**32 lookups are uint32; the ranking is the stable sort of the
    counts, most first and ties in id order, made without sorting the rows (int32 ids)."""
    from hotline.kernels import profile as pk

    assert pk.count_dtype(2**32 - 1) == np.uint32 and pk.count_dtype(2**32) == np.int64
    rng = np.random.default_rng(0)
    for counts in (
        rng.integers(0, 7, 5000),
        rng.zipf(1.5, 5000) * (rng.random(5000) < 0.6),
        np.zeros(9, int),
    ):
        for dtype in (np.uint32, np.int64):
            c = counts.astype(dtype)
            rows = np.flatnonzero(c)
            expect = rows[np.argsort(-c[rows].astype(np.int64), kind="stable")]
            got = pk.order_by_count(c)
            assert got.dtype == np.int32 and np.array_equal(got, expect)
    big = np.array([0, 3, 10**7, 3], np.uint32)  # a count above the row count: the stable sort instead
    assert pk.order_by_count(big).tolist() == [2, 1, 3]
    counts = np.zeros(20, np.uint32)
    pk.count_lookups(np.array([[[1], [2]], [[1], [0]]], np.int32), [10, 10], counts)
    assert counts.tolist()[:3] == [0, 2, 0] and counts[12] == 1 and counts[10] == 1
