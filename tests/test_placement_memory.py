"""A placement holds no remap of every row: made from its hot ids, saved and loaded a table at a time, so the
memory it takes to build, save or load is about one table's remap (with its bytes on the way to or from the
file), never every table's (tracemalloc's peak; sizes, not times)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from hotline.placement import Placement

TABLES = [1_000_000] * 4
ONE_REMAP = 4 * TABLES[0]


def _peak(fn):
    """``fn()``'s result and the most bytes tracemalloc saw allocated (numpy's arrays included) while it ran."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_build_save_and_load_hold_one_tables_remap_at_most(tmp_path):
    rng = np.random.default_rng(0)
    hot = [rng.choice(n, 1000, replace=False) for n in TABLES]
    placement, built = _peak(lambda: Placement.from_hot_ids(TABLES, hot))
    assert built < ONE_REMAP // 2  # the hot ids and their sorted copies only
    path, saved = _peak(lambda: placement.save(tmp_path / "p.npz"))
    loaded, read = _peak(lambda: Placement.load(path))
    # one table's remap and its bytes on the way to or from the file: never the four tables' 16 MB
    assert saved < 2.5 * ONE_REMAP and read < 2.5 * ONE_REMAP
    assert all(np.array_equal(a, b) for a, b in zip(loaded.hot_ids, placement.hot_ids))
    assert all(np.array_equal(a, b) for a, b in zip(loaded.remap, placement.remap))
    assert np.array_equal(loaded.fused_remap(), placement.fused_remap())
