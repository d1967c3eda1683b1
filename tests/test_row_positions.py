"""The disk store's row positions (``RowFile.positions``, :func:`hotline.tiers.disk_file.positions_of`): each
row's place in the file's order, equal to the inverse permutation, without an array of every row where the order
is the disk store's (counted rows, the never-counted rows in id order, the hot rows)."""

import numpy as np
import pytest

from hotline.tiers.disk_file import positions_of
from hotline.tiers.disk_pages import RowPositions, longest_ascending_run
from hotline.tiers.disk_store import popularity_order


def _inverse(order):
    out = np.empty(order.shape[0], np.int64)
    out[order] = np.arange(order.shape[0])
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 2, 9, 1000, 50_003])
def test_positions_are_the_inverse_of_the_order(seed, n):
    rng = np.random.default_rng(seed)
    counts = np.zeros(n, np.uint32)
    np.add.at(counts, rng.integers(0, n, max(1, n // (10 * (seed + 1)))), 1)
    last = [None, rng.integers(0, n, max(1, n // 20)), rng.integers(0, n, 1), np.arange(n - n // 7, n)][seed]
    order = popularity_order(counts, n, last)
    ref = _inverse(order)
    for chunk in (7, 1 << 22):  # runs that cross chunk boundaries too
        pos = positions_of(order, chunk)
        assert np.array_equal(pos[np.arange(n)], ref)
        rows = rng.integers(0, n, 300)
        assert np.array_equal(pos[rows], ref[rows]) and pos[rows].dtype == np.int32
        assert int(pos[int(rows[0])]) == ref[rows[0]]
        if n >= 1000:
            assert isinstance(pos, RowPositions)


def test_any_other_order_keeps_an_array():
    order = np.random.default_rng(0).permutation(10_000)
    pos = positions_of(order)
    assert isinstance(pos, np.ndarray) and pos.dtype == np.int32
    assert np.array_equal(pos, _inverse(order))


def test_longest_ascending_run():
    assert longest_ascending_run(np.array([5, 1, 2, 3, 0, 4, 6]), 2) == (1, 4)
    assert longest_ascending_run(np.array([3, 2, 1]), 2) == (0, 1)
    assert longest_ascending_run(np.arange(10), 3) == (0, 10)
    assert longest_ascending_run(np.zeros(0, np.int64)) == (0, 0)


def test_positions_hold_the_rows_outside_the_run_only():
    """2M rows, 50k counted, 20k hot: the positions' arrays are those 70k rows' (int32 rows and positions),
    not 4 bytes for each of the 2M rows."""
    n = 2_000_000
    rng = np.random.default_rng(1)
    counts = np.zeros(n, np.uint32)
    counts[rng.choice(n, 50_000, replace=False)] = 1
    order = popularity_order(counts, n, rng.choice(n, 20_000, replace=False))
    pos = positions_of(order)
    held = pos.kept_rows.nbytes + pos.kept_at.nbytes
    assert held <= 8 * 70_000, held
