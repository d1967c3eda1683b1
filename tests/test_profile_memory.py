"""The profile's memory: what it keeps and builds grows by at most a few bytes a row, and the ranking, counts and
placement it gives are those of a full stable sort of the counts (ties by table, then row).

Peaks are tracemalloc's (numpy reports its buffers to it) on tables of millions of rows looked up by a few
thousand samples, so the rows, not the sample, dominate: the bounds are bytes per row plus a fixed allowance
for the sample and the accessed rows, and are asserted, not timed.
"""

from __future__ import annotations

import importlib
import tracemalloc

import numpy as np
import pytest

import naive
from hotline.datasets.format import Dataset, DatasetWriter
from hotline.kernels import profile as kp
from hotline.profiling import Profile, Profiler
from hotline.profiling import heldout as heldout_module

profile_module = importlib.import_module("hotline.profiling.profile")  # the package's `profile` is a function

SIZES = [500_000] * 8 + [7]
ROWS = sum(SIZES)
ALLOWANCE = 2 << 20
"""Bytes beyond the per-row bound: the 3,000 samples' ids, their chunks, the accessed rows' curves."""


@pytest.fixture(scope="module")
def big_tables(tmp_path_factory) -> Dataset:
    """4 million rows in 9 tables, 3,000 samples (half profiled, half held out): a few thousand rows accessed."""
    out = tmp_path_factory.mktemp("big") / "ds"
    rng = np.random.default_rng(0)
    with DatasetWriter(out, SIZES) as w:
        _, sparse, _ = w.create_split("train", 3000)
        for t, size in enumerate(SIZES):
            sparse[:, t, 0] = np.minimum(rng.zipf(1.3, 3000) - 1, size - 1)
        w.finish(source={"kind": "test", "seed": 0})
    ds = Dataset(out)
    Profiler(sample_fraction=0.5, progress=False).profile(ds).placement(
        0
    )  # the kernels loaded, not traced later
    return ds


def _peak(fn):
    """(result, tracemalloc peak in bytes above what was traced when fn started)."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def test_profile_keeps_and_builds_at_most_five_bytes_a_row(big_tables):
    """Counting (uint32 counts), ranking (the int32 rank in the counts' memory) and the held-out scan (mini-batch
    counts by rank, not by row) peak below 5 bytes a row; the counts next to the rank, or a per-row held-out
    count, are 8 and 6."""
    profiler = Profiler(sample_fraction=0.5, embedding_dim=4, progress=False)
    prof, peak = _peak(lambda: profiler.profile(big_tables))
    assert prof.rank.dtype == np.int32 and prof.heldout is not None and prof.num_accessed < 10_000
    assert peak <= 5 * ROWS + ALLOWANCE, f"{peak / ROWS:.2f} bytes a row"


def test_placement_builds_one_table_of_remaps_at_a_time(big_tables):
    """Choosing the hot rows and building the Placement: temporaries of the largest table (its remap and its
    checks), not 4 bytes a row of every table at once."""
    prof = Profiler(sample_fraction=0.5, embedding_dim=4, heldout="none", progress=False).profile(big_tables)
    placement, peak = _peak(lambda: prof.placement(prof.bytes_per_row * 1000))
    assert placement.num_hot == 1000
    assert peak <= 3 * 4 * max(SIZES) + ALLOWANCE < 4 * ROWS, f"{peak / ROWS:.2f} bytes a row"


def _stable_reference(counts: np.ndarray) -> np.ndarray:
    """The accessed rows by a full sort: most counted first, ties by fused id (table, then row)."""
    rows = np.flatnonzero(counts)
    return rows[np.argsort(-counts[rows].astype(np.int64), kind="stable")]


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
@pytest.mark.parametrize("take", [False, True])
def test_ranking_counts_and_placement_match_a_full_stable_sort_on_ties(dtype, take):
    """Counts of 0..3 over 3 tables (ties everywhere, across tables): the order, the counts given back, each
    table's counts and the hot ids of every budget equal those of a stable argsort of all rows."""
    rng = np.random.default_rng(1)
    sizes = [300, 1, 500]
    given = rng.integers(0, 4, sum(sizes)).astype(dtype)
    counts = given.copy()
    prof = Profile(counts=counts, table_sizes=sizes, num_samples=3, pooling_factor=1,
                   profiler=Profiler(embedding_dim=1, progress=False), take_counts=take)  # fmt: skip
    ref = _stable_reference(given)
    np.testing.assert_array_equal(prof.order, ref)
    assert prof.counts.dtype == given.dtype
    np.testing.assert_array_equal(prof.counts, given)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for t in range(len(sizes)):
        np.testing.assert_array_equal(prof.table_counts(t), given[offsets[t] : offsets[t + 1]])
    np.testing.assert_array_equal(
        prof.table_lookups, [given[a:b].sum() for a, b in zip(offsets, offsets[1:])]
    )
    assert prof.total_lookups == int(given.sum())
    # the caller's array: reused for the rank only when asked and of the rank's width
    reused = take and np.dtype(dtype).itemsize == 4
    assert np.shares_memory(prof.rank, counts) == reused
    if not take:
        np.testing.assert_array_equal(counts, given)
    for k in (0, 1, 17, 250, ref.size, ref.size + 5):
        hot = ref[:k]
        tables = np.searchsorted(offsets, hot, side="right") - 1
        want = [hot[tables == t] - offsets[t] for t in range(len(sizes))]
        got = prof.placement(4 * k).hot_ids
        for t in range(len(sizes)):
            np.testing.assert_array_equal(got[t], want[t], err_msg=f"k={k} table {t}")


def test_evaluate_of_a_placement_matches_its_counts(big_tables, monkeypatch):
    """evaluate (the accessed rows in blocks of the ranking, the hot set as a bitmap): coverage from the counts of
    the hot rows and the expected cold rows from the cold rows' counts, as computed over every row at once."""
    monkeypatch.setattr(profile_module, "_BLOCK_ROWS", 97)  # blocks through the accessed rows
    prof = Profiler(sample_fraction=0.5, heldout="none", progress=False).profile(big_tables)
    placement = prof.placement(prof.bytes_per_row * 300, always_hot=[8])
    got = prof.evaluate(placement, batch_size=32)
    counts = prof.counts.astype(np.int64)
    hot = placement.fused_remap() >= 0
    per_row = np.repeat(prof.table_lookups, SIZES).astype(np.float64)
    p = counts[~hot] / per_row[~hot]
    expected = -np.expm1(32 * (per_row[~hot] / prof.num_samples) * np.log1p(-p)).sum()
    assert got["access_coverage"] == counts[hot].sum() / counts.sum()
    assert got["expected_cold_rows_per_batch"] == pytest.approx(expected, rel=1e-12)
    assert got["hot_rows"] == placement.num_hot == 300


def test_unseen_rows_merge_to_the_counts_of_every_pair(monkeypatch):
    """The held-out scan's count of mini-batches per unseen row, merged many times along the way, equals a
    count of all the pairs at once."""
    monkeypatch.setattr(heldout_module, "_MERGE_AT", 5)
    rng = np.random.default_rng(2)
    parts = [rng.integers(0, 50, rng.integers(0, 12)) for _ in range(40)]
    rows = heldout_module._UnseenRows()
    for p in parts:
        rows.add(p)
    every = np.concatenate(parts)
    want = np.bincount(every)
    np.testing.assert_array_equal(rows.counts(), want[want > 0])
    np.testing.assert_array_equal(rows._rows, np.flatnonzero(want))


@pytest.mark.parametrize("seed", range(6))
def test_hot_set_bitmap_kernels_match_twins(seed):
    """The hot set in 1 bit a row: membership, and each sample's "any lookup outside it" (one-hot, multi-hot and
    padded bags), against a bool per row; a hot id outside its table is named."""
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(1, 40, rng.integers(1, 5))]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    hot = rng.random(offsets[-1]) < rng.random()
    hot_ids = [np.flatnonzero(hot[a:b]) for a, b in zip(offsets, offsets[1:])]
    bits = kp.hot_bitmap(sizes, hot_ids)
    assert bits.dtype == np.uint8 and bits.shape == ((offsets[-1] + 7) // 8,)
    np.testing.assert_array_equal(kp.in_bitmap(bits, np.arange(offsets[-1])), hot)
    bags = [int(b) for b in rng.integers(1, 4, len(sizes))]
    n = int(rng.integers(0, 2 * kp.BLOCK))
    sparse = np.concatenate([rng.integers(0, s, (n, b)) for s, b in zip(sizes, bags)], axis=1).astype(
        np.int32
    )
    sparse[rng.random(sparse.shape) < 0.3] = -1  # padding
    got = kp.sample_max_cold(sparse, sizes, bits, bag_sizes=bags, padded=True)
    np.testing.assert_array_equal(got, naive.profile_sample_max_cold(sparse, sizes, hot, bags))
    one_hot = np.maximum(sparse[:, np.cumsum(bags) - 1], 0)  # [n, T]
    np.testing.assert_array_equal(
        kp.sample_max_cold(one_hot, sizes, bits), naive.profile_sample_max_cold(one_hot, sizes, hot)
    )
    with pytest.raises(ValueError, match=f"table 0: hot ids must lie in \\[0, {sizes[0]}\\)"):
        kp.hot_bitmap(sizes, [np.array([sizes[0]]), *hot_ids[1:]])


def test_always_hot_figures_take_a_bit_a_row(big_tables):
    """The in-sample and held-out figures of an always-hot placement (the summary `hotline profile --always-hot`
    writes) test membership in a bitmap of the hot rows: an eighth of a byte a row, where a remap of every row
    and its cold flags took 9 bytes."""
    prof = Profiler(sample_fraction=0.5, progress=False).profile(big_tables)
    budget = prof.bytes_per_row * 300
    prof.summary(budget, always_hot=[8])  # the kernels loaded, not traced
    summary, peak = _peak(lambda: prof.summary(budget, always_hot=[8]))
    assert summary["hot_rows"] == 300 and summary["heldout"] is not None
    assert peak <= ROWS / 2 + ALLOWANCE, f"{peak / ROWS:.2f} bytes a row"
    # the placement made once (as `hotline profile` does) gives the same summary
    assert prof.summary(budget, [8], prof.placement(budget, [8])) == summary


def test_heldout_figures_of_a_bitmap_equal_those_of_a_rank_per_row(big_tables):
    """The held-out scan of a bitmap gives the figures the same scan gives with a rank per row (0 hot, 1 cold)."""
    prof = Profiler(sample_fraction=0.5, progress=False).profile(big_tables)
    placement = prof.placement(prof.bytes_per_row * 300, always_hot=[8])
    hot = placement.fused_remap() >= 0
    h = prof.heldout
    got = h.evaluate(kp.hot_bitmap(SIZES, placement.hot_ids), SIZES)
    hits, popular, cold, _, _, _ = heldout_module.scan(
        h._chunks(), SIZES, (~hot).astype(np.int32), 1, h.batch_size, h.bags, window=0
    )
    assert got == {
        "access_coverage": hits[1] / h.total_lookups,
        "popular_sample_share": popular[1] / h.num_samples,
        "unique_cold_rows_per_batch": cold[1] / h.num_batches,
    }
    assert 0 < got["access_coverage"] < 1 and 0 < got["unique_cold_rows_per_batch"]
