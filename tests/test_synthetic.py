"""The synthetic generator: exact Zipf kernel, determinism, skew, splits, planted model, raw TSV, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from hotline.cli import main
from hotline.datasets import Dataset
from hotline.datasets import synthetic as syn
from hotline.kernels.synthetic import bag_effects, zipf_ranks
from hotline.training.metrics import roc_auc

SMALL_SIZES = [50, 7, 3000, 1, 20000] + [11] * 21  # 26 tables, as raw Criteo needs


def stream(ds: Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dataset's rows in stream order (train, test, val), as (dense, sparse, labels)."""
    parts = [ds.split(name) for name in syn.STREAM_ORDER]
    return tuple(
        np.concatenate([np.asarray(getattr(p, k)) for p in parts]) for k in ("dense", "sparse", "labels")
    )


# ------------------------------------------------------------------------------------------- the kernels


@pytest.mark.parametrize(
    ("n", "s"), [(1, 1.05), (2, 0.0), (3, 1.05), (40, 1.0), (40, 0.5), (25, 2.5), (9, 1 + 1e-10)]
)
def test_zipf_ranks_follow_the_exact_pmf(n, s):
    m = 200_000
    ranks = zipf_ranks(np.random.default_rng(n).random(m), n, s, redraw_key=3)
    assert ranks.min() >= 0 and ranks.max() < n
    expected = m * syn.zipf_pmf(n, s)
    chi2 = float(((np.bincount(ranks, minlength=n) - expected) ** 2 / expected).sum())
    # chi-square with n - 1 degrees of freedom: mean n - 1, sd sqrt(2 (n - 1)); 6 sd is a 1e-8-ish false alarm.
    assert chi2 <= (n - 1) + 6 * math.sqrt(2 * max(n - 1, 1)) + 1e-9


@settings(max_examples=30, deadline=None)
@given(
    u=st.lists(st.floats(0.0, 1.0, exclude_max=True), max_size=40),
    n=st.integers(1, 10**8),
    s=st.floats(0.0, 4.0),
    key=st.integers(0, 2**64 - 1),
)
def test_zipf_ranks_equal_naive_twin(u, n, s, key):
    u = np.array(u, dtype=np.float64)
    np.testing.assert_array_equal(zipf_ranks(u, n, s, key), naive.synthetic_zipf_ranks(u, n, s, key))


@settings(max_examples=30, deadline=None)
@given(
    ranks=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=3, max_size=3), max_size=20),
    pooling=st.integers(0, 3),
    key=st.integers(0, 2**64 - 1),
    scale=st.floats(0.5, 1e4),
)
def test_bag_effects_equal_naive_twin(ranks, pooling, key, scale):
    r = np.array(ranks, dtype=np.int64).reshape(len(ranks), 3)[:, :pooling]
    np.testing.assert_allclose(
        bag_effects(r, key, scale), naive.synthetic_bag_effects(r, key, scale), rtol=1e-12
    )


@pytest.mark.parametrize("s", [0.0, 0.5, 1.0, 2.0, 4.0, 10.0])
@pytest.mark.parametrize("n", [1, 2, 200_578, 10**8])
def test_zipf_ranks_extreme_uniforms(n, s):
    # u = 0 is the far tail (the last rank), even where the inverse meets its pole and gives inf; u -> 1 is
    # the head. Python's math raises there, so this pins the kernel's own handling.
    ranks = zipf_ranks(np.array([0.0, 5e-324, 1 - 2**-53]), n, s)
    assert ranks[0] == n - 1 and ranks[2] == 0 and 0 <= ranks[1] < n
    np.testing.assert_array_equal(
        ranks, naive.synthetic_zipf_ranks(np.array([0.0, 5e-324, 1 - 2**-53]), n, s)
    )


def test_kernels_reject_bad_input():
    with pytest.raises(ValueError, match="n must be >= 1"):
        zipf_ranks(np.zeros(3), 0, 1.0)
    with pytest.raises(ValueError, match="exponent"):
        zipf_ranks(np.zeros(3), 5, -0.5)
    with pytest.raises(TypeError, match="float64"):
        zipf_ranks(np.zeros(3, np.float32), 5, 1.0)
    with pytest.raises(TypeError, match="int64"):
        bag_effects(np.zeros((3, 1), np.int32), 1, 10.0)
    assert zipf_ranks(np.zeros((0, 4)), 5, 1.0).shape == (0, 4)


def test_zipf_top_share_matches_pmf():
    for n, s, top in [(1, 1.0, 1), (1000, 1.05, 10), (12345, 0.8, 124)]:
        assert syn.zipf_top_share(n, s, top) == pytest.approx(syn.zipf_pmf(n, s)[:top].sum(), rel=1e-12)


# ----------------------------------------------------------------------------------------- the generator


@pytest.fixture
def small_chunks(monkeypatch):
    # Several chunks in a small run. The determinism guarantees hold for any CHUNK_ROWS (the constant is part
    # of the stream's definition, so runs are only compared under one value).
    monkeypatch.setattr(syn, "CHUNK_ROWS", 1000)


def test_same_seed_same_data_other_seed_other_data(tmp_path, small_chunks):
    kw = dict(table_sizes=SMALL_SIZES, zipf=1.05, progress=False)
    a = stream(Dataset(syn.generate(tmp_path / "a", 3500, seed=7, **kw)))
    b = stream(Dataset(syn.generate(tmp_path / "b", 3500, seed=7, **kw)))
    c = stream(Dataset(syn.generate(tmp_path / "c", 3500, seed=8, **kw)))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1]) and not np.array_equal(a[0], c[0])
    meta_a = json.loads((tmp_path / "a" / "meta.json").read_text())
    meta_b = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta_a == meta_b


def test_a_shorter_run_is_a_prefix_of_a_longer_one(tmp_path, small_chunks):
    # 2,500 rows end inside a chunk; 5,300 rows span six chunks: rows never depend on how many are made.
    kw = dict(table_sizes=SMALL_SIZES, zipf=[1.2] * 26, pooling_factor=2, progress=False)
    short = stream(Dataset(syn.generate(tmp_path / "s", 2500, **kw)))
    long = stream(Dataset(syn.generate(tmp_path / "l", 5300, **kw)))
    for x, y in zip(short, long, strict=True):
        np.testing.assert_array_equal(x, y[: len(x)])


def test_changing_one_table_leaves_the_others(tmp_path):
    base = Dataset(syn.generate(tmp_path / "a", 800, table_sizes=[100, 200, 300], progress=False))
    other = Dataset(
        syn.generate(tmp_path / "b", 800, table_sizes=[999, 200, 300], zipf=[0.5, 1.05, 1.05], progress=False)
    )
    np.testing.assert_array_equal(base.train.sparse[:, 1:], other.train.sparse[:, 1:])
    assert not np.array_equal(base.train.sparse[:, 0], other.train.sparse[:, 0])


def test_shapes_ranges_splits_and_dense(tmp_path):
    rows = 3001
    ds = Dataset(
        syn.generate(tmp_path / "d", rows, table_sizes=SMALL_SIZES, pooling_factor=3, progress=False)
    )
    assert ds.table_sizes == SMALL_SIZES and ds.pooling_factor == 3
    sizes = {name: len(ds.split(name)) for name in ("train", "val", "test")}
    # Criteo Kaggle layout: 7 days, the first rows % 7 one longer; day 7 halved, test first.
    day = rows // 7
    assert sizes == {"train": rows - day, "test": (day + 1) // 2, "val": day // 2}
    assert sizes == syn.split_sizes(rows)
    for name in ("train", "val", "test"):
        split = ds.split(name)
        sparse = np.asarray(split.sparse)
        assert sparse.shape == (sizes[name], 26, 3)
        assert sparse.min() >= 0 and np.all(sparse.max(axis=(0, 2)) < np.array(SMALL_SIZES))
        assert set(np.unique(split.labels)) <= {0.0, 1.0}
        dense = np.asarray(split.dense)
        assert dense.dtype == np.float32 and dense.min() >= 0
        # log(x + 1) of integer counts: exp(d) - 1 is (close to) a whole number.
        np.testing.assert_allclose(
            np.expm1(dense.astype(np.float64)), np.round(np.expm1(dense)), rtol=1e-5, atol=1e-4
        )
    dense = np.asarray(ds.train.dense)
    missing_or_zero = (dense == 0).mean(axis=0)
    assert missing_or_zero[11] > 0.7 and missing_or_zero[0] > 0.4 and missing_or_zero[7] < 0.3  # I12, I1, I8
    meta = ds.meta
    assert meta["source"]["kind"] == "synthetic" and meta["source"]["pooling_factor"] == 3
    assert 0.15 < meta["synthetic"]["click_rate"] < 0.35


def test_pooling_bags_draw_every_id_from_the_table_distribution(tmp_path):
    ds = Dataset(
        syn.generate(tmp_path / "p", 4000, table_sizes=[5], zipf=1.5, pooling_factor=4, progress=False)
    )
    ids = np.asarray(ds.train.sparse)[:, 0, :]
    # Each bag position has the same distribution: the same sorted frequencies, close to the exact pmf.
    expected = np.sort(syn.zipf_pmf(5, 1.5))[::-1]
    for j in range(4):
        freq = np.sort(np.bincount(ids[:, j], minlength=5) / len(ids))[::-1]
        np.testing.assert_allclose(freq, expected, atol=0.03)
    assert (ids[:, 0] != ids[:, 1]).any()


def test_measured_skew_matches_the_zipf_expectation(tmp_path):
    n, s, rows = 20_000, 1.05, 60_000
    ds = Dataset(syn.generate(tmp_path / "z", rows, table_sizes=[n], zipf=s, progress=False))
    top = syn.top_rows(n)
    expected = syn.zipf_top_share(n, s, top)
    info = ds.meta["synthetic"]
    assert info["top_hit_share_expected"] == [pytest.approx(expected, abs=1e-5)]
    sd = math.sqrt(expected * (1 - expected) / rows)
    assert abs(info["top_hit_share_measured"][0] - expected) < 5 * sd
    # Independently of the generator's own count: the most-hit 1% of row ids take about the same share.
    ids = stream(ds)[1][:, 0, 0]
    counts = np.sort(np.bincount(ids, minlength=n))[::-1]
    assert counts[:top].sum() / rows == pytest.approx(expected, abs=0.02)
    # Hot rows are scattered over the table, not packed at the low ids.
    hottest = np.argsort(np.bincount(ids, minlength=n))[::-1][:top]
    assert np.mean(hottest < top) < 0.2


def test_planted_model_is_learnable(tmp_path):
    """The planted logit ranks val rows well, and a simple model fitted on train gets a good part of it."""
    path = syn.generate(tmp_path / "m", 70_000, max_rows_per_table=2000, progress=False)
    ds = Dataset(path)
    assert ds.meta["synthetic"]["planted_val_auc"] > 0.78
    # A plain learner: per-table smoothed click rate of each row (target encoding) plus the dense features,
    # combined by logistic regression fitted with Newton steps on train.
    train, val = ds.train, ds.val
    y = np.asarray(train.labels, dtype=np.float64)
    prior = y.mean()

    def features(split):
        cols = [np.asarray(split.dense, dtype=np.float64)]
        for t, n in enumerate(ds.table_sizes):
            ids_train = np.asarray(train.sparse)[:, t, 0]
            clicks = np.bincount(ids_train, weights=y, minlength=n)
            seen = np.bincount(ids_train, minlength=n)
            rate = (clicks + 20 * prior) / (seen + 20)
            cols.append(np.log(rate / (1 - rate))[np.asarray(split.sparse)[:, t, 0]][:, None])
        x = np.concatenate(cols, axis=1)
        return np.concatenate([x, np.ones((len(x), 1))], axis=1)

    x, xv = features(train), features(val)
    w = np.zeros(x.shape[1])
    for _ in range(8):
        p = 1 / (1 + np.exp(-x @ w))
        hess = x.T @ (x * (p * (1 - p))[:, None]) + 1e-3 * np.eye(len(w))
        w -= np.linalg.solve(hess, x.T @ (p - y))
    assert roc_auc(np.asarray(val.labels), xv @ w) > 0.70


def test_raw_tsv_round_trip_through_criteo_preprocess(tmp_path):
    from hotline.datasets.criteo import preprocess

    raw = tmp_path / "raw" / "train.txt"
    syn_ds = Dataset(
        syn.generate(tmp_path / "syn", 2100, table_sizes=SMALL_SIZES, raw_tsv=raw, progress=False)
    )
    lines = raw.read_text().splitlines()
    assert len(lines) == 2100 and all(len(line.split("\t")) == 40 for line in lines[:50])
    crit = Dataset(preprocess(raw, tmp_path / "crit", progress=False))
    for name in ("train", "val", "test"):
        a, b = syn_ds.split(name), crit.split(name)
        assert len(a) == len(b)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_allclose(a.dense, b.dense, rtol=1e-6)
    sa, sb = stream(syn_ds)[1][:, :, 0], stream(crit)[1][:, :, 0]
    for t in range(26):
        # The same id structure up to a relabelling: synthetic id <-> Criteo id is one-to-one.
        pairs = np.unique(np.stack([sa[:, t], sb[:, t]], 1), axis=0)
        assert len(np.unique(pairs[:, 0])) == len(pairs) == len(np.unique(pairs[:, 1]))
        assert crit.table_sizes[t] == len(pairs)


def test_raw_tsv_needs_one_hot_and_26_tables(tmp_path):
    with pytest.raises(ValueError, match="pooling_factor is 2"):
        syn.generate(
            tmp_path / "x", 10, table_sizes=SMALL_SIZES, pooling_factor=2, raw_tsv=tmp_path / "r.txt"
        )
    with pytest.raises(ValueError, match="26 categorical columns"):
        syn.generate(tmp_path / "x", 10, table_sizes=[5, 5], raw_tsv=tmp_path / "r.txt", progress=False)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rows=-1), "rows"),
        (dict(rows=10, table_sizes=(5, 0)), r"table_sizes\[1\]"),
        (dict(rows=10, table_sizes=(5, 2**31)), r"table_sizes\[1\]"),
        (dict(rows=10, table_sizes=(5, 6), zipf=(1.0, 1.0, 1.0)), "3 exponents but there are 2 tables"),
        (dict(rows=10, table_sizes=(5,), zipf=-1.0), "zipf exponent of table 0"),
        (dict(rows=10, pooling_factor=0), "pooling_factor"),
        (dict(rows=10, max_rows_per_table=0), "max_rows_per_table"),
    ],
)
def test_config_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        syn.SyntheticConfig(**kwargs)


def test_config_caps_table_sizes_and_expands_exponents():
    cfg = syn.SyntheticConfig(rows=1, max_rows_per_table=1000)
    assert cfg.sizes == tuple(min(n, 1000) for n in syn.KAGGLE_TABLE_SIZES) and cfg.exponents == (1.05,) * 26
    assert len(syn.KAGGLE_TABLE_SIZES) == 26 and sum(syn.KAGGLE_TABLE_SIZES) == 33762577


def test_default_dataset_is_cached(tmp_path, monkeypatch):
    from hotline.datasets import default as syn

    monkeypatch.setenv("HOTLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(syn.DEFAULT_DATASET, "rows", 1500)
    monkeypatch.setitem(syn.DEFAULT_DATASET, "max_rows_per_table", 300)
    path = syn.default_dataset()
    assert path.parent == tmp_path / "cache" and path.name.startswith("default-")
    ds = Dataset(path)
    assert len(ds.train) + len(ds.val) + len(ds.test) == 1500 and max(ds.table_sizes) == 300
    stamp = (path / "meta.json").stat().st_mtime_ns
    assert syn.default_dataset() == path and (path / "meta.json").stat().st_mtime_ns == stamp
    monkeypatch.setitem(syn.DEFAULT_DATASET, "rows", 1600)
    assert syn.default_dataset(cache_dir=tmp_path / "elsewhere").parent == tmp_path / "elsewhere"


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["data", "synthetic", "--out", str(out), "--rows", "1400", "--seed", "3", "--no-progress",
            "--table-sizes", ",".join(map(str, SMALL_SIZES)), "--max-rows-per-table", "2500",
            "--zipf", ",".join(["0.9"] * 25 + ["1.3"]), "--raw-tsv", str(tmp_path / "raw.tsv")]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "planted-model val AUC" in text and "rows/s" in text
    ds = Dataset(out)
    src = ds.meta["source"]
    assert src["seed"] == 3 and src["zipf"] == [0.9] * 25 + [1.3] and src["max_rows_per_table"] == 2500
    assert ds.table_sizes == [min(n, 2500) for n in SMALL_SIZES]
    assert len((tmp_path / "raw.tsv").read_text().splitlines()) == 1400
    same = syn.generate(tmp_path / "api", 1400, seed=3, table_sizes=SMALL_SIZES, max_rows_per_table=2500,
                        zipf=[0.9] * 25 + [1.3], progress=False)  # fmt: skip
    np.testing.assert_array_equal(Dataset(same).train.sparse, ds.train.sparse)


def test_cli_reports_bad_parameters(tmp_path, capsys):
    argv = ["data", "synthetic", "--out", str(tmp_path / "x"), "--rows", "10", "--pooling-factor", "2"]
    assert main([*argv, "--raw-tsv", str(tmp_path / "r.tsv")]) == 2
    assert "pooling_factor is 2" in capsys.readouterr().err
    assert main(["data", "synthetic", "--out", str(tmp_path / "x"), "--rows", "10", "--zipf", "1,2"]) == 2
    assert "2 exponents but there are 26 tables" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_rejects_a_bad_list(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["data", "synthetic", "--out", str(tmp_path / "x"), "--rows", "10", "--zipf", "1.0,abc"])
    assert "comma-separated numbers" in capsys.readouterr().err
