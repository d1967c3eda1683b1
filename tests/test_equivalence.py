"""Exactness: ``hybrid`` and ``hotline`` training equal ``device`` training on the same batches.

Compared at every step (loss) and at the end (every parameter, embedding tables in original row order), within
1e-5 relative to each tensor's scale in float32: the modes differ only in floating-point summation order (the
popular and non-popular micro-batches' gradients are summed instead of computed in one pass).
"""

import numpy as np
import pytest
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.placement import Placement

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
STEPS = 55
BATCH = 64
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("equiv")
    rows = BATCH * STEPS * 7 // 6 + 200
    return {
        1: zipf_dataset(root / "onehot", rows, 3, TABLES),
        3: zipf_dataset(root / "multihot", rows, 4, TABLES, pooling_factor=3),
    }


def _placement(ds, kind, optimizer, path):
    bpr = 4 * ARCH["embedding_dim"] + (4 if optimizer == "rowwise-adagrad" else 0)
    common = {"embedding_dim": ARCH["embedding_dim"], "bytes_per_row": bpr}
    if kind == "all-cold":
        p = Placement.all_cold(ds.table_sizes, dataset_fingerprint=ds.fingerprint, **common)
    elif kind == "all-hot":
        p = Placement.all_hot(ds.table_sizes, dataset_fingerprint=ds.fingerprint, **common)
    else:  # the most accessed rows of the first batches, so some samples are popular and some are not
        return hot_placement(ds, path, 0.4, BATCH * 8, **common)
    p.save(path)
    return str(path)


def _run(ds, mode, optimizer, placement=None, lookahead=0, micro_batches="auto", device_updates=False,
         pack_copies=False):  # fmt: skip
    cfg = TrainConfig(
        micro_batches=micro_batches,
        mode=mode,
        optimizer=optimizer,
        learning_rate=0.05,
        mini_batch_size=BATCH,
        num_batches=STEPS,
        progress=False,
        placement_path=placement,
        lookahead=lookahead,
        print_freq=1,
        **ARCH,
    )
    tr = Trainer(cfg, ds)
    if device_updates:  # the CUDA update path (torch ops, distinct rows found on the host), run on the CPU
        tr.mode.device_updates = True
    if pack_copies:  # the CUDA copy path (a step's arrays packed into one buffer per dtype), run on the CPU
        tr.mode.pack_copies = True
    try:
        stats = [s for s in tr.progress(tr.batches())]
        return np.array([s.loss_sum for s in stats]), tr.named_arrays(), stats
    finally:
        tr.close()


def assert_equivalent(ref, other, rtol=1e-5):
    (l0, p0, _), (l1, p1, _) = ref, other
    assert len(l0) == len(l1) == STEPS
    np.testing.assert_allclose(l1, l0, rtol=rtol)
    assert p0.keys() == p1.keys()
    for name, a in p0.items():
        scale = max(float(np.abs(a).max()), 1e-12)
        err = float(np.abs(p1[name] - a).max())
        assert err <= rtol * scale, f"{name}: max difference {err:.3e} > {rtol} x scale {scale:.3e}"


_reference: dict = {}


def _device(ds, optimizer):
    key = (ds.path, optimizer)
    if key not in _reference:
        _reference[key] = _run(ds, "device", optimizer)
    return _reference[key]


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("pooling", [1, 3])
def test_hybrid_equals_device(datasets, optimizer, pooling):
    ds = datasets[pooling]
    assert_equivalent(_device(ds, optimizer), _run(ds, "hybrid", optimizer))


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("pooling", [1, 3])
@pytest.mark.parametrize("placement", ["profiled", "all-cold", "all-hot"])
def test_hotline_equals_device(datasets, tmp_path, optimizer, pooling, placement):
    ds = datasets[pooling]
    path = _placement(ds, placement, optimizer, tmp_path / "p.npz")
    run = _run(ds, "hotline", optimizer, path)
    stats = run[2]
    popular = np.array([s.counters["popular_samples"] for s in stats])
    working = np.array([s.counters["working_set_rows"] for s in stats])
    if placement == "all-cold":  # no popular sample at all
        assert popular.sum() == 0 and working.min() > 0
    elif placement == "all-hot":  # only popular samples, empty working sets
        assert popular.min() == BATCH and working.max() == 0
    else:  # both micro-batches non-empty in most steps, cold rows repeated within a batch
        assert 0 < popular.mean() < BATCH
        cold_lookups = np.array(
            [
                BATCH * len(TABLES) * pooling - s.counters["popular_samples"] * len(TABLES) * pooling
                for s in stats
            ]
        )
        assert (working < cold_lookups).all()
    assert_equivalent(_device(ds, optimizer), run)


def test_cli_dump_params_equal(datasets, tmp_path):
    ds = datasets[1]
    placement = _placement(ds, "profiled", "sgd", tmp_path / "p.npz")
    common = [
        str(ds.path),
        "--arch-sparse-feature-size",
        "8",
        "--arch-mlp-bot",
        "13-32-8",
        "--arch-mlp-top",
        "32-1",
        "--mini-batch-size",
        str(BATCH),
        "--num-batches",
        "20",
        "--no-progress",
        "--learning-rate",
        "0.05",
        "--eval-max-samples",
        "256",
    ]
    assert main(["train", *common, "--dump-params", str(tmp_path / "d.npz")]) == 0
    assert (
        main(
            [
                "train",
                *common,
                "--mode",
                "hotline",
                "--placement",
                placement,
                "--dump-params",
                str(tmp_path / "h.npz"),
            ]
        )
        == 0
    )
    d, h = np.load(tmp_path / "d.npz"), np.load(tmp_path / "h.npz")
    assert sorted(d.files) == sorted(h.files) and "embedding.table_7" in d.files
    for k in d.files:
        np.testing.assert_allclose(h[k], d[k], rtol=1e-5, atol=1e-5 * np.abs(d[k]).max())


@pytest.mark.parametrize(
    "lookahead,micro_batches", [(1, "auto"), (2, "auto"), (4, "auto"), (2, "split"), (0, "fused")]
)
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
def test_lookahead_equals_device(datasets, tmp_path, optimizer, lookahead, micro_batches):
    """Look-ahead gathers run while earlier steps still update shared cold rows: still exact (with the
    micro-batches split or fused)."""
    ds = datasets[1]
    path = _placement(ds, "profiled", optimizer, tmp_path / "p.npz")
    run = _run(ds, "hotline", optimizer, path, lookahead=lookahead, micro_batches=micro_batches)
    if lookahead == 0:
        assert sum(s.counters["popular_samples"] for s in run[2]) > 0
        return assert_equivalent(_device(ds, optimizer), run)
    stale = sum(s.counters["stale_rows"] for s in run[2])
    assert stale > 0  # the case that matters happened: rows shared with in-flight steps were refreshed
    # the refresh's seconds: a counter within the stall, not a phase of its own (the phases add up to a step)
    assert all(0 <= s.counters["refresh_s"] <= s.times["stall"] for s in run[2])
    assert not any("refresh" in k for s in run[2] for k in s.times)
    assert_equivalent(_device(ds, optimizer), run)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("lookahead", [0, 2])
def test_device_update_path_equals_device(datasets, tmp_path, optimizer, lookahead):
    """The sparse updates CUDA runs (torch ops fed with host-computed distinct rows) are exact too."""
    ds = datasets[3]
    path = _placement(ds, "profiled", optimizer, tmp_path / "p.npz")
    assert_equivalent(
        _device(ds, optimizer), _run(ds, "hotline", optimizer, path, lookahead, device_updates=True)
    )
