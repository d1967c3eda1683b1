"""The dispatcher and gather kernels against their numpy twins (hypothesis and degenerate cases)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from hotline.dispatch import Dispatcher
from hotline.kernels import dispatch
from hotline.kernels.gather import assemble_rows, gather_rows, scatter_rows
from hotline.kernels.probe import hot_rank_index, rank_gather, remap_gather
from hotline.placement import Placement


@st.composite
def batch_and_placement(draw):
    T = draw(st.integers(1, 4))
    L = draw(st.integers(1, 3))
    sizes = [draw(st.integers(1, 12)) for _ in range(T)]
    B = draw(st.integers(0, 12))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    sparse = np.stack([rng.integers(0, n, (B, L)) for n in sizes], axis=1).astype(np.int32).reshape(B, T, L)
    hot = [rng.permutation(n)[: draw(st.integers(0, n))] for n in sizes]
    return sparse, Placement.from_hot_ids(sizes, hot), L


@settings(max_examples=60, deadline=None)
@given(batch_and_placement())
def test_split_matches_twin(case):
    sparse, placement, L = case
    mb = Dispatcher(placement, L, max_batch_size=max(1, sparse.shape[0])).split(sparse)
    expect = naive.split_batch(sparse, placement.table_sizes, placement.hot_ids)
    assert mb.popular_samples.tolist() == expect["popular"]
    assert mb.non_popular_samples.tolist() == expect["non_popular"]
    for name in ("pop_ids", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "working_set"):
        assert getattr(mb, name).tolist() == expect[name], name


def test_degenerate_placements():
    sizes = [5, 3]
    sparse = np.array([[[0], [1]], [[4], [1]], [[4], [2]]], dtype=np.int32)
    all_hot = Dispatcher(Placement.all_hot(sizes), 1, 3).split(sparse)
    assert all_hot.num_popular == 3 and all_hot.working_set.size == 0
    assert all_hot.pop_ids.tolist() == [0, 6, 4, 6, 4, 7]  # hot slot = row id, table 1 starts at slot 5
    all_cold = Dispatcher(Placement.all_cold(sizes), 1, 3).split(sparse)
    assert all_cold.num_popular == 0 and all_cold.hot_pos.size == 0
    # cold rows repeated within the batch are gathered once: fused ids 0, 6, 4, 7
    assert all_cold.working_set.tolist() == [0, 6, 4, 7]
    assert all_cold.cold_slot.tolist() == [0, 1, 2, 1, 2, 3]


def test_dispatcher_is_reusable_and_scratch_stays_clean():
    d = Dispatcher(Placement.all_cold([4]), 1, 4, in_flight=2)
    a = d.split(np.array([[[3]], [[3]]], np.int32))
    assert (d.slot_map == -1).all()
    b = d.split(np.array([[[1]], [[3]]], np.int32))
    assert a.working_set.tolist() == [3] and b.working_set.tolist() == [1, 3]


def test_out_of_range_names_table_and_id():
    d = Dispatcher(Placement.all_cold([4, 6]), 1, 2)
    with pytest.raises(IndexError, match=r"table 1: id 6 out of range \[0, 6\)"):
        d.split(np.array([[[0], [2]], [[1], [6]]], np.int32))
    with pytest.raises(IndexError, match="table 0: id -1"):
        d.split(np.array([[[-1], [2]]], np.int32))
    with pytest.raises(ValueError, match="exceeds"):
        d.split(np.zeros((3, 2, 1), np.int32))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(0, 40), st.integers(1, 7), st.integers(0, 2**31))
def test_gather_scatter_match_twins(rows, n, dim, seed):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(rows, dim)).astype(np.float32)
    ids = rng.integers(0, rows, n)
    out = np.empty((n + 3, dim), np.float32)
    np.testing.assert_array_equal(gather_rows(table, ids, out), naive.gather_rows(table, ids))
    state = rng.random(rows).astype(np.float32)
    np.testing.assert_array_equal(gather_rows(state, ids, np.empty(n, np.float32)), state[ids])
    uniq = np.unique(ids)
    src = rng.normal(size=(uniq.size, dim)).astype(np.float32)
    expect = naive.scatter_rows(table, uniq, src)
    scatter_rows(table, uniq, src)
    np.testing.assert_array_equal(table, expect)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 30), st.integers(1, 5))
def test_assemble_rows_matches_twin(seed, n, dim):
    rng = np.random.default_rng(seed)
    hot = rng.normal(size=(7, dim)).astype(np.float32)
    work = rng.normal(size=(4, dim)).astype(np.float32)
    perm = rng.permutation(n)
    k = int(rng.integers(0, n + 1))
    hot_pos, cold_pos = perm[:k], perm[k:]
    hot_slot, cold_slot = rng.integers(0, 7, k), rng.integers(0, 4, n - k)
    out = assemble_rows(np.empty((n, dim), np.float32), hot, hot_pos, hot_slot, work, cold_pos, cold_slot)
    expect = naive.scatter_rows(np.zeros((n, dim), np.float32), hot_pos, naive.gather_rows(hot, hot_slot))
    expect = naive.scatter_rows(expect, cold_pos, naive.gather_rows(work, cold_slot))
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("chunks", [1, 2, 3, 7])
@pytest.mark.parametrize("fused", [False, True])
def test_split_is_the_same_for_any_chunking(chunks, fused):
    """The split cuts the batch into chunks, each writing at offsets from the counts of the chunks before it:
    the result must not depend on the cut, including chunks that hold no popular (or no non-popular) sample
    and a batch with an out-of-range id."""
    rng = np.random.default_rng(chunks)
    sizes = [50, 7, 300]
    B, L = 203, 2
    sparse = np.stack([rng.integers(0, n, (B, L)) for n in sizes], axis=1).astype(np.int32)
    sparse[:40] = 0  # a run of popular samples (row 0 is hot in every table): a chunk with no cold lookup
    hot = [np.concatenate([[0], rng.permutation(np.arange(1, n))[: n // 2]]) for n in sizes]
    placement = Placement.from_hot_ids(sizes, hot)
    d = Dispatcher(placement, L, B)
    ids = sparse.reshape(B, -1)
    expect = naive.split_batch(sparse, sizes, hot)
    got = dispatch.split_batch(ids, d.col_offset, d.col_size, d.remap, d.slot_map, d._ring[0], fused, chunks)
    if fused:
        assert got[0].size == 0 and got[1].tolist() == list(range(B))
    else:
        assert got[0].tolist() == expect["popular"] and got[1].tolist() == expect["non_popular"]
        names = ("pop_ids", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "working_set")
        for name, arr in zip(names, got[2:8]):
            assert arr.tolist() == expect[name], name
    assert (d.slot_map == -1).all()
    ids[150, 3] = 7  # table 1 has 7 rows: the first bad sample is found whatever the chunking
    ids[190, 0] = -2
    bad = dispatch.split_batch(ids, d.col_offset, d.col_size, d.remap, d.slot_map, d._ring[0], fused, chunks)
    assert int(np.flatnonzero(bad[-1] >= 0)[0]) == 150 and bad[-1][150] == 3 and bad[0].size == 0


def test_remap_gather_probe_matches_twin():
    rng = np.random.default_rng(0)
    remap = rng.integers(-1, 1000, 500).astype(np.int32)
    col_offset = np.array([0, 100, 400], np.int64)
    ids = np.stack([rng.integers(0, 100, 300), rng.integers(0, 300, 300), rng.integers(0, 100, 300)], 1)
    out = np.empty(ids.size + 5, np.int32)
    np.testing.assert_array_equal(
        remap_gather(ids, col_offset, remap, out), naive.remap_gather(ids, col_offset, remap)
    )
    with pytest.raises(ValueError, match="ids must be"):
        remap_gather(ids[:, :2], col_offset, remap, out)


@settings(max_examples=60, deadline=None)
@given(batch_and_placement(), st.integers(1, 6), st.booleans(), st.integers(0, 3), st.integers(0, 2**31))
def test_two_pass_split_matches_twin_for_any_chunking(case, chunks, fused, n_bad, seed):
    """The lookup pass and the write pass, cut into any number of chunks (chunks with no popular, no hot or no
    cold lookup, empty batches): the same arrays as the twin, the scratch map left clean, and with ids out of
    range (negative or past the table) the first bad sample and its column, whatever chunk holds it."""
    sparse, placement, L = case
    B = sparse.shape[0]
    d = Dispatcher(placement, L, max(1, B))
    ids = np.ascontiguousarray(sparse.reshape(B, sparse.shape[1] * L))
    args = (d.col_offset, d.col_size, d.remap, d.slot_map, d._ring[0], fused, chunks)
    got = dispatch.split_batch(ids, *args)
    expect = naive.split_batch(sparse, placement.table_sizes, placement.hot_ids)
    assert (got[-1] == -1).all() and (d.slot_map == -1).all()
    if fused:
        assert got[0].size == 0 and got[1].tolist() == list(range(B))
        assert d._ring[0]["is_popular"][:B].tolist() == [b in expect["popular"] for b in range(B)]
    else:
        assert got[0].tolist() == expect["popular"] and got[1].tolist() == expect["non_popular"]
        names = ("pop_ids", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "working_set")
        for name, arr in zip(names, got[2:8], strict=True):
            assert arr.tolist() == expect[name], name
    if B == 0 or n_bad == 0:
        return
    rng = np.random.default_rng(seed)
    C = ids.shape[1]
    where = [(int(rng.integers(B)), int(rng.integers(C))) for _ in range(n_bad)]
    for b, c in where:
        ids[b, c] = -1 - int(rng.integers(3)) if rng.random() < 0.5 else d.col_size[c] + int(rng.integers(3))
    first = min(where)
    bad = dispatch.split_batch(ids, *args)
    assert all(a.size == 0 for a in bad[:-1])
    assert int(np.flatnonzero(bad[-1] >= 0)[0]) == first[0] and bad[-1][first[0]] == first[1]
    assert (d.slot_map == -1).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300), st.sampled_from(["none", "all", "some", "word edges"]), st.integers(0, 2**31))
def test_hot_rank_index_gives_every_rows_slot(rows, hot_set, seed):
    """The compact index the rank probe reads: decoded row by row (and by the probe's kernel), every row's
    slot equals the remap's, for an empty hot set, all rows hot, any subset, and rows on 64-row word edges,
    with row counts that are not multiples of 64; the rows past the end read as cold."""
    rng = np.random.default_rng(seed)
    remap = np.full(rows, -1, np.int32)
    if hot_set == "all":
        hot = np.arange(rows)
    elif hot_set == "word edges":
        hot = np.array([r for r in range(rows) if r % 64 in (0, 63)], dtype=np.int64)
    elif hot_set == "some":
        hot = rng.permutation(rows)[: int(rng.integers(0, rows + 1))]
    else:
        hot = np.zeros(0, np.int64)
    remap[hot] = rng.permutation(hot.shape[0])  # slots in any order, as a placement's
    words, rank_to_slot = hot_rank_index(remap)
    assert words.dtype == np.uint64 and words.shape[0] == 2 * ((rows + 63) // 64)
    decoded = naive.hot_rank_slots(words, rank_to_slot)
    assert decoded[:rows] == remap.tolist() and set(decoded[rows:]) <= {-1}
    ids = np.arange(rows).reshape(rows, 1)
    out = np.empty(rows + 1, np.int32)
    got = rank_gather(ids, np.zeros(1, np.int64), (words, rank_to_slot), out)
    np.testing.assert_array_equal(got, remap)


def test_rank_probe_matches_the_remap_probe():
    rng = np.random.default_rng(1)
    remap = np.full(500, -1, np.int32)
    hot = rng.permutation(500)[:130]
    remap[hot] = rng.permutation(130)
    col_offset = np.array([0, 100, 400], np.int64)
    ids = np.stack([rng.integers(0, 100, 300), rng.integers(0, 300, 300), rng.integers(0, 100, 300)], 1)
    out = np.empty(ids.size, np.int32)
    want = naive.remap_gather(ids, col_offset, remap)
    np.testing.assert_array_equal(rank_gather(ids, col_offset, hot_rank_index(remap), out), want)
    with pytest.raises(ValueError, match="out must be int32"):
        rank_gather(ids, col_offset, hot_rank_index(remap), np.empty(ids.size, np.int64))


def test_the_slot_table_is_sized_by_the_batch_not_the_rows():
    """The cold rows are numbered through a hash table sized by the batch's lookups (not an array over the 50
    million fused rows), left clean after each split, with the same working set as first occurrence gives;
    more cold lookups than it was sized for go through a table of their own."""
    rows = 50_000_000
    d = Dispatcher(Placement.all_cold([rows]), 1, 64)
    assert d.slot_map.nbytes <= 64 * 2 * 16 * 2
    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, (64, 1, 1)).astype(np.int64)
    ids[1::3] = ids[0]  # repeats
    got = d.split(ids)
    flat = ids.reshape(-1)
    first = flat[np.sort(np.unique(flat, return_index=True)[1])]
    assert got.working_set.tolist() == first.tolist() and (d.slot_map == -1).all()
    assert np.array_equal(got.working_set[got.cold_slot], flat[got.cold_pos])
    big = rng.integers(0, rows, (64, 40)).astype(np.int64)  # 2,560 lookups, twice the table's room
    out = dispatch.split_batch(
        big, np.zeros(40, np.int64), np.full(40, rows), d.remap, d.slot_map, dispatch.new_buffers(64 * 40, 64)
    )
    order = big.reshape(-1)
    assert out[7].tolist() == order[np.sort(np.unique(order, return_index=True)[1])].tolist()
    assert (d.slot_map == -1).all()
