"""The disk store's file order (``popularity_order``) and the counts it comes from (``Profiler.count``): the
same order as a sort of every row, in a fraction of its memory, from the counting pass alone."""

import tracemalloc

import numpy as np
import pytest

from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.profiling.profiler import Profiler, profile
from hotline.tiers.disk_store import popularity_order


def naive_order(counts, num_rows: int, last=None) -> np.ndarray:
    """The obvious twin: sort every counted row by count (ties by id), then the rest, then ``last``."""
    counts = np.zeros(num_rows, np.int64) if counts is None else np.asarray(counts)
    tail = np.zeros(num_rows, bool)
    if last is not None:
        tail[last] = True
    seen = np.flatnonzero((counts > 0) & ~tail)
    head = seen[np.argsort(-counts[seen].astype(np.int64), kind="stable")]
    rest = np.flatnonzero((counts == 0) & ~tail)
    return np.concatenate([head, rest, np.flatnonzero(tail)]).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1, 7, 1000, 3 << 20])
def test_popularity_order_is_the_sort_of_every_row(seed, n):
    rng = np.random.default_rng(seed)
    dtype = [np.uint32, np.int64, np.uint8][seed % 3]
    counts = np.zeros(n, dtype)
    hits = rng.integers(0, n, max(1, n // (seed + 1)))
    np.add.at(counts, hits, 1)
    if seed == 4:
        counts[rng.integers(0, n, 3)] = min(np.iinfo(dtype).max, 10 * n + 5)  # the counting sort's fallback
    last = [None, np.zeros(0, np.int64), rng.integers(0, n, max(1, n // 10))][seed % 3]  # repeats too
    got = popularity_order(counts, n, last)
    assert got.dtype == np.int32  # below 2**31 rows: 4 bytes a row
    np.testing.assert_array_equal(got, naive_order(counts, n, None if last is None else np.unique(last)))
    np.testing.assert_array_equal(popularity_order(None, n), np.arange(n))


def test_popularity_order_holds_the_order_not_a_sort_of_every_row():
    """tracemalloc over 20M rows: the order (int32: 4 bytes a row) and arrays of the counted rows; an int64
    order took 8 bytes a row and more, the sort of every counted row with its int64 copies 19.2."""
    rng = np.random.default_rng(0)
    n = 20_000_000
    counts = np.zeros(n, np.uint32)
    np.add.at(counts, rng.integers(0, n, 3_000_000), 1)
    last = rng.choice(n, 100_000, replace=False)
    tracemalloc.start()
    popularity_order(counts, n, last)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * n, peak / n


@pytest.mark.parametrize("bags", [None, [3, 1, 2, 1]])
def test_profiler_count_is_the_profiles_counts(tmp_path, bags):
    kw = {"bag_sizes": bags, "variable_bags": True} if bags else {}
    ds = Dataset(generate(tmp_path / "d", 3000, seed=2, table_sizes=[50, 900, 7, 300], progress=False, **kw))
    for p in (
        Profiler(seed=1, progress=False),
        Profiler(sample_batches=5, mini_batch_size=64, progress=False),
    ):
        counts = p.count(ds)
        full = p.profile(ds).counts
        assert counts.dtype == full.dtype and np.array_equal(counts, full)
    np.testing.assert_array_equal(Profiler(progress=False).count(ds), profile(ds, progress=False).counts)
