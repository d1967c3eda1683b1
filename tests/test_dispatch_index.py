"""The dispatcher's two indexes (hotline.dispatch.INDEXES): the dense remap of every row and the hot table of the
hot rows only. Both give the numpy twin's split on one-hot, multi-hot and padded bags; the hot table's kernels
(new_hot_table, lookup_slots) against a numpy twin of the same probing; HotSlots against the placement."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from hotline.dispatch import INDEXES, Dispatcher
from hotline.kernels import dispatch
from hotline.placement import Placement
from hotline.table_layout import BagLayout, TableLayout

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def twin_lookup(table: np.ndarray, fids: np.ndarray) -> np.ndarray:
    """numpy twin of the hot table's probe: from each key's home entry (Fibonacci hashing of the top bits)
    step by one entry until the key or an empty entry; the slot, or -1."""
    M = table.shape[0]
    bits = M.bit_length() - 1
    with np.errstate(over="ignore"):
        at = ((fids.astype(np.uint64) * GOLDEN) >> np.uint64(64 - bits)).astype(np.int64)
    out = np.full(fids.shape[0], -2, np.int64)
    todo = np.arange(fids.shape[0])
    while todo.size:
        key = table[at[todo], 0]
        hit, empty = key == fids[todo], key == -1
        out[todo[hit]] = table[at[todo[hit]], 1]
        out[todo[empty]] = -1
        todo = todo[~(hit | empty)]
        at[todo] = (at[todo] + 1) % M
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 300), st.integers(0, 2**31), st.booleans())
def test_hot_table_matches_its_twin_and_a_dict(n, seed, wide):
    rng = np.random.default_rng(seed)
    top = 2**40 if wide else 5 * n + 10  # keys past int32 make an int64 table
    keys = (
        rng.choice(top, size=n, replace=False)
        if not wide
        else np.unique(np.append(rng.integers(0, top, n), 2**35))
    )
    slots = rng.permutation(keys.shape[0]).astype(np.int64)
    table = dispatch.new_hot_table(keys, slots)
    assert table.dtype == (np.int64 if wide else np.int32)
    assert (
        table.shape[0] >= dispatch.LOAD_INVERSE * keys.shape[0] and table.shape[0] & (table.shape[0] - 1) == 0
    )
    assert np.count_nonzero(table[:, 0] >= 0) == keys.shape[0]
    queries = np.concatenate([keys, rng.integers(0, top, 200)]).astype(np.int64)
    expect = dict(zip(keys.tolist(), slots.tolist()))
    got = dispatch.lookup_slots(table, queries)
    assert got.tolist() == [expect.get(q, -1) for q in queries.tolist()]
    np.testing.assert_array_equal(got, twin_lookup(table, queries))


@st.composite
def bags_and_placement(draw):
    T = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 12)) for _ in range(T)]
    bag_sizes = [draw(st.integers(1, 3)) for _ in range(T)]
    padded = draw(st.booleans())
    B = draw(st.integers(0, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    cols = [t for t, n in enumerate(bag_sizes) for _ in range(n)]
    sparse = (
        np.stack([rng.integers(0, sizes[t], B) for t in cols], axis=1).astype(np.int32).reshape(B, len(cols))
    )
    if padded:  # a bag's tail may be padding: keep each bag's real ids first
        for c, t in enumerate(cols):
            first = cols.index(t)
            if c > first:
                sparse[(rng.random(B) < 0.4) | (sparse[:, c - 1] == -1), c] = -1
    hot = [rng.permutation(n)[: draw(st.integers(0, n))] for n in sizes]
    return sparse, Placement.from_hot_ids(sizes, hot), BagLayout(TableLayout(sizes), bag_sizes, padded)


@settings(max_examples=60, deadline=None)
@given(bags_and_placement(), st.booleans())
def test_both_indexes_split_as_the_twin(case, fused):
    sparse, placement, bags = case
    expect = naive.split_batch(sparse, placement.table_sizes, placement.hot_ids, bag_sizes=bags.bag_sizes)
    for index in INDEXES:
        d = Dispatcher(placement, bags, max(1, sparse.shape[0]), index=index)
        mb = d.split(sparse, fused=fused)
        if fused:
            assert mb.num_popular == 0 and mb.popular_count == len(expect["popular"]), index
            continue
        assert mb.popular_samples.tolist() == expect["popular"], index
        assert mb.non_popular_samples.tolist() == expect["non_popular"], index
        names = ["pop_ids", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "working_set"]
        for name in names + (["pop_pos"] if bags.padded else []):
            assert getattr(mb, name).tolist() == expect[name], (index, name)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("index", INDEXES)
def test_hot_slots_are_the_placements_remap(index, padded):
    sizes = [70_000, 1, 120_000, 50_000]  # 4,800 hot rows at random: keys that collide in the hot table
    rng = np.random.default_rng(3)
    placement = Placement.from_hot_ids(sizes, [rng.permutation(n)[: n // 50] for n in sizes])
    d = Dispatcher(placement, BagLayout(TableLayout(sizes), [2, 1, 3, 1], padded), 4, index=index)
    every = np.arange(sum(sizes))
    np.testing.assert_array_equal(d.row_remap[every], placement.fused_remap())
    np.testing.assert_array_equal(
        d.row_remap[every[::-2][:12].reshape(3, 4)], placement.fused_remap()[every[::-2][:12]].reshape(3, 4)
    )
    for bad in (-1, sum(sizes)):
        with pytest.raises(IndexError, match=r"fused row ids must lie in \[0, 240001\)"):
            d.row_remap[np.array([0, bad])]


def test_the_hot_table_is_sized_by_the_hot_rows_and_the_remap_by_every_row():
    sizes = [1_000_000, 3]
    placement = Placement.from_hot_ids(sizes, [np.arange(0, 1_000_000, 1000), np.array([2])])
    dense = Dispatcher(placement, 1, 8)
    table = Dispatcher(placement, 1, 8, index="hash")
    assert dense.remap.nbytes == 4 * sum(sizes)
    assert table.remap.nbytes == 4096 * 2 * 4  # 1,001 hot rows: 4,096 entries of two int32 (a quarter full)
    padded = Dispatcher(placement, BagLayout(TableLayout(sizes), [2, 1], padded=True), 8)
    assert padded.remap.nbytes == 4 * (sum(sizes) + 2)  # one padded remap, not a second copy beside it
    assert padded.row_remap.index is padded.remap
    with pytest.raises(ValueError, match="index must be one of"):
        Dispatcher(placement, 1, 8, index="tree")


def test_the_index_is_the_remap_only_on_one_rank_with_the_rows_in_memory():
    """``index_for``: the dense remap (4 bytes a row) on one rank with the memory store; the hot table on N ranks
    and on the disk store, whose tables are beyond DRAM (its per-row bytes: tests/test_host_bytes.py)."""
    from hotline.dispatch import index_for

    assert index_for(1) == "dense"
    assert index_for(1, on_disk=True) == index_for(2) == index_for(4, on_disk=True) == "hash"
