"""The training modes on CUDA: device vs hybrid vs hotline K=0 / K=2, SGD and row-wise Adagrad, with stale
rows in the look-ahead runs, the cold rows in host memory and in the disk store; a look-ahead run with no cold
rows at all; in-place pinning; and, with two GPUs, two ranks over NCCL (one GPU each) equal to one process.
Skipped without CUDA (CI has none).

Runs from a plain checkout with only torch, numba, numpy, pandas and pytest (the GPU image): tests/conftest.py
puts the checkout first on ``sys.path`` and ``hotline`` binds ``hotline.kernels`` to its ``kernels/``.

On the GPU the sparse updates use ``index_add_`` (atomics: summation order varies between runs), so the
modes agree within a tolerance, not bit for bit."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from hotline import TrainConfig, Trainer  # noqa: E402
from hotline.datasets.format import Dataset  # noqa: E402
from hotline.datasets.synthetic import generate  # noqa: E402

# test_equivalence imports small_data as pytest gives it (tests/ on sys.path), also where tests is a package
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.test_equivalence import ARCH, BATCH, STEPS, TABLES, _placement, assert_equivalent  # noqa: E402

RTOL = 2e-5  # float32 atomics reorder sums; measured well below this on the CPU twin of every path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    rows = BATCH * STEPS * 7 // 6 + 200
    return Dataset(generate(root / "ds", rows, seed=3, table_sizes=TABLES, zipf=1.3, progress=False))


def _config(mode, optimizer, placement=None, lookahead=0, device="cuda", **kw):
    fields = dict(mode=mode, optimizer=optimizer, learning_rate=0.05, mini_batch_size=BATCH, num_batches=STEPS,
                  progress=False, placement_path=placement, lookahead=lookahead, device=device, **ARCH)  # fmt: skip
    return TrainConfig(**{**fields, **kw})


def _run_cuda(ds, mode, optimizer, placement=None, lookahead=0, **kw):
    tr = Trainer(_config(mode, optimizer, placement, lookahead, **kw), ds)
    try:
        stats = list(tr.progress(tr.batches()))
        # a step's loss on a device is a DeferredLoss (read late): float() reads it
        return np.array([float(s.loss_sum) for s in stats]), tr.named_arrays(), stats
    finally:
        tr.close()


_reference: dict = {}


def _device(ds, optimizer):
    if optimizer not in _reference:
        _reference[optimizer] = _run_cuda(ds, "device", optimizer)
    return _reference[optimizer]


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("mode,lookahead", [("hybrid", 0), ("hotline", 0), ("hotline", 2)])
def test_modes_equal_device_on_cuda(dataset, tmp_path, optimizer, mode, lookahead):
    path = _placement(dataset, "profiled", optimizer, tmp_path / "p.npz") if mode == "hotline" else None
    got = _run_cuda(dataset, mode, optimizer, path, lookahead)
    if lookahead:
        assert sum(s.counters["stale_rows"] for s in got[2]) > 0
    assert_equivalent(_device(dataset, optimizer), got, rtol=RTOL)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("mode,lookahead", [("hybrid", 0), ("hotline", 0), ("hotline", 2)])
def test_the_disk_store_equals_device_on_cuda(dataset, tmp_path, optimizer, mode, lookahead):
    """The cold rows and their state in the disk store (a file in tmp_path, O_DIRECT where the filesystem
    allows), the hot tier and the compute on CUDA: equal to device mode as the host-memory store is (on the
    CPU the two stores are bit-identical: tests/test_disk_tier.py)."""
    path = _placement(dataset, "profiled", optimizer, tmp_path / "p.npz") if mode == "hotline" else None
    cold = tmp_path / "cold"
    cold.mkdir()
    got = _run_cuda(dataset, mode, optimizer, path, lookahead, cold_store="disk", cold_dir=str(cold))
    assert sum(s.counters["disk_rows"] for s in got[2]) > 0  # rows came from the file
    if lookahead:
        assert sum(s.counters["stale_rows"] for s in got[2]) > 0
    assert_equivalent(_device(dataset, optimizer), got, rtol=RTOL)


@pytest.mark.parametrize("lookahead", [0, 2])
def test_steps_without_cold_rows_equal_device_on_cuda(dataset, tmp_path, lookahead):
    """Every row hot: no step has a working set, yet each still waits for its step's event before its
    staging slot and copy packs are reused (a step with nothing to copy back used to return no event)."""
    path = _placement(dataset, "all-hot", "rowwise-adagrad", tmp_path / "p.npz")
    got = _run_cuda(dataset, "hotline", "rowwise-adagrad", path, lookahead)
    assert all(s.counters["working_set_rows"] == 0 for s in got[2])
    assert_equivalent(_device(dataset, "rowwise-adagrad"), got, rtol=RTOL)


def test_cold_tier_is_pinned_in_place():
    from hotline.tiers.cold_store import HostRows
    from hotline.tiers.sparse_optim import SparseOptimizer

    weights = np.random.default_rng(0).random((1000, 16), dtype=np.float32)
    before = weights.copy()
    rows = HostRows(weights, SparseOptimizer("rowwise-adagrad", 0.1), pin=True)
    try:
        assert rows.weight.is_pinned() and rows.weight.data_ptr() == weights.ctypes.data
        assert np.array_equal(rows.w, before)
        dev = rows.weight.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu(), torch.from_numpy(before))
    finally:
        rows.close()
    assert not rows.weight.is_pinned()


# A device update stands within NOISE_FACTOR of the CPU kernel's spread over NOISE_ORDERS lookup orders.
NOISE_FACTOR, NOISE_ORDERS = 4, 8


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad", "adagrad", "adam"])
def test_sorted_update_on_cuda_equals_the_cpu_kernels_without_a_sync(kind):
    """Device mode's update on CUDA (distinct rows by a sort on the device; Adam's bias correction made there)
    equals the CPU kernels, and queues with no synchronisation (torch's sync debug mode would raise)."""
    from hotline.tiers.sparse_optim import SparseOptimizer

    rng = np.random.default_rng(4)
    rows, n, dim = 300, 4000, 16
    opt = SparseOptimizer(kind, 0.05, dim=dim)
    table = rng.normal(size=(rows, dim)).astype(np.float32)
    ids = torch.from_numpy(rng.integers(0, rows, n))
    grads = torch.from_numpy(rng.normal(size=(n, dim)).astype(np.float32))
    t_cpu, s_cpu = torch.from_numpy(table.copy()), opt.new_state(rows)
    t_dev, s_dev = torch.from_numpy(table).cuda(), opt.new_state(rows, "cuda")
    ids_dev, grads_dev = ids.cuda(), grads.cuda()
    torch.cuda.synchronize()
    for _ in range(3):
        opt.step(t_cpu, s_cpu, ids, grads)
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step_sorted(t_dev, s_dev, ids_dev, grads_dev)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # Equal up to reassociation: the device sums a row's duplicate gradients in an order of its own at each
    # step (atomic adds), and where they nearly cancel, the step-to-step difference moves Adagrad's and Adam's
    # ratios. The floor: the CPU kernel fed the lookups in another order at each step, against float64.
    t64, s64 = _float64_updates(opt, table, ids, grads, rows, steps=3)
    floor_t, floor_s = _reordered_floor(opt, table, ids, grads, rows, t64, s64)
    assert float((t_dev.cpu().double() - t64).abs().max()) <= NOISE_FACTOR * floor_t
    if s64.numel():
        assert float((s_dev.cpu().double() - s64).abs().max()) <= NOISE_FACTOR * floor_s


def _reordered_floor(opt, table, ids, grads, rows, t64, s64, orders=NOISE_ORDERS):
    """The largest distance from float64 (table, state) of the CPU kernel's three updates, each step fed the
    same (id, gradient) pairs in an order of its own, over ``orders`` draws."""
    floor_t = floor_s = float(np.finfo(np.float32).eps)
    for seed in range(orders):
        rng = np.random.default_rng(seed)
        t, s = torch.from_numpy(table.copy()), opt.new_state(rows)
        for _ in range(3):
            perm = torch.from_numpy(rng.permutation(len(ids)))
            opt.step(t, s, ids[perm], grads[perm].contiguous())
        floor_t = max(floor_t, float((t.double() - t64).abs().max()))
        if s64.numel():
            floor_s = max(floor_s, float((s.double() - s64).abs().max()))
    return floor_t, floor_s


def _float64_updates(opt, table, ids, grads, rows, steps):
    """The sparse optimizer's update rules in float64 with torch ops (an independent twin): ``steps`` updates
    of ``table`` by the same lookups; returns (table, state)."""
    t = torch.from_numpy(table).double()
    s = torch.zeros(opt.state_shape(rows), dtype=torch.float64)
    u, g64 = ids.unique(), grads.double()
    b1, b2, lr, eps, dim = opt.beta1, opt.beta2, opt.lr, opt.eps, table.shape[1]
    for _ in range(steps):
        g = torch.zeros(rows, dim, dtype=torch.float64).index_add_(0, ids, g64)[u]
        if opt.kind == "sgd":
            t[u] -= lr * g
        elif opt.kind == "rowwise-adagrad":
            s[u] += (g * g).mean(1)
            t[u] -= lr * g / (s[u].sqrt()[:, None] + eps)
        elif opt.kind == "adagrad":
            s[u] += g * g
            t[u] -= lr * g / (s[u].sqrt() + eps)
        else:
            s[u, 2 * dim] += 1
            n = s[u, 2 * dim][:, None] if opt.iteration == 0 else float(opt.iteration)
            s[u, :dim] = b1 * s[u, :dim] + (1 - b1) * g
            s[u, dim : 2 * dim] = b2 * s[u, dim : 2 * dim] + (1 - b2) * g * g
            t[u] -= lr * (s[u, :dim] / (1 - b1**n)) / ((s[u, dim : 2 * dim] / (1 - b2**n)).sqrt() + eps)
    return t, s


def test_a_refused_registration_is_cleared_and_falls_back_to_a_pinned_copy():
    """Registering memory that overlaps a registered range is refused (cudaErrorHostMemoryAlreadyRegistered):
    the error is cleared (the next kernel runs) and the rows go on from a pinned copy, with a warning that says
    so. (A tensor already pinned as a whole is used as it is: no copy, no warning.)"""
    from hotline.tiers.pinning import PinnedRegion, pinned

    t = torch.arange(4096.0)
    assert pinned(t[:0])[0].numel() == 0
    first = PinnedRegion(t[2048:])  # the second half registered: t itself is not pinned at its start
    try:
        with pytest.warns(RuntimeWarning, match="using a pinned copy"):
            copy, region = pinned(t)
        assert (
            region is None and copy.is_pinned() and copy.data_ptr() != t.data_ptr() and torch.equal(copy, t)
        )
        x = torch.ones(8, device="cuda") * 2  # an unrelated kernel: no leftover error raised here
        torch.cuda.synchronize()
        assert float(x.sum()) == 16.0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            same, region = pinned(copy)  # already pinned: itself, silently
        assert same is copy and region is None
    finally:
        first.close()


# -- two ranks over NCCL, one GPU each -------------------------------------------------------------------
# (name, mode, optimizer, look-ahead, global batch): the last case's batch leaves one sample for the last
# global batch, so rank 0's shard of it is empty (its empty gradients must be on its GPU).
NCCL_CASES = [
    ("device-sgd", "device", "sgd", 0, BATCH),
    ("hybrid-sgd", "hybrid", "sgd", 0, BATCH),
    ("hotline-adagrad", "hotline", "rowwise-adagrad", 0, BATCH),
    ("hotline-adagrad-k2", "hotline", "rowwise-adagrad", 2, BATCH),
    ("hotline-sgd-empty-shard", "hotline", "sgd", 0, None),
]


def _batch_leaving_one(n: int) -> int:
    """A global batch size whose last batch of ``n`` samples has one sample (n - 1 always does)."""
    return next((b for b in range(BATCH, 4 * BATCH) if n % b == 1), n - 1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_over_nccl_equal_one_process(dataset, tmp_path):
    from ranks import spawn, train_and_dump

    from hotline.distributed.comm import backend_for

    assert backend_for("cuda") == "nccl"
    jobs, refs = [], {}
    for name, mode, opt, k, batch in NCCL_CASES:
        batch = batch or _batch_leaving_one(len(dataset.train))
        steps = (
            0 if batch != BATCH else STEPS
        )  # the empty-shard case runs every batch, the short last one too
        path = _placement(dataset, "profiled", opt, tmp_path / f"{name}.npz") if mode == "hotline" else None
        cfg = _config(mode, opt, path, k, mini_batch_size=batch, num_batches=steps)
        jobs.append((cfg, str(dataset.path), str(tmp_path / f"{name}.npz.out.npz")))
        tr = Trainer(_config("device", opt, mini_batch_size=batch, num_batches=steps), dataset)
        try:
            refs[name] = ([float(s.loss_sum) for s in tr.progress(tr.batches())], tr.named_arrays())
        finally:
            tr.close()
    spawn(2, train_and_dump, jobs, device="cuda")  # rank r on cuda:r, NCCL for device tensors
    for (name, *_), (_, _, out) in zip(NCCL_CASES, jobs):
        got = np.load(out)
        losses, ref = refs[name]
        np.testing.assert_allclose(got["losses"], losses, rtol=RTOL, err_msg=name)
        for key, a in ref.items():
            scale = max(float(np.abs(a).max()), 1e-12)
            err = float(np.abs(got[key] - a).max())
            assert err <= RTOL * scale, f"{name} {key}: max difference {err:.3e} > {RTOL} x {scale:.3e}"


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad", "adagrad", "adam"])
def test_replicated_update_on_cuda_is_deterministic_without_a_sync(kind):
    """The N-rank replicated update's torch path (hotline.tiers.replicated) on CUDA: every rank's rows summed
    in rank order give the CPU's bits, two runs give the same table bits (what keeps replicas on N GPUs
    identical), and nothing synchronises (torch's sync debug mode would raise)."""
    from hotline.distributed.comm import Comm
    from hotline.tiers.replicated import sum_in_rank_order, update_replicas
    from hotline.tiers.sparse_optim import SparseOptimizer

    rng = np.random.default_rng(5)
    rows, dim, sizes = 300, 16, [700, 0, 650, 800]  # 4 ranks' distinct rows, one rank with none
    ids = torch.from_numpy(np.concatenate([rng.choice(rows, s, replace=False) for s in sizes]))
    grads = torch.from_numpy(rng.normal(size=(sum(sizes), dim)).astype(np.float32))
    want = sum_in_rank_order(ids, grads, sizes)
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = sum_in_rank_order(ids.cuda(), grads.cuda(), sizes)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(want, got):
        assert torch.equal(a, b.cpu())
    opt = SparseOptimizer(kind, 0.05, dim=dim)
    # distinct lookups: one rank's own sums are atomic adds of its lookups (their order is free, as on one
    # GPU); what must not vary is everything after the exchange, which every replica runs on the same bits
    lookups = torch.from_numpy(rng.choice(rows, 250, replace=False)).cuda()
    lookup_grads = torch.from_numpy(rng.normal(size=(250, dim)).astype(np.float32)).cuda()
    start, tables = rng.normal(size=(rows, dim)).astype(np.float32), []
    for _ in range(2):
        table = torch.from_numpy(start).cuda()
        state = opt.new_state(rows, "cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                update_replicas(Comm(), opt, table, state, [lookups], [lookup_grads], "t")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        tables.append(table.cpu())
    assert torch.equal(tables[0], tables[1])
