"""PositionBits, the bitmap under PendingRows and WrittenRows, against a numpy bool array: every operation leaves
the same bits as the array packed (the bits past the last position clear), at every byte alignment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotline.tiers.pending_rows import PendingRows
from hotline.tiers.position_bits import PositionBits
from hotline.tiers.written_rows import WrittenRows


def packed(twin: np.ndarray) -> np.ndarray:
    return np.packbits(twin, bitorder="little")


def agrees(b: PositionBits, twin: np.ndarray) -> None:
    n = twin.shape[0]
    np.testing.assert_array_equal(b.bits, packed(twin))
    assert b.count() == int(twin.sum()) and b.nbytes == -(-n // 8) and b.num_rows == n
    np.testing.assert_array_equal(b.mask(np.arange(n)), twin)
    np.testing.assert_array_equal(b.range_mask(0, n), twin)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 13, 16, 45])
@pytest.mark.parametrize("fill", [False, True])
def test_starts_all_set_or_all_clear(n, fill):
    agrees(PositionBits(n, fill), np.full(n, fill))


@pytest.mark.parametrize("n", [18, 37, 45])
@pytest.mark.parametrize("on", [True, False])
def test_ranges_at_every_alignment(n, on):
    """Every range starting at 0..17, of every length up to 18 (empty ones and those ending at the last position
    too), over a random bitmap: exactly its bits change, read back the same by range_mask."""
    rng = np.random.default_rng(n)
    for lo in range(18):
        for hi in range(lo - 1, min(lo + 18, n) + 1):
            twin = rng.random(n) < 0.5
            b = PositionBits(n)
            b.bits[:] = packed(twin)
            b.set_range(lo, hi, on)  # hi = lo - 1: no range, nothing changes
            twin[lo : max(lo, hi)] = on
            agrees(b, twin)
            np.testing.assert_array_equal(b.range_mask(lo, max(lo, hi)), twin[lo : max(lo, hi)])


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), fill=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_operations_match_a_bool_array(n, fill, seed):
    """Sets and clears of random positions (repeats, any order, empty arrays), of random ranges and of all."""
    rng = np.random.default_rng(seed)
    b, twin = PositionBits(n, fill), np.full(n, fill)
    for _ in range(12):
        on, kind = bool(rng.integers(2)), rng.integers(10)
        if kind < 5:
            pos = rng.integers(0, n, rng.integers(0, 2 * n))
            b.set(pos, on)
            twin[pos] = on
        elif kind < 9:
            lo, hi = np.sort(rng.integers(0, n + 1, 2))
            b.set_range(int(lo), int(hi), on)
            twin[lo:hi] = on
        else:
            b.set_all(on)
            twin[:] = on
        agrees(b, twin)
        pos = rng.integers(0, n, 50)
        np.testing.assert_array_equal(b.mask(pos), twin[pos])
        lo, hi = np.sort(rng.integers(0, n + 1, 2))
        np.testing.assert_array_equal(b.range_mask(int(lo), int(hi)), twin[lo:hi])


def test_positions_past_two_to_the_31():
    """Positions beyond int32 (a sparse check: the bitmap's untouched pages are never written)."""
    n = 2**31 + 13
    b = PositionBits(n)
    edge = 2**31
    pos = np.array([0, edge - 1, edge, edge + 12, edge + 5, edge])
    b.set(pos)
    b.set_range(edge - 20, edge - 3)
    b.set(np.array([edge + 5]), False)
    b.set_range(edge - 10, edge - 8, False)
    want = {0, edge - 1, edge, edge + 12} | set(range(edge - 20, edge - 10)) | set(range(edge - 8, edge - 3))
    probe = np.arange(edge - 24, n)
    np.testing.assert_array_equal(b.mask(probe), np.isin(probe, list(want)))
    np.testing.assert_array_equal(b.range_mask(edge - 24, n), np.isin(probe, list(want)))
    assert b.mask(np.array([0, 1]))[0] and not b.mask(np.array([0, 1]))[1]
    assert b.bits[-1] == 1 << 4 and b.nbytes == -(-n // 8)


def test_pending_and_written_rows_are_position_bits():
    """PendingRows starts all pending and clears; WrittenRows starts with nothing marked and marks: the same bits
    as PositionBits set the other way, counted as one ``bits`` array a row structure."""
    n = 21
    p = PendingRows(np.arange(n), [n], 2, 1, seed=0)
    w = WrittenRows(n)
    p.clear(np.array([3, 20, 3]))
    p.clear_range(5, 17)
    w.mark(np.array([3, 20, 3]))
    w.mark_range(5, 17)
    np.testing.assert_array_equal(p.bits, ~w.bits & packed(np.ones(n, bool)))
    assert p.count() == n - w.count() == n - 14
    assert PendingRows.per_row == WrittenRows.per_row == ("bits",)
    w.clear()
    assert w.count() == 0 and w.base is None
