"""Kernels against their numpy twins in ``naive``: distinct / coalesce, the Criteo id table, and the bounds
checks of the row gather / scatter / assemble wrappers."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from hotline.kernels import criteo_parse, sparse_update
from hotline.kernels.criteo_parse import build_id_table, map_categories
from hotline.kernels.gather import assemble_rows, gather_rows, scatter_rows


@st.composite
def _ids(draw, max_rows=60, max_n=150):
    """(rows, int64 ids in [0, rows)): few rows make many duplicates, many rows few."""
    rows = draw(st.integers(1, max_rows))
    ids = draw(st.lists(st.integers(0, rows - 1), max_size=max_n))
    return rows, np.array(ids, dtype=np.int64)


# ---- distinct ----------------------------------------------------------------------------------------


def _check_distinct(ids, rows):
    scratch = sparse_update.new_scratch(rows)
    uniq, inverse = sparse_update.distinct(ids, scratch)
    exp_uniq, exp_inverse = naive.distinct(ids)
    np.testing.assert_array_equal(uniq, exp_uniq)
    np.testing.assert_array_equal(inverse, exp_inverse)
    assert uniq.dtype == inverse.dtype == np.int64
    assert (scratch == -1).all()  # left clean for the next call


@settings(max_examples=60, deadline=None)
@given(_ids())
def test_distinct_matches_twin(case):
    rows, ids = case
    _check_distinct(ids, rows)


@pytest.mark.parametrize(
    "ids",
    [[], [0], [3], [2, 2, 2, 2, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8, 7, 9, 8, 7, 0], [9] * 100 + [0]],
    ids=["empty", "zero", "single", "all-duplicate", "all-distinct", "repeats", "long-run"],
)
def test_distinct_degenerate(ids):
    _check_distinct(np.array(ids, dtype=np.int64), 10)


def test_distinct_reuses_one_scratch():
    scratch = sparse_update.new_scratch(8)
    for ids in ([5, 1, 5], [1, 7], [], [5, 5]):
        uniq, inverse = sparse_update.distinct(np.array(ids, dtype=np.int64), scratch)
        exp_uniq, exp_inverse = naive.distinct(ids)
        np.testing.assert_array_equal(uniq, exp_uniq)
        np.testing.assert_array_equal(inverse, exp_inverse)


# ---- coalesce ----------------------------------------------------------------------------------------
# The kernel sums each distinct id's gradient rows one at a time in input order, in float32, exactly as the
# twin does, so the sums agree bit for bit (no tolerance).


def _grads(seed, n, dim):
    rng = np.random.default_rng(seed)
    # Mixed magnitudes so that a different summation order would round differently.
    return (rng.normal(size=(n, dim)) * 10.0 ** rng.integers(-3, 4, size=(n, 1))).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(_ids(), st.integers(1, 9), st.integers(0, 2**31), st.booleans())
def test_coalesce_matches_twin(case, dim, seed, own_scratch):
    rows, ids = case
    grads = _grads(seed, ids.shape[0], dim)
    scratch = sparse_update.new_scratch(rows) if own_scratch else None
    uniq, gsum = sparse_update.coalesce(ids, grads, scratch, rows)
    exp_uniq, exp_gsum = naive.coalesce(ids, grads)
    np.testing.assert_array_equal(uniq, exp_uniq)
    np.testing.assert_array_equal(gsum, exp_gsum)
    assert gsum.dtype == np.float32 and gsum.shape == (len(exp_uniq), dim)
    if scratch is not None:
        assert (scratch == -1).all()


@pytest.mark.parametrize(
    "ids",
    [[], [4], [4] * 50, [0, 0, 1, 1, 0], list(range(20))],
    ids=["empty", "single", "all-duplicate", "pairs", "all-distinct"],
)
@pytest.mark.parametrize("rows", [None, 20])
def test_coalesce_degenerate(ids, rows):
    ids = np.array(ids, dtype=np.int64)
    grads = _grads(len(ids), len(ids), 3)
    uniq, gsum = sparse_update.coalesce(ids, grads, None, rows)
    exp_uniq, exp_gsum = naive.coalesce(ids, grads)
    np.testing.assert_array_equal(uniq, exp_uniq)
    np.testing.assert_array_equal(gsum, exp_gsum)


def test_coalesce_rejects_a_bad_scratch():
    ids, grads = np.array([1, 2]), np.ones((2, 1), np.float32)
    with pytest.raises(ValueError, match="scratch must be int32 with at least 5"):
        sparse_update.coalesce(ids, grads, np.full(5, -1, np.int64), 5)
    with pytest.raises(ValueError, match="scratch must be int32 with at least 5"):
        sparse_update.coalesce(ids, grads, sparse_update.new_scratch(4), 5)


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("parts", ["none", "empty"])
def test_update_from_no_lookups_touches_nothing(kind, parts):
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    state = np.ones(4, np.float32)
    given_parts = [] if parts == "none" else [(np.zeros(0, np.int64), np.zeros((0, 3), np.float32), None)]
    touched = sparse_update.sparse_update_parts_(
        kind, table, state, given_parts, 0.1, 1e-8, sparse_update.new_scratch(4)
    )
    assert touched == 0
    np.testing.assert_array_equal(table, np.arange(12, dtype=np.float32).reshape(4, 3))
    np.testing.assert_array_equal(state, np.ones(4, np.float32))


# ---- Criteo id table ---------------------------------------------------------------------------------


def _id_table_case(values_per_table, seed):
    """(uniques, offsets, remap) for tables holding the given distinct raw values."""
    rng = np.random.default_rng(seed)
    values = [np.array(sorted(v), dtype=np.uint64) for v in values_per_table]
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int64)
    uniques = np.concatenate(values) if values else np.zeros(0, np.uint64)
    remap = rng.integers(0, 2**31 - 1, offsets[-1]).astype(np.int32)
    return uniques, offsets, remap


def _check_id_table(uniques, offsets, remap):
    """The built table holds exactly the twin's dict per table, in a power-of-two run of slots at least twice
    the number of values (load <= 1/2)."""
    table = build_id_table(uniques, offsets, remap)
    id_maps = naive.criteo_id_maps(uniques, offsets, remap)
    assert table.num_tables == len(id_maps)
    assert table.slot_offsets[0] == 0 and table.slot_offsets[-1] == table.keys.shape[0] == table.ids.shape[0]
    for t, expect in enumerate(id_maps):
        lo, hi = table.slot_offsets[t], table.slot_offsets[t + 1]
        slots = int(hi - lo)
        assert slots & (slots - 1) == 0 and slots >= max(2 * len(expect), 2)
        held = table.ids[lo:hi] != -1
        got = {int(k): int(i) for k, i in zip(table.keys[lo:hi][held], table.ids[lo:hi][held])}
        assert int(held.sum()) == len(expect)
        assert got == expect
    return table, id_maps


_U64_VALUES = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**32, 2**63, 2**64 - 1])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.sets(_U64_VALUES, max_size=40), max_size=5),
    st.integers(0, 30),
    st.floats(0.0, 1.0),
    st.integers(0, 2**31),
)
def test_id_table_and_map_categories_match_dicts(values_per_table, n, absent_share, seed):
    table, id_maps = _check_id_table(*_id_table_case(values_per_table, seed))
    rng = np.random.default_rng(seed)
    T = len(id_maps)
    raw = rng.integers(0, 2**64 - 1, size=(n, T), dtype=np.uint64, endpoint=True)  # almost surely absent
    for t, ids in enumerate(id_maps):
        present = (rng.random(n) >= absent_share) & bool(ids)
        if ids:
            raw[present, t] = rng.choice(np.array(list(ids), dtype=np.uint64), int(present.sum()))
    expect, missing = naive.criteo_map_categories(raw, id_maps)
    out = np.empty((n, T), np.int32)
    if missing:
        with pytest.raises(ValueError, match=f"^{missing} raw category values are not in the id table"):
            map_categories(raw, table, out)
    else:
        map_categories(raw, table, out)
        np.testing.assert_array_equal(out, expect)


def _colliding(count, mask, slot):
    """``count`` raw values whose first probe (Fibonacci hash, as the kernel's) is ``slot`` of ``mask + 1``:
    they fill one probe chain, and with ``slot == mask`` it wraps around the table's end."""
    mult = criteo_parse._HASH_MULTIPLIER
    found = [v for v in range(100_000) if ((v * mult) % 2**64 >> 32) & mask == slot]
    assert len(found) >= count
    return found[:count]


@pytest.mark.parametrize(
    "values_per_table",
    [
        [],
        [set()],
        [set(), set()],
        [{0}],
        [{2**64 - 1}],
        [{0, 1, 2**63, 2**64 - 1}],
        [set(_colliding(4, 7, 7))],
        [set(_colliding(4, 7, 0)), set(), set(_colliding(8, 15, 15))],
        [set(range(1000)), {7}],
    ],
    ids=[
        "no-tables",
        "one-empty",
        "two-empty",
        "zero",
        "max",
        "extremes",
        "chain-wraps",
        "chains",
        "large",
    ],
)
def test_id_table_degenerate(values_per_table):
    uniques, offsets, remap = _id_table_case(values_per_table, 3)
    table, id_maps = _check_id_table(uniques, offsets, remap)
    T = len(id_maps)
    # Every value of every table, then the all-duplicate batch: one value repeated down each column.
    n = max([len(m) for m in id_maps], default=0)
    if all(id_maps):
        values = [list(m) for m in id_maps]
        raw = np.array([[v[i % len(v)] for v in values] for i in range(n)], np.uint64).reshape(n, T)
        same = np.repeat(raw[:1], 17, axis=0) if n else raw
        for batch in (raw, same, raw[:0]):
            out = np.empty(batch.shape, np.int32)
            map_categories(batch, table, out)
            np.testing.assert_array_equal(out, naive.criteo_map_categories(batch, id_maps)[0])
    if T:
        # One value absent from each table (an empty table has none): each counts once.
        absent = [next(v for v in range(2**63, 2**64) if v not in m) for m in id_maps]
        with pytest.raises(ValueError, match=f"^{T} raw category values"):
            map_categories(np.array([absent], np.uint64), table, np.empty((1, T), np.int32))


# ---- gather / scatter / assemble bounds checks ---------------------------------------------------------


def _tables(rows, dim):
    table = np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)
    return {"rows": table, "values": table[:, 0].copy()}


@pytest.mark.parametrize("shape", ["rows", "values"])
@pytest.mark.parametrize(
    "ids, bad, pos",
    [([-1], -1, 0), ([0, 4, -3], -3, 2), ([5], 5, 0), ([1, 2, 5, 7], 5, 2), ([0, 2**40], 2**40, 1)],
    ids=["negative", "negative-later", "equal-size", "first-of-two", "huge"],
)
def test_gather_scatter_reject_out_of_range_ids(shape, ids, bad, pos):
    table = _tables(5, 3)[shape]
    before = table.copy()
    rows = np.array(ids, dtype=np.int64)
    message = re.escape(f"row id {bad} at position {pos} of rows out of range for a table of 5 rows")
    out = np.full((len(ids),) + table.shape[1:], 7.0, np.float32)
    with pytest.raises(IndexError, match=message):
        gather_rows(table, rows, out)
    assert (out == 7.0).all()  # nothing was read
    with pytest.raises(IndexError, match=message):
        scatter_rows(table, rows, out)
    np.testing.assert_array_equal(table, before)  # nothing was written


def test_gather_scatter_any_id_is_out_of_range_for_an_empty_table():
    table = np.zeros((0, 2), np.float32)
    with pytest.raises(IndexError, match="row id 0 at position 0 of rows out of range for a table of 0 rows"):
        gather_rows(table, np.array([0]), np.empty((1, 2), np.float32))
    with pytest.raises(IndexError, match="row id 0 at position 0"):
        scatter_rows(table, np.array([0]), np.empty((1, 2), np.float32))
    assert gather_rows(table, np.zeros(0, np.int64), np.empty((0, 2), np.float32)).shape == (0, 2)
    scatter_rows(table, np.zeros(0, np.int64), np.empty((0, 2), np.float32))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32])
def test_gather_scatter_accept_the_edge_ids(dtype):
    """Ids 0 and rows - 1 are in range, for every integer dtype the callers use; results are unchanged."""
    for table in _tables(5, 3).values():
        rows = np.array([4, 0], dtype=dtype)
        out = np.empty((3,) + table.shape[1:], np.float32)
        np.testing.assert_array_equal(gather_rows(table, rows, out), naive.gather_rows(table, rows))
        src = -np.ones((2,) + table.shape[1:], np.float32)
        expect = naive.scatter_rows(table, rows, src)
        scatter_rows(table, rows, src)
        np.testing.assert_array_equal(table, expect)


def test_gather_scatter_reject_short_buffers_and_bad_ids():
    table = _tables(5, 3)["rows"]
    rows = np.array([0, 1, 2])
    with pytest.raises(ValueError, match="staging buffer"):
        gather_rows(table, rows, np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="staging buffer"):
        gather_rows(table, rows, np.empty((3, 2), np.float32))
    with pytest.raises(ValueError, match="2 source rows"):
        scatter_rows(table, rows, np.empty((2, 3), np.float32))
    with pytest.raises(ValueError, match="4 source rows"):
        scatter_rows(table, rows, np.empty((4, 3), np.float32))
    for bad in (np.array([0.0, 1.0]), np.array([[0, 1]])):
        with pytest.raises(ValueError, match="rows must be a 1-d integer array"):
            gather_rows(table, bad, np.empty((3, 3), np.float32))
        with pytest.raises(ValueError, match="rows must be a 1-d integer array"):
            scatter_rows(table, bad, np.empty((3, 3), np.float32))


def _assemble_case():
    """6 output rows: positions 0, 2, 4 from the hot table (7 rows), 1, 3, 5 from the working buffer (4)."""
    rng = np.random.default_rng(0)
    hot, work = rng.normal(size=(7, 2)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)
    index = {
        "hot_pos": np.array([0, 2, 4]),
        "hot_slot": np.array([6, 0, 3]),
        "cold_pos": np.array([1, 3, 5]),
        "cold_slot": np.array([3, 3, 0]),
    }
    return np.zeros((6, 2), np.float32), hot, work, index


def _assemble(out, hot, work, index):
    return assemble_rows(
        out, hot, index["hot_pos"], index["hot_slot"], work, index["cold_pos"], index["cold_slot"]
    )


@pytest.mark.parametrize(
    "name, pos, bad, message",
    [
        ("hot_slot", 1, -1, "hot slot -1 at position 1 of hot_slot out of range for the hot table of 7 rows"),
        ("hot_slot", 2, 7, "hot slot 7 at position 2 of hot_slot out of range for the hot table of 7 rows"),
        ("cold_slot", 0, 4, "working slot 4 at position 0 of cold_slot out of range for the working buffer"),
        ("cold_slot", 1, -2, "working slot -2 at position 1 of cold_slot"),
        ("hot_pos", 0, 6, "position 6 at position 0 of hot_pos out of range for the output of 6 rows"),
        ("cold_pos", 2, -1, "position -1 at position 2 of cold_pos out of range for the output of 6 rows"),
    ],
)
def test_assemble_rows_rejects_out_of_range_indices(name, pos, bad, message):
    out, hot, work, index = _assemble_case()
    index[name][pos] = bad
    with pytest.raises(IndexError, match=re.escape(message)):
        _assemble(out, hot, work, index)
    assert (out == 0).all()


def test_assemble_rows_valid_and_mismatched_lengths():
    out, hot, work, index = _assemble_case()
    expect = naive.scatter_rows(out, index["hot_pos"], naive.gather_rows(hot, index["hot_slot"]))
    expect = naive.scatter_rows(expect, index["cold_pos"], naive.gather_rows(work, index["cold_slot"]))
    np.testing.assert_array_equal(_assemble(out.copy(), hot, work, index), expect)
    index["hot_slot"] = index["hot_slot"][:2]
    with pytest.raises(ValueError, match="must match"):
        _assemble(out, hot, work, index)


@pytest.mark.parametrize("shape", ["rows", "values"])
def test_copy_rows_matches_twin_and_checks_its_indices(shape):
    """``dst[dst_rows] = src[src_rows]`` against the gather-then-scatter twin, for tables and state arrays; an
    index out of range on either side is refused before anything is written."""
    from hotline.kernels.gather import copy_rows

    src = _tables(9, 3)[shape]
    dst = -_tables(7, 3)[shape]
    dst_rows, src_rows = np.array([6, 0, 3], np.int64), np.array([8, 8, 2], np.int64)
    expect = naive.scatter_rows(dst, dst_rows, naive.gather_rows(src, src_rows))
    copy_rows(dst, dst_rows, src, src_rows)
    np.testing.assert_array_equal(dst, expect)
    copy_rows(dst, dst_rows[:0], src, src_rows[:0])  # nothing to copy
    np.testing.assert_array_equal(dst, expect)
    with pytest.raises(IndexError, match="row 9 at position 1 of src_rows out of range for the source of 9"):
        copy_rows(dst, dst_rows[:2], src, np.array([0, 9]))
    with pytest.raises(IndexError, match="row 7 at position 0 of dst_rows"):
        copy_rows(dst, np.array([7]), src, np.array([0]))
    with pytest.raises(ValueError, match="must match"):
        copy_rows(dst, dst_rows, src, src_rows[:2])
    np.testing.assert_array_equal(dst, expect)


@pytest.mark.parametrize("state_shape", ["none", "per-row", "per-value"])
@given(seed=st.integers(0, 2**32 - 1), n_live=st.integers(0, 3))
@settings(max_examples=25, deadline=None)
def test_forward_stale_matches_twin(state_shape, seed, n_live):
    """The refresh's forwarding: each stale slot whose holder is live gets the holder's row and state, the
    rest are returned in order, against the twin's loop (no state, row-wise state and per-value state); and the
    partition the GPU path copies by (each holder's slots and theirs), against its twin."""
    from hotline.kernels.gather import forward_stale, partition_stale

    rng = np.random.default_rng(seed)
    dim, n = 4, 12

    def buffers(rows):
        w = rng.standard_normal((rows.size + 2, dim)).astype(np.float32)  # a buffer holds spare rows
        s = {"none": np.empty(0, np.float32), "per-row": rng.random(rows.size + 2, dtype=np.float32),
             "per-value": rng.random((rows.size + 2, dim), dtype=np.float32)}[state_shape]  # fmt: skip
        return w, s

    rows = rng.choice(100, n, replace=False).astype(np.int64)
    work, state = buffers(rows)
    slots = np.sort(rng.choice(n, rng.integers(0, n + 1), replace=False)).astype(np.int64)
    owners = rng.integers(0, 5, slots.size).astype(np.int64)  # steps 0..4; live ones below
    live_steps = rng.choice(5, n_live, replace=False)
    owner_slots = np.empty_like(slots)
    live = []
    for step in live_steps:
        theirs = rng.choice(100, 9, replace=False).astype(np.int64)
        mine = slots[owners == step]
        put = rng.choice(9, mine.size, replace=False) if mine.size <= 9 else None
        if put is None:  # more rows than this holder's working set: it did not hold them all
            owners[owners == step] = 99
            continue
        theirs[put] = rows[mine]  # the holder's working set holds each of its stale rows
        owner_slots[owners == step] = put
        live.append((int(step), *buffers(theirs), theirs))
    owner_slots[~np.isin(owners, [e[0] for e in live])] = -7  # not read for rows not forwarded
    expect_w, expect_s, expect_rest, expect_n = naive.forward_stale(
        work, state, slots, owners, owner_slots, rows, live
    )
    steps, held = [e[0] for e in live], [e[3] for e in live]
    expect_groups, expect_left = naive.partition_stale(slots, owners, owner_slots, rows, steps, held)
    groups, left = partition_stale(slots, owners, owner_slots, rows, steps, held)  # the GPU path's partition
    assert len(groups) == len(expect_groups) == len(live)
    for (mine, theirs), (expect_mine, expect_theirs) in zip(groups, expect_groups):
        np.testing.assert_array_equal(mine, expect_mine)
        np.testing.assert_array_equal(theirs, expect_theirs)
    np.testing.assert_array_equal(left, expect_left)
    n_fwd, rest = forward_stale(work, state, slots, owners, owner_slots, rows, live)
    assert n_fwd == expect_n
    np.testing.assert_array_equal(rest, expect_rest)
    np.testing.assert_array_equal(work, expect_w)
    np.testing.assert_array_equal(state, expect_s)


def test_forward_stale_refuses_a_holder_without_the_row():
    """A holder's recorded slot that holds another row (or lies past its working set) is refused by name
    (forwarding it would copy another row's value), by the CPU's forwarding and by the GPU path's partition alike.
    A slot past this working set is refused before any copy."""
    from hotline.kernels.gather import forward_stale, partition_stale

    work, state = np.zeros((3, 2), np.float32), np.zeros(3, np.float32)
    rows = np.array([10, 11, 12], np.int64)
    theirs = np.array([12, 11], np.int64)
    live = [(4, np.ones((2, 2), np.float32), np.ones(2, np.float32), theirs)]
    slots, owners = np.array([1, 2], np.int64), np.array([4, 4], np.int64)
    with pytest.raises(RuntimeError, match="stale row 12 is missing from the working set of step 4"):
        forward_stale(work, state, slots, owners, np.array([1, 1], np.int64), rows, live)
    with pytest.raises(RuntimeError, match="stale row 12 is missing from the working set of step 4"):
        partition_stale(slots, owners, np.array([1, 1], np.int64), rows, [4], [theirs])  # the GPU path's
    with pytest.raises(ValueError, match="1 live steps and 2 working sets"):
        partition_stale(slots, owners, np.array([1, 0], np.int64), rows, [4], [theirs, theirs])
    with pytest.raises(RuntimeError, match="stale row 11 is missing"):
        forward_stale(work, state, slots, owners, np.array([2, 0], np.int64), rows, live)
    with pytest.raises(IndexError, match="slot 3 at position 1 of slots"):
        forward_stale(work, state, np.array([0, 3], np.int64), owners, np.array([1, 0], np.int64), rows, live)
    with pytest.raises(ValueError, match="live step 4's buffers"):
        forward_stale(
            work, state, slots, owners, np.array([1, 0], np.int64), rows, [(4, *live[0][1:3], rows)]
        )
    assert forward_stale(work, state, slots, owners, np.array([1, 0], np.int64), rows, live)[0] == 2
    np.testing.assert_array_equal(work[1:], 1.0)


def test_host_rows_gather_skips_the_stale_slots():
    """A look-ahead fetch reads every row but the stale ones (the refresh reads those again): the skipped slots
    keep what the staging buffer held, the rest equal a plain gather, weights and state alike."""
    from hotline.tiers.cold_store import HostRows
    from hotline.tiers.sparse_optim import SparseOptimizer

    w = np.arange(40, dtype=np.float32).reshape(10, 4)
    host = HostRows(w, SparseOptimizer("rowwise-adagrad", 0.1))
    host.s[:] = np.arange(10, dtype=np.float32) + 100
    rows, skip = np.array([7, 2, 9, 0], np.int64), np.array([1, 3], np.int64)
    out_w, out_s = np.full((6, 4), -1, np.float32), np.full(6, -1, np.float32)
    got_w, got_s = host.gather(rows, out_w, out_s, skip=skip)
    assert got_w.shape == (4, 4) and got_s.shape == (4,)
    np.testing.assert_array_equal(got_w[[0, 2]], w[[7, 9]])
    np.testing.assert_array_equal(got_s[[0, 2]], host.s[[7, 9]])
    assert (got_w[[1, 3]] == -1).all() and (got_s[[1, 3]] == -1).all()
    full_w, full_s = host.gather(rows, np.empty((4, 4), np.float32), np.empty(4, np.float32))
    np.testing.assert_array_equal(full_w, w[rows])
    np.testing.assert_array_equal(full_s, host.s[rows])
