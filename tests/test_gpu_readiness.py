"""The CUDA path's logic, tested where a CPU twin can test it: device mode's host-side distinct rows (no
torch.unique on the device) and packed copies, the Numba threading-layer preflight of look-ahead, pinning
only in place (and a failed pin goes on unpinned), every pipeline thread binding the device, the collective
backend chosen by device, the rare paths of the look-ahead (a producer stopped while a write-back is pending,
empty gradients, a store that does not write back), device-clock phases from the first step, no reference
cycle keeping a trainer alive. The GPU benchmark from a plain checkout is tried in test_gpu_bench_smoke.py."""

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import torch

from hotline.tiers.cold_store import HostRows
from hotline.tiers.pinning import pin_in_place
from hotline.tiers.sparse_optim import SparseOptimizer
from tests.test_equivalence import STEPS, _device, _run, assert_equivalent, datasets  # noqa: F401


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
def test_device_mode_sorted_update_path_equals_kernel_path(datasets, optimizer):  # noqa: F811
    """Device mode on CUDA finds its distinct rows on the device by a sort, reading nothing back (run here on
    CPU)."""
    ds = datasets[3]
    ref = _device(ds, optimizer)
    got = _run(ds, "device", optimizer, device_updates=True, pack_copies=True)  # and its copies packed
    assert len(got[0]) == STEPS
    assert_equivalent(ref, got)
    # and it really took the sorted path: the kernel path counts the rows it touched, this one reads no count back
    assert all("rows_touched" not in s.counters for s in got[2])
    assert all(s.counters["rows_touched"] > 0 for s in ref[2])


def _layer_in_fresh_process(env_layer: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    if env_layer:
        env["NUMBA_THREADING_LAYER"] = env_layer
    code = "from hotline.pipeline.threads import check_concurrent_kernels as c; print(c())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_workqueue_threading_layer_is_refused_before_look_ahead():
    bad = _layer_in_fresh_process("workqueue")
    assert bad.returncode != 0 and "workqueue" in bad.stderr and "--lookahead 0" in bad.stderr
    good = _layer_in_fresh_process(None)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() in ("omp", "tbb")


def test_cold_rows_are_never_copied_to_be_pinned():
    """HostRows keeps the caller's memory (numpy views stay valid); without CUDA nothing is registered."""
    weights = np.random.default_rng(0).random((50, 4), dtype=np.float32)
    rows = HostRows(weights, SparseOptimizer("rowwise-adagrad", 0.1), pin=True)
    assert rows.weight.data_ptr() == weights.ctypes.data
    if not torch.cuda.is_available():
        assert pin_in_place(rows.weight) is None
    rows.close()


@pytest.mark.parametrize("lookahead", [0, 2])
def test_packed_copies_path_equals_device(datasets, tmp_path, lookahead):  # noqa: F811
    """The copy path CUDA takes (index arrays and dense inputs packed, device tensors as views) is exact."""
    from tests.test_equivalence import _placement

    ds = datasets[3]
    path = _placement(ds, "profiled", "rowwise-adagrad", tmp_path / "p.npz")
    got = _run(ds, "hotline", "rowwise-adagrad", path, lookahead, device_updates=True, pack_copies=True)
    assert_equivalent(_device(ds, "rowwise-adagrad"), got)
    if (
        lookahead
    ):  # stale rows were refreshed through the refresh packs (one copy per dtype, no pageable copy)
        assert sum(s.counters["stale_rows"] for s in got[2]) > 0


def test_copy_pack_round_trips_and_grows():
    from hotline.tiers.packing import CopyPack

    rng = np.random.default_rng(1)
    pack = CopyPack(pin=False, int_capacity=3)
    arrays = {
        "a": rng.integers(0, 1 << 40, 17).astype(np.int64),
        "empty": np.zeros(0, np.int64),
        "dense": rng.random((5, 13), dtype=np.float32),
        "b": rng.integers(-5, 5, 9).astype(np.int64),
        "labels": rng.random(5, dtype=np.float32),
    }
    out = pack.copy(arrays, torch.device("cpu"), non_blocking=False)
    assert out.keys() == arrays.keys()
    for k, a in arrays.items():
        assert out[k].shape == a.shape and np.array_equal(out[k].numpy(), a), k
    with pytest.raises(TypeError, match="int32"):
        pack.copy({"x": np.zeros(3, np.int32)}, torch.device("cpu"), non_blocking=False)


@pytest.mark.parametrize("forward", [True, False])
def test_stale_rows_forwarded_from_live_steps_or_refreshed_from_host(datasets, tmp_path, forward):  # noqa: F811
    """Look-ahead with stale rows: taken from the live working buffer of the step that last held them (no
    wait for its write-back), or, with forwarding off, re-read from host memory after it. Both equal device."""
    from hotline import TrainConfig, Trainer
    from hotline.pipeline.executor import Executor
    from tests.test_equivalence import ARCH, BATCH, _placement

    ds = datasets[1]
    path = _placement(ds, "profiled", "rowwise-adagrad", tmp_path / "p.npz")
    cfg = TrainConfig(mode="hotline", optimizer="rowwise-adagrad", learning_rate=0.05, mini_batch_size=BATCH,
                      num_batches=STEPS, progress=False, placement_path=path, lookahead=2, **ARCH)  # fmt: skip
    tr = Trainer(cfg, ds)
    tr.mode.pack_copies = True  # as on CUDA: the refresh's indices and rows go through its pinned packs
    submitted: dict[int, threading.Event] = {}

    def hook(point: str, step: int) -> None:
        if point == "submitted":
            submitted.setdefault(step, threading.Event()).set()
        elif point == "write_back" and forward and step + 1 < STEPS:
            # The writer keeps step `step` live until the next step is computed, so the next step's stale
            # rows it holds are forwarded whatever the machine's load (not left to a race with its write-back).
            # The timeout only guards against a hang.
            submitted.setdefault(step + 1, threading.Event()).wait(timeout=120)

    try:
        ex = Executor(tr.mode, tr._compute_prepared, lookahead=2, forward_stale=forward, hook=hook)
        stats = list(ex.progress(tr.batches()))
        got = (np.array([s.loss_sum for s in stats]), tr.named_arrays(), stats)
    finally:
        tr.close()
    stale = sum(s.counters["stale_rows"] for s in stats)
    forwarded = sum(s.counters["stale_forwarded"] for s in stats)
    assert stale > 0
    assert (forwarded > 0) if forward else (forwarded == 0)
    assert forwarded <= stale
    assert_equivalent(_device(ds, "rowwise-adagrad"), got)


def test_the_loss_is_read_late_and_a_diverged_step_still_stops_the_run(tmp_path):
    """On a device a step's loss is copied to the host on the side and read one step later (no sync per
    step); a NaN is still caught, named with its own step, before anything of it is reported or saved."""
    from hotline import TrainConfig, Trainer
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.tiers.base import DeferredLoss, step_loss

    assert step_loss(torch.tensor(2.5)) == 2.5 and float(DeferredLoss(torch.tensor(1.25))) == 1.25
    ds = Dataset(generate(tmp_path / "ds", 3000, seed=1, table_sizes=[30, 50], progress=False))
    cfg = TrainConfig(embedding_dim=4, bottom_mlp=[13, 4], top_mlp=[4, 1], mini_batch_size=32, learning_rate=1e30,
                      print_freq=10**6, num_batches=40, progress=False, eval_max_samples=32)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        with pytest.raises(FloatingPointError, match=r"loss became nan at step (\d+)"):
            tr.fit()
        assert not [r for r in tr.history if r["kind"] == "train"]  # nothing of a diverged step reported
    finally:
        tr.close()


def test_modes_of_one_benchmark_share_one_computed_set_of_initial_tables():
    from hotline.table_layout import TableLayout
    from hotline.tiers.base import initial_tables, reusing_initial_tables

    layout = TableLayout([30, 7])
    plain = initial_tables(layout, 4, 3)
    with reusing_initial_tables():
        a, b = initial_tables(layout, 4, 3), initial_tables(layout, 4, 3)
        a[0, 0] += 1.0  # each mode updates its own copy
        c = initial_tables(layout, 4, 3)
    assert np.array_equal(b, plain) and np.array_equal(c, plain) and b is not c


def _hotline_config(path, lookahead=2, steps=8, **kw):
    from hotline import TrainConfig
    from tests.test_equivalence import ARCH, BATCH

    return TrainConfig(mode="hotline", placement_path=path, lookahead=lookahead, mini_batch_size=BATCH,
                       num_batches=steps, progress=False, learning_rate=0.05, **ARCH, **kw)  # fmt: skip


def test_every_thread_that_issues_device_work_binds_the_device_first(datasets, tmp_path):  # noqa: F811
    """CUDA's current device is per thread (a new thread starts on GPU 0). The trainer binds its device on
    the thread that builds it, and the look-ahead's producer and writer threads bind the mode's device when
    they start, before any prepare or write-back: all through one helper, bind_device (torch.cuda.set_device
    on CUDA), whose record of what each thread bound is read here where each thread does device work."""
    from hotline import Trainer
    from hotline.pipeline.threads import bound_device
    from tests.test_equivalence import _placement

    ds = datasets[1]
    path = _placement(ds, "profiled", "sgd", tmp_path / "p.npz")
    seen, errors = [], []

    def recorded(fn):
        def call(*args, **kwargs):
            seen.append((threading.current_thread().name, bound_device()))
            return fn(*args, **kwargs)

        return call

    def run():  # on a fresh thread: nothing is bound on it before the trainer
        try:
            seen.append(("before", bound_device()))
            tr = Trainer(_hotline_config(path), ds)
            tr.mode.prepare = recorded(tr.mode.prepare)
            tr.mode.finish_write_back = recorded(tr.mode.finish_write_back)
            tr._compute_prepared = recorded(tr._compute_prepared)
            try:
                assert len(list(tr.progress(tr.batches()))) == 8
            finally:
                tr.close()
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    thread = threading.Thread(target=run, name="trainer-thread")
    thread.start()
    thread.join()
    assert not errors, errors
    assert seen[0] == ("before", None)
    assert {name for name, _ in seen[1:]} == {"trainer-thread", "hotline-prepare", "hotline-write-back"}
    assert all(device == torch.device("cpu") for _, device in seen[1:])


def test_each_local_rank_resolves_cuda_to_its_own_gpu(monkeypatch):
    """NCCL refuses two ranks on one GPU: a rank's ``cuda`` (like ``auto``) is cuda:LOCAL_RANK."""
    from hotline.training.config import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda") == resolve_device("auto") == "cuda:1" and resolve_device("cpu") == "cpu"


def test_the_collective_backend_follows_the_device():
    """NCCL on CUDA, gloo on the CPU; on an NCCL Comm a tensor on the device is collected on the device (its
    NCCL group), a host tensor on the gloo group beside it; a gloo Comm takes every tensor to host memory.
    (No NCCL here: a tensor on the meta device stands for one that is not in host memory.)"""
    from ranks import rank_device

    from hotline.distributed.comm import Comm, backend_for

    assert backend_for("cuda") == backend_for("cuda:1") == backend_for(torch.device("cuda", 0)) == "nccl"
    assert backend_for("cpu") == "gloo" and rank_device("cpu", 1) == "cpu"
    on_device, on_host = torch.empty(3, device="meta"), torch.zeros(3)
    nccl = Comm(0, 2, group="the NCCL group", host_group="the gloo group", backend="nccl")
    assert nccl.on_device(on_device) and nccl.route(on_device) == ("the NCCL group", on_device.device)
    assert not nccl.on_device(on_host) and nccl.route(on_host) == ("the gloo group", torch.device("cpu"))
    gloo = Comm(0, 2)
    assert not gloo.on_device(on_device) and gloo.route(on_device) == (None, torch.device("cpu"))
    with pytest.raises(ValueError, match="gloo or nccl"):
        Comm(0, 2, backend="mpi")


def test_a_rank_without_lookups_sends_empty_gradients_from_the_tables_device():
    """An empty batch shard (a global batch smaller than the ranks) still takes part in the exchange: its
    empty ids and gradients are made on the table's device, not on the CPU."""
    from hotline.distributed.comm import Comm
    from hotline.tiers.replicated import all_ranks_gradients

    ids, grads = all_ranks_gradients(Comm(), [], [], 4, "hot_allgather", torch.device("meta"))
    assert ids.device.type == grads.device.type == "meta"
    assert ids.shape == (0,) and ids.dtype == torch.int64 and grads.shape == (0, 4)


def test_a_store_that_does_not_write_back_never_reads_the_working_rows_on_the_host(datasets, tmp_path):  # noqa: F811
    """The sharded store's owners apply the update; its write-back only marks the step landed and must not
    read the working rows on the host (on a GPU they are device memory: ``.numpy()`` raised there). Working
    rows that are not host memory (meta) stand for them; the local store does read them (the test's check)."""
    from hotline.distributed.comm import Comm
    from hotline.models.dlrm import DLRM
    from hotline.placement import Placement
    from hotline.table_layout import TableLayout
    from hotline.tiers.base import initial_tables
    from hotline.tiers.cold_store import LocalColdStore
    from hotline.tiers.sharded_store import ShardedColdStore
    from hotline.tiers.tiered import TieredMode
    from tests.test_equivalence import ARCH, BATCH, _placement

    ds = datasets[1]
    placement = Placement.load(_placement(ds, "profiled", "sgd", tmp_path / "p.npz"))
    layout, opt, dim = TableLayout(ds.table_sizes), SparseOptimizer("sgd", 0.05), ARCH["embedding_dim"]
    weights = initial_tables(layout, dim, 0)
    model = DLRM(_hotline_config(None).model_config(ds.table_sizes), seed=0)
    batch = ds.train.batch(0, BATCH)
    stores = {
        "sharded": ShardedColdStore(Comm(), weights.copy(), opt, layout.num_rows),
        "local": LocalColdStore(weights.copy(), opt, max_rows=BATCH * layout.num_tables * ds.pooling_factor),
    }
    for name, store in stores.items():
        hot = weights[placement.fused_hot_ids()]
        mode = TieredMode("hotline", layout, ds.pooling_factor, dim, opt, placement, store, hot, BATCH)
        prep = mode.prepare(batch)
        mode.compute(model, prep)
        assert prep.micro.working_set.size > 0
        prep.work = torch.empty(prep.work.shape, device="meta")
        if name == "local":
            with pytest.raises(TypeError, match="meta"):
                mode.finish_write_back(prep, mode.start_write_back(prep))
        else:
            mode.finish_write_back(prep, mode.start_write_back(prep))


def test_a_stopped_producer_never_prepares_into_a_slot_whose_write_back_is_pending(datasets, tmp_path):  # noqa: F811
    """The run stops while the producer waits for step 0's write-back to free its staging slot: it still
    waits (the writer drains every computed step) instead of fetching into the slot, which would hand the
    draining writer overwritten rows to store. Every computed step's rows end up as one sequential run's."""
    from hotline import Trainer
    from hotline.pipeline.executor import Executor
    from tests.test_equivalence import _placement

    ds = datasets[1]
    path = _placement(ds, "profiled", "rowwise-adagrad", tmp_path / "p.npz")
    tr = Trainer(_hotline_config(path, lookahead=1, steps=20, optimizer="rowwise-adagrad"), ds)
    ex = Executor(tr.mode, tr._compute_prepared, lookahead=1)
    released, waiting = threading.Event(), threading.Event()
    finish, wait = tr.mode.finish_write_back, ex._wait_written

    def gated_finish(prep, copied=None):  # the writer holds step 0 until released
        released.wait()
        finish(prep, copied)

    def watched_wait(upto):
        if threading.current_thread().name == "hotline-prepare" and upto > 0:
            waiting.set()  # the producer needs a written-back step's slot now
        return wait(upto)

    tr.mode.finish_write_back, ex._wait_written = gated_finish, watched_wait
    try:
        run = ex.progress(tr.batches())
        steps = [next(run) for _ in range(ex.ring)]  # every slot in use, none written back
        assert waiting.wait(120), "the producer never waited for a slot"
        timer = threading.Timer(0.5, released.set)  # the writer goes on only after the stop
        timer.start()
        run.close()
        timer.join()
        got = tr.named_arrays()
    finally:
        released.set()
        tr.close()
    ref_tr = Trainer(_hotline_config(path, lookahead=0, steps=len(steps), optimizer="rowwise-adagrad",
                                     micro_batches="fused"), ds)  # fmt: skip
    try:
        list(ref_tr.progress(ref_tr.batches()))
        ref = ref_tr.named_arrays()
    finally:
        ref_tr.close()
    for name, a in ref.items():
        scale = max(float(np.abs(a).max()), 1e-12)
        assert float(np.abs(got[name] - a).max()) <= 1e-5 * scale, name


def test_device_clock_phases_of_timed_steps_include_copies_prepared_during_warm_up(datasets, tmp_path):  # noqa: F811
    """Installed before the first step with ``from_step`` = the warm-up, the phases hold every timed step's
    copy-in too, though look-ahead prepared the first of them during the warm-up; none of the warm-up's."""
    from hotline import Trainer
    from hotline.pipeline.gpu_timing import StreamPhases
    from tests.test_equivalence import _placement

    ds = datasets[1]
    tr = Trainer(_hotline_config(_placement(ds, "profiled", "sgd", tmp_path / "p.npz"), steps=7), ds)
    try:
        tr.mode.phases = phases = StreamPhases("cpu", from_step=3)
        stats = tr.progress(tr.batches())
        for _ in range(3):
            next(stats)
        # During the warm-up only the copy-ins of timed steps prepared ahead were recorded (at most K + 1)
        early = phases.intervals()
        assert set(early) <= {"h2d"} and len(early.get("h2d", [])) <= 3
        list(stats)
    finally:
        tr.close()
    counts = {k: len(v) for k, v in phases.intervals().items()}
    assert counts["h2d"] == counts["sparse_update"] == counts["dense_update"] == 4, counts


def test_a_failed_pin_warns_and_goes_on_unpinned(monkeypatch):
    """Pinning only speeds copies up: a registration that fails (here: torch without CUDA) is a warning."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(RuntimeWarning, match="going on unpinned"):
        assert pin_in_place(torch.zeros(10)) is None


def test_a_refused_registration_falls_back_to_a_pinned_copy_and_says_so(monkeypatch):
    """``pinned``: in place, else a pinned copy, else unpinned, each fallback a warning naming it. Here torch has
    no CUDA, so both the registration and the copy are refused (tests/test_cuda.py refuses the registration
    alone, and checks its CUDA error is cleared)."""
    from hotline.tiers.pinning import clear_cuda_error, pinned

    t = torch.arange(10.0)
    assert pinned(t) == (t, None)  # no CUDA: nothing tried, nothing said
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.warns(RuntimeWarning, match="in place .* nor copy it to pinned memory .*going on unpinned"):
        got, region = pinned(t)
    assert got is t and region is None
    assert clear_cuda_error() in (True, False)  # without a CUDA runtime library: nothing to clear, no error


def test_a_finished_look_ahead_run_frees_its_mode_without_the_garbage_collector(datasets, tmp_path):  # noqa: F811
    """The executor and its writer thread referenced each other, keeping each trainer's tables (8.6 GB in
    the GPU benchmark) alive until a garbage collection; now the last reference frees them."""
    from hotline import Trainer
    from tests.test_equivalence import _placement

    ds = datasets[1]
    path = _placement(ds, "profiled", "sgd", tmp_path / "p.npz")
    gc.collect()
    gc.disable()
    try:
        tr = Trainer(_hotline_config(path, steps=6), ds)
        list(tr.progress(tr.batches()))
        tr.close()
        mode = weakref.ref(tr.mode)
        del tr
        assert mode() is None
    finally:
        gc.enable()
