"""The disk cold store's file across a close and a reopen with its DRAM tier, and the bytes a one-rank store's
look-ahead fetch reads (``tests/test_disk_pages.py`` has the file's reads and writes,
``tests/test_disk_tier.py`` the store's exactness)."""

from __future__ import annotations

import numpy as np
import pytest

from hotline.table_layout import TableLayout
from hotline.tiers.disk_file import PAGE, RowFile
from hotline.tiers.disk_store import DiskColdStore
from hotline.tiers.sparse_optim import SparseOptimizer


def _file_pages(f: RowFile, rows: np.ndarray) -> np.ndarray:
    """The file's pages that the records of ``rows`` on disk (not in the DRAM tier) span, from their positions."""
    start = f.positions[rows]
    start = start[start >= f.cache_rows] * f.record
    spans = [np.arange(a // PAGE, (a + f.record - 1) // PAGE + 1) for a in start]
    return np.unique(np.concatenate(spans or [np.zeros(0, np.int64)]))


@pytest.mark.parametrize("reopen_cache", [0, 1], ids=["reopened-without-tier", "reopened-with-tier"])
def test_a_file_closed_with_a_dram_tier_reopens_with_every_rows_last_value(tmp_path, reopen_cache):
    """Rows of the DRAM tier (the head of the file) and of the disk written in place, the file closed and
    opened again (:meth:`RowFile.open`): every row reads back as last written, whether the reopened file has a
    DRAM tier or not."""
    n, dim, state, rng = 400, 16, 1, np.random.default_rng(5)
    record = 4 * (dim + state)
    cache = 60 * record  # the 60 rows at the head of the file's order
    f = RowFile(tmp_path / "rows.bin", n, dim, state, rng.permutation(n), io_depth=2, cache_bytes=cache)
    try:
        model = rng.standard_normal((n, dim + state)).astype(np.float32)
        f.put_rows(np.arange(n), model)
        f.flush()
        for _ in range(5):
            rows = rng.choice(n, 120, replace=False)
            model[rows] = rng.standard_normal((rows.shape[0], dim + state)).astype(np.float32)
            f.write_rows(rows, model[rows])
        cached = f.order[: f.cache_rows]
        assert f.cache_rows == 60 and np.array_equal(f.read_rows(cached)[0], model[cached])
    finally:
        f.close()
    g = RowFile.open(tmp_path / "rows.bin", dim, state, io_depth=2, cache_bytes=reopen_cache * cache)
    try:
        every = np.concatenate([recs for _, recs in g.read_all()])
        assert np.array_equal(every, model[g.order])
        assert np.array_equal(g.read_rows(np.arange(n))[0], model)
    finally:
        g.close()


@pytest.mark.parametrize("cache_rows", [0, 40])
def test_a_one_rank_disk_stores_fetch_reads_only_the_pages_its_current_rows_need(tmp_path, cache_rows):
    """A look-ahead fetch of rows that an earlier, unfinished step holds reads the pages of the other rows only
    (its counter and the file's bytes read agree); the refresh, once that step has written, reads at most the
    pages left, and gives the rows as that step left them."""
    dim, rng = 64, np.random.default_rng(11)  # 15 records a page: some pages hold only rows step 0 holds
    layout = TableLayout([700, 900, 400])
    opt = SparseOptimizer("sgd", 0.05, dim=dim)
    n = layout.num_rows
    record = 4 * (dim + opt.state_floats_per_row)
    store = DiskColdStore(tmp_path / "cold.bin", layout, dim, opt, seed=3, io_depth=2,
                          cache_bytes=cache_rows * record, max_rows=n, lazy=False)  # fmt: skip
    f = store.file
    try:
        with store.lookahead():
            a = np.sort(rng.choice(n, 300, replace=False))
            fa = store.fetch(a, None, None, step=0)
            shared = np.sort(rng.choice(a, 80, replace=False))
            others = rng.choice(np.setdiff1d(np.arange(n), a), 220, replace=False)
            b = np.concatenate([shared, others])
            before = f.bytes_read
            fb = store.fetch(b, None, None, step=1)
            assert sorted(b[fb.stale]) == shared.tolist()
            kept = np.delete(b, fb.stale)
            want = PAGE * _file_pages(f, kept).shape[0]
            assert fb.counters["disk_bytes_read"] == want and f.bytes_read - before == want
            left = np.setdiff1d(_file_pages(f, shared), _file_pages(f, kept))
            assert left.shape[0] > 0  # pages only the held rows need: not read by the fetch
            assert np.array_equal(fb.values[np.flatnonzero(~np.isin(b, shared))], store.read(others))
            new_a = fa.values + 1.0
            store.write_back(fa, new_a, fa.state)  # step 0's update lands
            before = f.bytes_read
            slots, values, _ = store.refresh(fb)
            assert f.bytes_read - before <= PAGE * left.shape[0]
            assert np.array_equal(values, new_a[np.searchsorted(a, b[slots])])
    finally:
        store.close()
