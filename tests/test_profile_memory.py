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

from hotline.datasets.format import Dataset, DatasetWriter
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
    """evaluate (blocks of a table at a time, cold flags in the remap's memory): coverage from the counts of the
    hot rows and the expected cold rows from the cold rows' counts, as computed over every row at once."""
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
