"""The initial rows drawn on their own (``kernels/initial_rows.py``) against their numpy twin,
:func:`hotline.tiers.initial_fill.initial_block` (the whole table's generator advanced by numpy): bit-identical
for random rows, first and last rows, runs of following rows, several dims, tables and seeds."""

import numpy as np
import pytest

from hotline.kernels.initial_rows import draw_fused, draw_rows, jump_tables
from hotline.tiers.initial_fill import initial_block

SIZES = np.array([1, 1000, 37, 70_001, 3_000_000_019])


def _twin(tables, rows, dim, seed, state):
    return np.concatenate(
        [initial_block(int(SIZES[t]), dim, seed, int(t), int(r), 1, state) for t, r in zip(tables, rows)]
    )


@pytest.mark.parametrize("seed", [0, 5, 2**40 + 3])
@pytest.mark.parametrize("dim", [1, 3, 8, 33])
def test_any_rows_are_the_whole_tables_rows(seed, dim):
    rng = np.random.default_rng(seed % 97 + dim)
    tables = rng.integers(0, SIZES.shape[0], 300)
    rows = (rng.random(300) * SIZES[tables]).astype(np.int64)
    firsts = np.zeros(SIZES.shape[0], np.int64)
    tables = np.concatenate([tables, np.arange(SIZES.shape[0]), np.arange(SIZES.shape[0])])
    rows = np.concatenate([rows, firsts, SIZES - 1])  # every table's first and last row
    out = np.full((rows.shape[0], dim + 2), np.nan, np.float32)
    draw_rows(tables, rows, dim, SIZES, jump_tables(seed, SIZES.shape[0]), out)
    assert np.array_equal(out, _twin(tables, rows, dim, seed, 2))


@pytest.mark.parametrize("dim", [1, 8])
def test_runs_of_following_rows_go_on_without_a_jump(dim):
    # a run of following rows, a repeat, a step back, a gap, another table between: each as drawn alone
    rows = np.r_[np.arange(500, 9000), 8999, 3, np.arange(4, 40), 60_000, 7, 8]
    tables = np.full(rows.shape[0], 3)
    tables[-2] = 1
    out = np.empty((rows.shape[0], dim), np.float32)
    draw_rows(tables, rows, dim, SIZES, jump_tables(11, SIZES.shape[0]), out)
    assert np.array_equal(out[:8500], initial_block(int(SIZES[3]), dim, 11, 3, 500, 8500))
    assert np.array_equal(out, _twin(tables, rows, dim, 11, 0))


@pytest.mark.parametrize("every", [1, 3, 5000])
def test_only_the_rows_taken_are_drawn_the_others_kept(every):
    """``take``: rows it skips keep their bytes, the others are as drawn alone, runs broken by skips included."""
    ids = np.r_[np.arange(990, 1035), np.arange(6000, 14000)]  # tables 1, 2 and 3
    take = np.zeros(ids.shape[0], bool)
    take[::every] = True
    take[50:60] = True
    jumps = jump_tables(4, SIZES.shape[0])
    whole = draw_fused(ids, SIZES, 8, jumps, np.empty((ids.shape[0], 9), np.float32))
    out = np.full((ids.shape[0], 9), 7.0, np.float32)
    draw_fused(ids, SIZES, 8, jumps, out, take=take)
    assert np.array_equal(out[take], whole[take]) and (out[~take] == 7.0).all()


def test_nothing_to_draw_and_shapes_checked():
    jumps = jump_tables(0, 2)
    out = np.empty((0, 4), np.float32)
    assert draw_rows(np.zeros(0), np.zeros(0), 4, SIZES[:2], jumps, out) is out
    with pytest.raises(ValueError, match="draw_rows"):
        draw_rows(np.zeros(3), np.zeros(3), 4, SIZES[:2], jumps, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="outside its table"):
        draw_rows(np.array([1]), np.array([1000]), 4, SIZES[:2], jumps, np.empty((1, 4), np.float32))
