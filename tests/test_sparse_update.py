"""The sparse row-update kernels against their numpy twins, and the torch (CUDA-path) twin on CPU tensors."""

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import naive
from hotline.kernels import sparse_update
from hotline.tiers.sparse_optim import SparseOptimizer

# At most one state float per row here (but the sorted update: every kind); adagrad and adam: tests/test_optimizers.py
OPTS = ("sgd", "rowwise-adagrad")


def _case(seed, rows, n, dim, dup_range):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(rows, dim)).astype(np.float32)
    ids = rng.integers(0, min(rows, dup_range), n)
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    return table, ids, grads


def _twin_cases(test):
    """``test(seed, rows, n, dim, dup)`` on 40 of ``_case``'s inputs: 1 to 50 rows of 1 to 9 floats, up to 120
    ids drawn from the first ``dup`` rows (the fewer, the more duplicates)."""
    cases = given(seed=st.integers(0, 2**31), rows=st.integers(1, 50), n=st.integers(0, 120),
                  dim=st.integers(1, 9), dup=st.integers(1, 60))  # fmt: skip
    return settings(max_examples=40, deadline=None)(cases(test))


@_twin_cases
def test_sgd_matches_twin(seed, rows, n, dim, dup):
    table, ids, grads = _case(seed, rows, n, dim, dup)
    expect = naive.sparse_sgd(table, ids, grads, 0.05)
    touched = sparse_update.sparse_sgd_(table, ids, grads, 0.05)
    np.testing.assert_allclose(table, expect, rtol=1e-6, atol=1e-6)
    assert touched == len(set(ids.tolist()))


@_twin_cases
def test_rowwise_adagrad_matches_twin(seed, rows, n, dim, dup):
    table, ids, grads = _case(seed, rows, n, dim, dup)
    state = np.abs(np.random.default_rng(seed + 1).normal(size=rows)).astype(np.float32)
    exp_t, exp_s = naive.sparse_rowwise_adagrad(table, state, ids, grads, 0.05, 1e-8)
    sparse_update.sparse_rowwise_adagrad_(table, state, ids, grads, 0.05, 1e-8)
    np.testing.assert_allclose(state, exp_s, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(table, exp_t, rtol=1e-5, atol=1e-6)


def test_duplicates_summed_before_adagrad():
    """Row-wise Adagrad must see the summed gradient: two updates of half the gradient would differ."""
    table = np.zeros((2, 2), np.float32)
    state = np.zeros(2, np.float32)
    grads = np.array([[1.0, 1.0], [1.0, 1.0]], np.float32)
    sparse_update.sparse_rowwise_adagrad_(table, state, np.array([1, 1]), grads, 1.0, 0.0)
    assert state[1] == pytest.approx(4.0)  # mean of (1+1)^2 over two columns
    np.testing.assert_allclose(table[1], [-1.0, -1.0])  # -lr * 2 / sqrt(4)
    np.testing.assert_array_equal(table[0], [0.0, 0.0])


def test_empty_and_errors():
    table = np.ones((3, 2), np.float32)
    assert sparse_update.sparse_sgd_(table, np.zeros(0, np.int64), np.zeros((0, 2), np.float32), 0.1) == 0
    np.testing.assert_array_equal(table, 1.0)
    with pytest.raises(IndexError, match="row id 3 out of range"):
        sparse_update.sparse_sgd_(table, np.array([3]), np.zeros((1, 2), np.float32), 0.1)
    with pytest.raises(ValueError, match="grads must be float32"):
        sparse_update.sparse_sgd_(table, np.array([0]), np.zeros((2, 2), np.float32), 0.1)


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad"])
def test_torch_path_matches_numba_path(kind):
    """The CUDA code path (torch ops) run on CPU tensors equals the Numba path."""
    table, ids, grads = _case(3, 40, 300, 8, 25)
    opt = SparseOptimizer(kind, 0.1)
    t1, s1 = torch.from_numpy(table.copy()), opt.new_state(40)
    t2, s2 = torch.from_numpy(table.copy()), opt.new_state(40)
    opt.step(t1, s1, torch.from_numpy(ids), torch.from_numpy(grads))
    opt._step_torch(t2, s2, torch.from_numpy(ids), torch.from_numpy(grads))
    torch.testing.assert_close(t1, t2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-7)


def test_scratch_is_reused_clean_and_checked():
    table, ids, grads = _case(5, 30, 200, 4, 20)
    scratch = sparse_update.new_scratch(30)
    expect = naive.sparse_sgd(table, ids, grads, 0.1)
    sparse_update.sparse_sgd_(table, ids, grads, 0.1, scratch)
    np.testing.assert_allclose(table, expect, rtol=1e-6, atol=1e-6)
    assert (scratch == -1).all()  # left clean for the next call
    with pytest.raises(ValueError, match="scratch must be int32 with at least 30"):
        sparse_update.sparse_sgd_(table, ids, grads, 0.1, sparse_update.new_scratch(10))


def test_coalesce_first_occurrence_order():
    uniq, gsum = sparse_update.coalesce(
        np.array([4, 1, 4, 2]), np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
    )
    assert uniq.tolist() == [4, 1, 2]
    np.testing.assert_array_equal(gsum[:, 0], [4.0, 2.0, 4.0])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n1=st.integers(0, 40), n2=st.integers(0, 40), kind=st.sampled_from(OPTS))
def test_update_from_parts_equals_twin_on_the_concatenation(seed, n1, n2, kind):
    """Gradients read in place from two matrices (the second through positions) = the concatenated update."""
    rng = np.random.default_rng(seed)
    rows, dim = 25, 3
    table = rng.normal(size=(rows, dim)).astype(np.float32)
    state = np.abs(rng.normal(size=rows)).astype(np.float32)
    ids1, g1 = rng.integers(0, rows, n1), rng.normal(size=(n1, dim)).astype(np.float32)
    big = rng.normal(size=(n2 + 5, dim)).astype(np.float32)
    pos2 = rng.permutation(n2 + 5)[:n2]
    ids2 = rng.integers(0, rows, n2)
    ids, grads = np.concatenate([ids1, ids2]), np.concatenate([g1, big[pos2]])
    if kind == "sgd":
        exp_t, exp_s = naive.sparse_sgd(table, ids, grads, 0.05), state
    else:
        exp_t, exp_s = naive.sparse_rowwise_adagrad(table, state, ids, grads, 0.05, 1e-8)
    parts = [(ids1, g1, None), (ids2, big, pos2)]
    touched = sparse_update.sparse_update_parts_(
        kind, table, state, parts, 0.05, 1e-8, sparse_update.new_scratch(rows)
    )
    assert touched == len(set(ids.tolist()))
    np.testing.assert_allclose(table, exp_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, exp_s, rtol=1e-5, atol=1e-7)


# -- the update CUDA's device mode runs: distinct rows found by a sort where the ids live -----------------
HOST_BOUND_OPS = {"aten._local_scalar_dense.default", "aten.lift_fresh.default", "aten._unique2.default",
                  "aten.unique_dim.default", "aten.nonzero.default", "aten.masked_select.default"}  # fmt: skip
"""Ops that read a result back on the host (a synchronisation on CUDA), make a tensor from host data (a
blocking copy to the device from pageable memory) or size an output by its data (torch.unique, nonzero)."""


def _ops_of(fn) -> set[str]:
    """The aten ops ``fn()`` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as r:
        fn()
    return r.ops


def _opt_case(kind, seed, rows, n, dim, dup):
    table, ids, grads = _case(seed, rows, n, dim, dup)
    opt = SparseOptimizer(
        kind, 0.1, dim=dim, iteration=3 if seed % 2 else 0, weight_decay=0.01 * (kind == "adam")
    )
    rng = np.random.default_rng(seed + 1)
    state = np.abs(rng.normal(size=opt.state_shape(rows))).astype(np.float32)
    if kind == "adam":  # moments of either sign, whole step counts
        state[:, :dim] = rng.normal(size=(rows, dim))
        state[:, 2 * dim] = rng.integers(0, 5, rows)
    return opt, table, state, torch.from_numpy(ids), torch.from_numpy(grads)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["sgd", "rowwise-adagrad", "adagrad", "adam"]),
    seed=st.integers(0, 2**31),
    rows=st.integers(1, 40),
    n=st.integers(0, 150),
    dim=st.integers(1, 9),
    dup=st.integers(1, 50),
)
@example(kind="adagrad", seed=0, rows=1, n=1, dim=1, dup=1)  # per-element state of one float: [rows]
def test_sorted_update_equals_the_update_fed_distinct_rows_bit_for_bit(kind, seed, rows, n, dim, dup):
    """step_sorted (no count read back) against step_coalesced given torch.unique's rows: every kind,
    duplicates, no lookups; equal bit for bit (the same sums in the same order, the padding adds zero)."""
    opt, table, state, ids, grads = _opt_case(kind, seed, rows, n, dim, dup)
    t1, s1 = torch.from_numpy(table.copy()), torch.from_numpy(state.copy())
    t2, s2 = torch.from_numpy(table.copy()), torch.from_numpy(state.copy())
    opt.step_sorted(t1, s1, ids, grads)
    if n:
        uniq, inverse = torch.unique(ids, return_inverse=True)
        opt.step_coalesced(t2, s2, uniq, inverse, grads)
    assert torch.equal(t1, t2) and torch.equal(s1, s2)


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad", "adagrad", "adam"])
def test_device_updates_neither_read_back_nor_copy_host_data(kind):
    """The torch updates CUDA runs queue without waiting: device mode's sorted update and the tiers' update
    fed with distinct rows (Adam's bias correction included: no tensor made from host numbers per update)."""
    opt, table, state, ids, grads = _opt_case(kind, 3, 30, 200, 8, 20)
    t, s = torch.from_numpy(table), torch.from_numpy(state)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    for update in (lambda: opt.step_sorted(t, s, ids, grads),
                   lambda: opt.step_coalesced(t, s, uniq, inverse, grads)):  # fmt: skip
        ops = _ops_of(update)
        assert "aten.index_add_.default" in ops or "aten.index_copy_.default" in ops  # it recorded the update
        assert not ops & HOST_BOUND_OPS, sorted(ops & HOST_BOUND_OPS)
