"""A row file's order (``hotline.tiers.disk_pages.OrderFile``) is read, never mapped: it indexes as the array it
holds (slices of any step, ints, int arrays in any order), and a pass over it, or over the file with its rows
(``RowFile.read_all``), holds a chunk of it in memory whatever the row count: the resident set does not grow
with the rows, and the order file has no page in this process's mappings."""

from pathlib import Path

import numpy as np
import pytest

from hotline.tiers import disk_pages
from hotline.tiers.disk_file import RowFile
from hotline.tiers.disk_pages import OrderFile, order_chunks


@pytest.fixture
def small(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_pages, "ORDER_CHUNK", 7)  # windows and chunks cut everywhere
    order = np.random.default_rng(0).permutation(100).astype(np.int32)
    np.save(tmp_path / "o.npy", order)
    return order, OrderFile(tmp_path / "o.npy")


KEYS = [slice(None), slice(3, 50), slice(None, None, 3), slice(90, 5, -4), slice(-10, None), slice(40, 20),
        5, -1, np.int64(99), [4, 4, 99, 0, 50], np.array([[1, 2], [98, 7]]), np.arange(100) % 2 == 0,
        np.array([], np.int64)]  # fmt: skip


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_it_indexes_as_the_array_it_holds(small, key):
    order, f = small
    got, want = f[key], order[key]
    assert np.asarray(got).dtype == order.dtype
    assert np.array_equal(got, want)


def test_it_reads_whole_as_an_array_and_in_chunks(small):
    order, f = small
    assert f.shape == order.shape and f.dtype == order.dtype and len(f) == 100
    assert np.array_equal(np.asarray(f), order)
    assert np.array_equal(np.arange(100)[f], np.arange(100)[order])  # an index of another array
    assert np.array_equal(np.concatenate(list(order_chunks(f, 9))), order)


def test_out_of_range_and_other_files_are_refused(small, tmp_path):
    _, f = small
    for key in (100, -101, [0, 100]):
        with pytest.raises(IndexError, match="out of bounds"):
            f[key]
    np.save(tmp_path / "floats.npy", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="not a row order"):
        OrderFile(tmp_path / "floats.npy")
    raw = (tmp_path / "o.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(raw[:-8])
    with pytest.raises(ValueError, match="cut short"):
        OrderFile(tmp_path / "cut.npy")


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _pass_peak(tmp_path, rows: int) -> int:
    """The peak resident set a pass of ``RowFile.read_all`` (rows and records, 1M rows a chunk) over a file of
    ``rows`` rows (one float each, in a shuffled order) adds; the order file must have no page mapped."""
    order = np.arange(rows, dtype=np.int32)
    order[: rows // 2] = order[: rows // 2][::-1]  # not one ascending run: read, not computed
    f = RowFile(tmp_path / f"rows{rows}.bin", rows, 1, 0, order, direct=False)
    del order
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
        before, seen = _status("VmRSS"), 0
        for got, _ in f.read_all(chunk_rows=1 << 20):
            seen += int(got[-1] != -1)
            assert ".order.npy" not in Path("/proc/self/maps").read_text()
        assert seen == -(-rows // (1 << 20))
        return _status("VmHWM") - before
    finally:
        f.close()


def test_a_pass_over_the_order_holds_a_chunk_whatever_the_row_count(tmp_path):
    """A pass over 40M rows (a 160 MB order) adds no more resident memory than one over 4M (a memory-mapped
    order added its whole 160 MB)."""
    small_peak = _pass_peak(tmp_path, 4_000_000)
    big_peak = _pass_peak(tmp_path, 40_000_000)
    # a few chunks of slack (4 MB of records and of order a chunk, two held): the heap may hold the small pass's
    assert big_peak < small_peak + (16 << 20), (small_peak, big_peak)
    assert big_peak < 40e6, big_peak
