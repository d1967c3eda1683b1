"""Embedding optimizers: per-element Adagrad (FBGEMM's ADAGRAD) and Adam (FBGEMM's ADAM, row-wise bias
correction) beside SGD and row-wise Adagrad.

- the Numba kernels against their numpy twins (tests/naive.py), the torch (CUDA) path against the kernels;
- the update rule against plain PyTorch: torch.optim.Adagrad on a dense nn.EmbeddingBag, torch.optim.SparseAdam
  on a sparse one (eps ~ 0 and every row looked up every step, where FBGEMM's per-row step count is the global
  step and the two formulas coincide);
- every mode (device, hybrid, hotline K = 0 split / K = 2 fused, the torch update path, 2 ranks over gloo,
  re-placement, resume from a checkpoint) against the independent reference DLRM (tests/reference.py) and
  against device mode.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ranks import spawn, train_and_dump
from reference import NOISE_FACTOR, max_rel_diff, noise_floor, random_params
from small_data import hot_placement, zipf_dataset

import naive
from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.synthetic import generate
from hotline.kernels import sparse_update
from hotline.placement import Placement
from hotline.table_layout import bytes_per_row, state_floats_per_row
from hotline.tiers.sparse_optim import SparseOptimizer

NEW = ["adagrad", "adam"]


# -- kernels and their twins ------------------------------------------------------------------------------
def _case(seed, rows, n, dim, kind):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(rows, dim)).astype(np.float32)
    ids = rng.integers(0, rows, n)
    grads = rng.normal(size=(n, dim)).astype(np.float32)
    S = state_floats_per_row(kind, dim)
    state = np.abs(rng.normal(size=(rows, S))).astype(np.float32)
    if kind == "adam":  # moments of either sign, whole step counts
        state[:, :dim] = rng.normal(size=(rows, dim))
        state[:, 2 * dim] = rng.integers(0, 5, rows)
    return table, state, ids, grads


def _twin(kind, table, state, ids, grads, lr=0.05, eps=1e-8, iteration=0, weight_decay=0.0):
    if kind == "adagrad":
        return naive.sparse_adagrad(table, state, ids, grads, lr, eps)
    return naive.sparse_adam(table, state, ids, grads, lr, 0.9, 0.999, eps, iteration, weight_decay)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 40), n=st.integers(0, 100), dim=st.integers(1, 9),
       kind=st.sampled_from(NEW), iteration=st.sampled_from([0, 1, 7]), weight_decay=st.sampled_from([0.0, 0.01]))  # fmt: skip
def test_kernels_equal_twins(seed, rows, n, dim, kind, iteration, weight_decay):
    """iteration (Adam): 0 corrects the bias by each row's step count, n > 0 by step n for every row;
    weight_decay: FBGEMM's ADAM's L2 term."""
    weight_decay = weight_decay if kind == "adam" else 0.0
    table, state, ids, grads = _case(seed, rows, n, dim, kind)
    exp_t, exp_s = _twin(kind, table, state, ids, grads, iteration=iteration, weight_decay=weight_decay)
    if kind == "adagrad":
        touched = sparse_update.sparse_adagrad_(table, state, ids, grads, 0.05, 1e-8)
    else:
        touched = sparse_update.sparse_adam_(
            table, state, ids, grads, 0.05, 0.9, 0.999, 1e-8, iteration=iteration, weight_decay=weight_decay
        )
    assert touched == len(set(ids.tolist()))
    np.testing.assert_allclose(state, exp_s, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(table, exp_t, rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n1=st.integers(0, 40), n2=st.integers(0, 40), kind=st.sampled_from(NEW))
def test_update_from_parts_equals_twin_on_the_concatenation(seed, n1, n2, kind):
    rows, dim = 25, 3
    table, state, _, _ = _case(seed, rows, 0, dim, kind)
    rng = np.random.default_rng(seed + 1)
    ids1, g1 = rng.integers(0, rows, n1), rng.normal(size=(n1, dim)).astype(np.float32)
    big = rng.normal(size=(n2 + 5, dim)).astype(np.float32)
    pos2, ids2 = rng.permutation(n2 + 5)[:n2], rng.integers(0, rows, n2)
    ids, grads = np.concatenate([ids1, ids2]), np.concatenate([g1, big[pos2]])
    exp_t, exp_s = _twin(kind, table, state, ids, grads)
    touched = sparse_update.sparse_update_parts_(kind, table, state, [(ids1, g1, None), (ids2, big, pos2)], 0.05,
                                                 1e-8, sparse_update.new_scratch(rows))  # fmt: skip
    assert touched == len(set(ids.tolist()))
    np.testing.assert_allclose(table, exp_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, exp_s, rtol=1e-6, atol=1e-7)


def test_duplicates_are_summed_first_and_the_step_counts_per_row():
    table, state = np.zeros((3, 2), np.float32), np.zeros((3, 5), np.float32)
    grads = np.array([[1.0, -2.0], [1.0, -2.0]], np.float32)
    sparse_update.sparse_adam_(table, state, np.array([1, 1]), grads, 0.1, 0.9, 0.999, 0.0)
    np.testing.assert_allclose(
        state[1], [0.2, -0.4, 0.004, 0.016, 1.0], rtol=1e-4
    )  # m, v of g = (2, -4); t = 1
    np.testing.assert_allclose(table[1], [-0.1, 0.1], rtol=1e-5)  # the first Adam step moves by lr * sign(g)
    assert not table[[0, 2]].any() and not state[[0, 2]].any()
    acc = np.zeros((3, 2), np.float32)
    sparse_update.sparse_adagrad_(np.zeros((3, 2), np.float32), acc, np.array([2, 2]), grads, 0.1, 0.0)
    np.testing.assert_allclose(acc[2], [4.0, 16.0])  # (1 + 1)^2, (-2 - 2)^2


def test_state_shapes_are_checked():
    table = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"state must be .*\[4, 3\]"):
        sparse_update.sparse_adagrad_(table, np.zeros(4, np.float32), np.array([0]), np.ones((1, 3), np.float32),
                                      0.1, 1e-8)  # fmt: skip
    with pytest.raises(ValueError, match=r"\[4, 7\]"):
        sparse_update.sparse_adam_(table, np.zeros((4, 6), np.float32), np.array([0]),
                                   np.ones((1, 3), np.float32), 0.1, 0.9, 0.999, 1e-8)  # fmt: skip
    with pytest.raises(ValueError, match="embedding dim"):
        SparseOptimizer("adam", 0.1)  # the state width needs the dim
    assert bytes_per_row(16, "adagrad") == 4 * 32 and bytes_per_row(16, "adam") == 4 * (16 + 33)


@pytest.mark.parametrize(
    "kind, lr, match",
    [("adamw", 0.1, "optimizer must be one of"), ("sgd", 0.0, "must be positive"),
     ("adam", math.nan, "must be positive"), ("adagrad", 1e39, r"at most 3.403e\+38")],
)  # fmt: skip
def test_the_config_refuses_an_optimizer_by_the_tiers_rule(kind, lr, match):
    """TrainConfig checks its optimizer fields without importing the tiers (table_layout.check_optimizer): the
    same one line the tiers' SparseOptimizer gives, when the config is made."""
    with pytest.raises(ValueError, match=match) as config:
        TrainConfig(optimizer=kind, learning_rate=lr)
    with pytest.raises(ValueError, match=match) as tiers:
        SparseOptimizer(kind, lr, dim=16)
    assert str(config.value) == str(tiers.value)


@pytest.mark.parametrize(
    "kind,iteration,wd", [("adagrad", 0, 0.0), ("adam", 0, 0.0), ("adam", 5, 0.0), ("adam", 5, 0.01)]
)
def test_torch_path_equals_numba_path(kind, iteration, wd):
    table, _, ids, grads = _case(3, 40, 300, 8, kind)
    opt = SparseOptimizer(kind, 0.1, dim=8, iteration=iteration, weight_decay=wd)
    t1, s1 = torch.from_numpy(table.copy()), opt.new_state(40)
    t2, s2 = torch.from_numpy(table.copy()), opt.new_state(40)
    for _ in range(3):
        opt.step(t1, s1, torch.from_numpy(ids), torch.from_numpy(grads))
        opt._step_torch(t2, s2, torch.from_numpy(ids), torch.from_numpy(grads))
    torch.testing.assert_close(t1, t2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-7)


# -- the update rule against torch.optim -------------------------------------------------------------------
def _bags(rng, rows, B, L, cover):
    ids = rng.integers(0, rows, (B, L))
    if cover:  # every row looked up in the batch
        ids.reshape(-1)[:rows] = np.arange(rows)
    return torch.from_numpy(ids)


def _embedding_grads(table: torch.Tensor, ids: torch.Tensor, target: torch.Tensor):
    """Per-lookup gradients of a sum-pooled bag loss, as a tier receives them."""
    rows = table[ids.reshape(-1)].clone().requires_grad_(True)
    pooled = rows.reshape(*ids.shape, -1).sum(1)
    ((pooled - target) ** 2).sum().backward()
    return rows.grad


@pytest.mark.parametrize("kind", NEW)
def test_update_equals_torch_optim(kind):
    """Adagrad: torch.optim.Adagrad on a dense nn.EmbeddingBag (rows not looked up have zero gradient and stay
    put). Adam: torch.optim.SparseAdam on a sparse nn.EmbeddingBag, every row looked up every step and eps ~ 0
    (SparseAdam adds eps outside the bias correction, FBGEMM inside; its step is global, FBGEMM's per row)."""
    rng = np.random.default_rng(0)
    rows, D, B, L, lr = 12, 5, 8, 3, 0.05
    eps = 1e-8 if kind == "adagrad" else 1e-30  # SparseAdam refuses 0; 1e-30 vanishes beside sqrt(v)
    start = torch.from_numpy(rng.normal(size=(rows, D)).astype(np.float32))
    bag = torch.nn.EmbeddingBag(rows, D, mode="sum", sparse=kind == "adam")
    with torch.no_grad():
        bag.weight.copy_(start)
    if kind == "adagrad":
        theirs = torch.optim.Adagrad(bag.parameters(), lr=lr, eps=eps)
    else:
        theirs = torch.optim.SparseAdam(list(bag.parameters()), lr=lr, betas=(0.9, 0.999), eps=eps)
    ours = SparseOptimizer(kind, lr, eps=eps, dim=D)
    table, state = start.clone(), ours.new_state(rows)
    for _ in range(6):
        ids = _bags(rng, rows, B, L, cover=kind == "adam")
        target = torch.from_numpy(rng.normal(size=(B, D)).astype(np.float32))
        theirs.zero_grad()
        ((bag(ids) - target) ** 2).sum().backward()
        theirs.step()
        ours.step(table, state, ids.reshape(-1), _embedding_grads(table, ids, target))
    moved = float((bag.weight.detach() - start).abs().max())
    assert moved > 0.05  # several steps of lr 0.05: the comparison means something
    torch.testing.assert_close(table, bag.weight.detach(), rtol=2e-6, atol=2e-6)


# -- every mode against the reference and device mode ---------------------------------------------------
TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
BATCH, EPOCHS, LR, DIM = 64, 2, 0.05, 8
BOTTOM, TOP = [13, 32, 8], [32, 1]
MODES = {  # name -> (mode, look-ahead, micro-batches, bit-identical to device)
    "device": ("device", 0, "auto", True),
    "hybrid": ("hybrid", 0, "auto", True),
    "hotline-k0-split": ("hotline", 0, "auto", False),
    "hotline-k2": ("hotline", 2, "auto", True),
    "hotline-k2-torch-updates": ("hotline", 2, "auto", False),
    # CUDA's device mode: distinct rows found by a sort where the ids live, nothing read back (on the CPU here)
    "device-torch-updates": ("device", 0, "auto", False),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("optim")
    ds = zipf_dataset(root / "ds", 560, 6, TABLES, pooling_factor=3, drift_days=2, drift_rate=0.6)
    init = root / "init.npz"
    np.savez(init, **random_params(TABLES, DIM, BOTTOM, TOP, "dot", seed=21))
    places = {opt: hot_placement(ds, root / f"p-{opt}.npz", 0.4, BATCH * 4, embedding_dim=DIM,
                                 bytes_per_row=bytes_per_row(DIM, opt)) for opt in NEW}  # fmt: skip
    return root, ds, init, places


def config(setup, name, opt, **kw) -> TrainConfig:
    _, _, init, places = setup
    mode, k, micro, _ = MODES[name]
    return TrainConfig(
        mode=mode, lookahead=k, micro_batches=micro, optimizer=opt, learning_rate=LR, mini_batch_size=BATCH,
        nepochs=EPOCHS, progress=False, embedding_dim=DIM, bottom_mlp=BOTTOM, top_mlp=TOP,
        init_params_path=str(init), placement_path=str(places[opt]) if mode == "hotline" else None, **kw,
    )  # fmt: skip


_cache: dict = {}


def reference(setup, opt):
    """The float64 reference run and the float32 noise floor around it (tests/reference.py, cached)."""
    if opt not in _cache:
        _, ds, init, _ = setup
        with np.load(init) as z:
            params = {k: z[k] for k in z.files}
        _cache[opt] = noise_floor(params, "dot", opt, LR, ds.path, BATCH, nepochs=EPOCHS)
    return _cache[opt]


def run(setup, name, opt, **kw):
    key = (name, opt, tuple(sorted(kw.items())))
    if key not in _cache:
        tr = Trainer(config(setup, name, opt, **kw), setup[1])
        tr.mode.device_updates = name.endswith("torch-updates")
        try:
            stats = list(tr.progress(tr.batches()))
            _cache[key] = np.array([s.loss_sum for s in stats]), tr.named_arrays(), tr.history
        finally:
            tr.close()
    return _cache[key]


@pytest.mark.parametrize("opt", NEW)
@pytest.mark.parametrize("name", list(MODES))
def test_mode_equals_reference(setup, name, opt):
    ref = reference(setup, opt)
    losses, params, _ = run(setup, name, opt)
    assert len(losses) == len(ref.losses) == EPOCHS * math.ceil(480 / BATCH)
    ref.check(losses, params, what=f"{name} {opt}")
    moved, _ = max_rel_diff(ref.params, dict(np.load(setup[2])))
    assert moved > 100 * NOISE_FACTOR * ref.param_floor  # training moved the parameters far past the bound
    if MODES[name][3]:
        d_losses, d_params, _ = run(setup, "device", opt)
        assert np.array_equal(losses, d_losses)
        for k, v in d_params.items():
            assert np.array_equal(params[k], v), f"{name} {opt}: {k} is not bit-identical to device mode"


@pytest.mark.parametrize("opt", NEW)
def test_replacement_moves_the_state_with_the_rows(setup, opt):
    """Re-placing every 5 steps at K = 2 (rows and their D or 2 D + 1 state floats move between the tiers):
    bit-identical to device mode."""
    losses, params, history = run(setup, "hotline-k2", opt, replace_every=5)
    replaced = [r for r in history if r.get("kind") == "replace"]
    assert replaced and sum(r["promoted"] for r in replaced) > 0
    d_losses, d_params, _ = run(setup, "device", opt)
    assert np.array_equal(losses, d_losses)
    for k, v in d_params.items():
        assert np.array_equal(params[k], v), k


@pytest.mark.parametrize("opt", NEW)
def test_resume_is_bit_identical(setup, opt, tmp_path):
    def fit(**kw):
        tr = Trainer(config(setup, "hotline-k2", opt, eval_max_samples=16, **kw), setup[1])
        try:
            tr.fit()
            return tr.named_arrays()
        finally:
            tr.close()

    straight = fit()
    fit(num_batches=5, checkpoint_dir=str(tmp_path), checkpoint_every=5)
    resumed = fit(checkpoint_dir=str(tmp_path), resume=True)
    for k, v in straight.items():
        assert np.array_equal(resumed[k], v), k


TWO_RANKS = [("hotline-k2", "adam"), ("hotline-k0-split", "adagrad"), ("hybrid", "adam")]


def test_two_ranks_equal_reference(setup):
    root, ds = setup[0], setup[1]
    jobs = [
        (config(setup, name, opt), str(ds.path), str(root / f"2r-{name}-{opt}.npz"))
        for name, opt in TWO_RANKS
    ]
    spawn(2, train_and_dump, jobs)
    for (name, opt), (_, _, path) in zip(TWO_RANKS, jobs):
        with np.load(path) as z:
            got = {k: z[k] for k in z.files}
        reference(setup, opt).check(got["losses"], got, what=f"2 ranks {name} {opt}")


def test_cli_trains_with_adam_under_a_budget_that_counts_its_state(tmp_path, capsys):
    ds = str(generate(tmp_path / "ds", 3000, seed=2, table_sizes=[300, 40, 900], zipf=1.2, progress=False))
    placement = tmp_path / "p.npz"
    argv = ["train", ds, "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-4", "--arch-mlp-top", "8-1",
            "--mode", "hotline", "--optimizer", "adam", "--learning-rate", "0.01", "--hbm-budget", "4KiB",
            "--num-batches", "10", "--no-progress", "--eval-max-samples", "100", "--save-placement", str(placement)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    p = Placement.load(placement)
    assert p.bytes_per_row == 4 * (4 + 9) and p.num_hot * p.bytes_per_row <= 4096 and p.num_hot > 0
