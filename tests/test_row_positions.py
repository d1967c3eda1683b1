"""The disk store's row positions (``RowFile.positions``, :func:`hotline.tiers.disk_file.positions_of`): each
row's place in the file's order, equal to the inverse permutation, without an array of every row where the order
is the disk store's (counted rows, the never-counted rows in id order or table by table, the hot rows)."""

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


def test_never_counted_rows_go_table_by_table_likeliest_first_and_positions_stay_compact():
    """With the tables' sizes, the never-counted rows follow the counted ones table by table, the table with the
    most rows counted once per unseen row first (a table whose unseen rows are looked up most: the DRAM tier at
    the file's head holds them); every row once; the positions are the inverse, kept for the counted and hot
    rows only (each table's block is an ascending run of its own id range)."""
    sizes = [30_000, 50_000, 20_000]
    n = sum(sizes)
    counts = np.zeros(n, np.uint32)
    counts[np.arange(0, 30_000, 300)] = 5  # table 0: 100 rows counted, none once
    counts[30_000 + np.arange(0, 50_000, 100)] = 1  # table 1: 500 rows counted once
    counts[80_000 + np.arange(0, 20_000, 50)] = 1  # table 2: 400 rows counted once, 2.5x table 1's rate
    hot = np.array([5, 30_001, 80_003])
    order = popularity_order(counts, n, hot, sizes)
    assert np.array_equal(np.sort(order), np.arange(n)) and np.array_equal(order[-3:], hot)
    never = order[1000 : n - 3]
    table = np.searchsorted(np.cumsum(sizes), never, side="right")
    assert np.array_equal(
        np.flatnonzero(np.diff(table)) + 1, [20_000 - 400 - 1, 20_000 - 400 - 1 + 50_000 - 500 - 1]
    )
    assert list(table[[0, 30_000, -1]]) == [2, 1, 0]  # table 2, then 1, then 0 (no row counted once)
    assert np.array_equal(order, popularity_order(counts, n, hot)) is False
    pos = positions_of(order, 4096)
    assert isinstance(pos, RowPositions) and pos.kept_rows.shape[0] <= 1000 + 3
    assert np.array_equal(pos[np.arange(n)], _inverse(order))


def test_table_blocks_that_meet_in_ascending_order_stay_compact():
    """Table 0's block then table 2's (table 1's last): ascending across the meeting, yet two runs of their own
    id ranges (a run ends where ids jump), so the positions keep the counted and hot rows only."""
    sizes = [30_000, 50_000, 20_000]
    n = sum(sizes)
    counts = np.zeros(n, np.uint32)
    counts[np.arange(0, 30_000, 30)] = 1  # table 0: the likeliest unseen rows
    counts[30_000 + np.arange(0, 50_000, 1000)] = 2  # table 1: no row counted once
    counts[80_000 + np.arange(0, 20_000, 100)] = 1  # table 2: second
    order = popularity_order(counts, n, None, sizes)
    never = order[1000 + 50 + 200 :]
    assert never[0] == 1 and never[-1] == 79_999 and never[28_999] < never[29_000]  # 0's block, then 2's
    pos = positions_of(order, 4096)
    assert isinstance(pos, RowPositions) and pos.kept_rows.shape[0] == 1250
    assert np.array_equal(pos[np.arange(n)], _inverse(order))
