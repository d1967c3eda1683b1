"""benchmarks/scale_baseline.py: bench_scale's memory-mapped baseline trains what hotline's device mode trains.

The baseline (the fused table and the row-wise Adagrad state as memory-mapped files, the update by torch ops)
must be the same training as ``device`` mode with its torch update path (``device_updates``), bit for bit:
every step's loss, every dense parameter, every table row and state, on multi-hot MLPerf-like bags. Its files
hold what the tensors hold (the state is written through to disk), and they are deleted by ``close``.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import scale_baseline  # noqa: E402

from hotline import TrainConfig, Trainer  # noqa: E402
from hotline.datasets.format import Dataset  # noqa: E402
from hotline.datasets.synthetic import generate  # noqa: E402

TABLES = [300, 20, 4000, 7, 900]
BAGS = [1, 3, 2, 1, 4]
STEPS = 12
BATCH = 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale-baseline")
    path = generate(root / "d", BATCH * STEPS * 7 // 6 + 64, seed=5, table_sizes=TABLES, bag_sizes=BAGS,
                    zipf=1.1, progress=False)  # fmt: skip
    return Dataset(path)


def _config():
    return TrainConfig(mode="device", optimizer="rowwise-adagrad", learning_rate=0.05, embedding_dim=4,
                       bottom_mlp=[13, 16, 4], top_mlp=[16, 1], mini_batch_size=BATCH, num_batches=STEPS,
                       progress=False, quiet=True)  # fmt: skip


def test_mapped_baseline_trains_as_device_mode(dataset, tmp_path):
    cfg = _config()
    tr = Trainer(cfg, dataset)
    tr.mode.device_updates = True  # the torch update path the baseline takes
    try:
        ref_losses = [s.loss_sum for s in tr.progress(tr.batches())]
        ref_params = {k: v.detach().numpy().copy() for k, v in tr.model.named_parameters()}
        ref_w, ref_s = tr.mode.weight.numpy().copy(), tr.mode.state.numpy().copy()
    finally:
        tr.close()
    losses: list = []
    out = scale_baseline.train_mapped(cfg, dataset, tmp_path / "mm", STEPS, losses)
    mode = out["mode"]
    assert losses == ref_losses
    for k, v in out["model"].named_parameters():
        assert np.array_equal(v.detach().numpy(), ref_params[k]), k
    assert np.array_equal(mode.weight.numpy(), ref_w) and np.array_equal(mode.state.numpy(), ref_s)
    assert ref_s.any()  # the state moved: the comparison is not of two untouched arrays
    assert all(p.exists() for p in mode.paths)
    on_disk = np.fromfile(mode.paths[1], np.float32)  # the mapping is shared: the file holds the state
    assert np.array_equal(on_disk, ref_s)
    mode.close()
    assert not any(p.exists() for p in mode.paths)


def test_random_read_rate_counts_reads(tmp_path):
    path = tmp_path / "f"
    np.zeros(64 * 1024, np.float32).tofile(path)  # 64 pages
    for depth in (1, 4):
        assert scale_baseline.random_read_rate(path, depth, 50) > 0
