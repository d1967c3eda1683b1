"""Distributed training: 2 gloo ranks on 127.0.0.1 give the same model as one process.

One spawn of two processes trains every case in turn (process start-up dominates the time); the launcher
(``hotline train --nproc 2``, through torch's elastic launcher) is tested with a checkpoint and a resume.
Parameters are compared as in tests/test_equivalence.py: within 1e-5 relative to each tensor's scale.
"""

import argparse

import numpy as np
import pytest
from ranks import spawn, train_and_dump
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.cli.train import add_parser
from hotline.distributed.comm import Comm, shard_bounds
from hotline.distributed.launcher import launcher_argv
from hotline.training.checkpoint import CheckpointError

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
STEPS = 30
BATCH = 64
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}
CLI_ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-32-8", "--arch-mlp-top", "32-1"]
# (name, mode, optimizer, dataset, global batch, steps, look-ahead): the multi-hot cases run every batch of a
# small multi-hot dataset with a batch that does not split evenly (18 + 19 samples) and a short last batch.
CASES = [
    ("device-sgd", "device", "sgd", "onehot", BATCH, STEPS, 0),
    ("device-adagrad", "device", "rowwise-adagrad", "onehot", BATCH, STEPS, 0),
    ("hotline-adagrad", "hotline", "rowwise-adagrad", "onehot", BATCH, STEPS, 0),
    ("hybrid-sgd", "hybrid", "sgd", "onehot", BATCH, STEPS, 0),
    ("hotline-multihot", "hotline", "sgd", "multihot", 37, 0, 0),
    ("hotline-adagrad-k2", "hotline", "rowwise-adagrad", "onehot", BATCH, STEPS, 2),
    ("hotline-sgd-k2", "hotline", "sgd", "onehot", BATCH, STEPS, 2),
    ("hotline-adagrad-k1", "hotline", "rowwise-adagrad", "onehot", BATCH, STEPS, 1),
    ("hotline-multihot-k2", "hotline", "rowwise-adagrad", "multihot", 37, 0, 2),
]


def _placement(ds, path):
    """The most accessed 40% of each table's rows in the first batches: some samples popular, some not."""
    return hot_placement(ds, path, 0.4, BATCH * 8, bytes_per_row=36)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    onehot = zipf_dataset(root / "onehot", BATCH * STEPS * 7 // 6 + 300, 3, TABLES)
    multihot = zipf_dataset(root / "multihot", 700, 4, TABLES, pooling_factor=3)
    sets = {"onehot": onehot, "multihot": multihot}
    places = {k: _placement(ds, root / f"{k}.npz") for k, ds in sets.items()}
    return root, sets, places


def _config(mode, optimizer, placement, batch=BATCH, steps=STEPS, lookahead=0, **kw):
    return TrainConfig(
        mode=mode,
        optimizer=optimizer,
        learning_rate=0.05,
        mini_batch_size=batch,
        num_batches=steps,
        progress=False,
        placement_path=placement,
        lookahead=lookahead,
        print_freq=1,
        eval_max_samples=128,
        **ARCH,
        **kw,
    )


_singles: dict = {}


def _single(config, ds):
    """Losses and parameters of one process (cached: several tests compare with the same run)."""
    key = (repr(config), str(ds.path))
    if key not in _singles:
        tr = Trainer(config, ds)
        try:
            losses = [s.loss_sum for s in tr.progress(tr.batches())]
            _singles[key] = np.array(losses), tr.named_arrays()
        finally:
            tr.close()
    return _singles[key]


def assert_close(ref: dict, got, rtol=1e-5):
    for name, a in ref.items():
        scale = max(float(np.abs(a).max()), 1e-12)
        err = float(np.abs(got[name] - a).max())
        assert err <= rtol * scale, f"{name}: max difference {err:.3e} > {rtol} x scale {scale:.3e}"


@pytest.fixture(scope="module")
def two_ranks(data):
    """Every case trained by 2 spawned ranks (one spawn); rank 0's parameters, losses and traffic per case."""
    root, sets, places = data
    jobs = [
        (_config(mode, opt, places[d], b, s, k), str(sets[d].path), str(root / f"{name}.npz"))
        for name, mode, opt, d, b, s, k in CASES
    ]
    spawn(2, train_and_dump, jobs)
    return {name: np.load(out) for (name, *_), (_, _, out) in zip(CASES, jobs)}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_equal_one_process(data, two_ranks, case):
    _, sets, places = data
    name, mode, opt, d, batch, steps, k = case
    losses, ref = _single(_config(mode, opt, places[d], batch, steps), sets[d])
    got = two_ranks[name]
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
    assert_close(ref, got)
    if mode != "device":  # the sharded tiers also equal the single-process reference mode
        assert_close(_single(_config("device", opt, None, batch, steps), sets[d])[1], got)
    if k:  # and one process with the same look-ahead; the owners' stale rule was needed (rows re-fetched)
        assert_close(_single(_config(mode, opt, places[d], batch, steps, k), sets[d])[1], got)
        assert got["stale_rows"].sum() > 0
    else:
        assert got["stale_rows"].sum() == 0


def test_traffic_counts(data, two_ranks):
    """Bytes each rank sends per step, by kind: exact for the dense all-reduce, present for the rest."""
    _, sets, _ = data
    n_params = sum(a.size for k, a in two_ranks["device-sgd"].items() if k.startswith("model."))
    for name, extra in (("device-sgd", 1), ("hotline-adagrad", 5)):  # loss (+ 4 summed counters)
        z = two_ranks[name]
        kinds = list(z["bytes_kinds"])
        dense = z["bytes_sent"][:, kinds.index("bytes_sent_dense_allreduce")]
        assert (dense == 2 * (2 - 1) / 2 * 4 * (n_params + extra)).all()  # ring all-reduce of float32
    z = two_ranks["hotline-adagrad"]
    kinds = list(z["bytes_kinds"])
    per_step = {k: z["bytes_sent"][:, kinds.index(k)] for k in kinds}
    for k in ("cold_ids", "cold_rows", "cold_grads", "hot_allgather"):
        assert per_step[f"bytes_sent_{k}"].sum() > 0, k
    # an owner answers with rows + adagrad state (D + 1 floats); a rank returns D gradient floats per row it
    # asked for (int64 id): what rank 0 sends back equals what it asked
    asked = per_step["bytes_sent_cold_ids"] / 8
    np.testing.assert_array_equal(per_step["bytes_sent_cold_grads"], asked * 4 * 8)
    rows = per_step["bytes_sent_cold_rows"] / (4 * 9)
    np.testing.assert_array_equal(rows, np.round(rows))


def test_shard_bounds_cover_the_batch():
    for n in (0, 1, 5, 37, 64):
        for world in (1, 2, 3, 8):
            bounds = [shard_bounds(n, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


def test_one_rank_equals_trainer(data):
    """The distributed code path with one rank (no process group) is the plain trainer."""
    _, sets, places = data
    cfg = _config("hotline", "rowwise-adagrad", places["onehot"], steps=8)
    losses, ref = _single(cfg, sets["onehot"])
    tr = Trainer(cfg, sets["onehot"], Comm(0, 1))
    try:
        got = [s.loss_sum for s in tr.progress(tr.batches())]
        np.testing.assert_allclose(got, losses, rtol=1e-6)
        assert_close(ref, tr.named_arrays(), rtol=1e-6)
    finally:
        tr.close()


def test_launcher_argv_round_trip():
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    parser = sub.choices["train"]
    argv = ["data/x", "--mode", "hotline", "--lookahead", "0", "--no-progress", "--nproc", "2"]
    args = parser.parse_args(argv)
    again = parser.parse_args(launcher_argv(parser, args, ("nproc", "train_parser")))
    assert {**vars(again), "nproc": 2} == vars(args)


def test_launcher_checkpoint_resume(data, tmp_path):
    """``hotline train --nproc 2 --lookahead 2``: 20 steps with a checkpoint at 10 and 20 (taken while the rows
    of later steps are being fetched), resume with ``--lookahead 0`` to 30 == one process."""
    _, sets, places = data
    common = [str(sets["onehot"].path), *CLI_ARCH, "--mode", "hotline", "--placement", places["onehot"]]
    common += ["--optimizer", "rowwise-adagrad", "--learning-rate", "0.05"]
    common += ["--mini-batch-size", str(BATCH), "--no-progress", "--eval-max-samples", "128"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "10"]
    first = ["--nproc", "2", "--lookahead", "2", "--num-batches", "20", "--test-freq", "5"]
    assert main(["train", *common, *first, *ckpt]) == 0
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert "step-000000020.rank001-of-002.pt" in names and "step-000000010.rank000-of-002.pt.sha256" in names
    out = tmp_path / "two.npz"
    resume = ["--lookahead", "0", "--num-batches", str(STEPS), "--resume", "--dump-params", str(out)]
    assert main(["train", *common, "--nproc", "2", *ckpt, *resume]) == 0
    one = _single(_config("hotline", "rowwise-adagrad", places["onehot"]), sets["onehot"])[1]
    assert_close(one, np.load(out))
    # a checkpoint of 2 ranks does not resume on 1
    cfg = _config(
        "hotline", "rowwise-adagrad", places["onehot"], checkpoint_dir=str(tmp_path / "ck"), resume=True
    )
    tr = Trainer(cfg, sets["onehot"], Comm(0, 1))
    with pytest.raises(CheckpointError, match="written by 2 ranks.*--nproc 2"):
        tr.fit()
    tr.close()


def test_bench_distributed_smoke(tmp_path, monkeypatch):
    """The benchmark runs (tiny sizes, N = 2 only: one spawn): every figure present and positive."""
    import json
    import sys
    from pathlib import Path

    import numba
    import torch

    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(bench_dir))
    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        import bench_distributed

        out = tmp_path / "r.json"
        argv = ["--smoke", "--threads", "1", "--nprocs", "2", "--modes", "hotline", "--json", str(out)]
        bench_distributed.main(argv)
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
        sys.modules.pop("bench_distributed", None)
    results = json.loads(out.read_text())["results"]  # one run per budget of the coverage sweep
    assert len(results) == 3 and len({r["hot_rows"] for r in results}) == 3
    for r in results:
        assert r["nproc"] == 2 and r["samples_per_s"] > 0 and r["ms_per_step"] > 0
        assert 0.6 < r["coverage"] < 0.99 and not r["saturated"]
        for kind in ("dense_allreduce", "hot_allgather", "cold_ids", "cold_rows", "cold_grads"):
            assert r[f"bytes_{kind}"] > 0, kind


def _fetch_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "hotline-prepare"]


def test_lookahead_one_rank_stops_cleanly(data):
    """Look-ahead on one rank (no process group): equal to one process, and leaving the loop early ends the
    fetch thread."""
    _, sets, places = data
    cfg = _config("hotline", "sgd", places["onehot"], steps=12, lookahead=2)
    tr = Trainer(cfg, sets["onehot"], Comm(0, 1))
    try:
        stats = list(tr.progress(tr.batches()))
        assert_close(_single(_config("hotline", "sgd", places["onehot"], steps=12), sets["onehot"])[1],
                     tr.named_arrays())  # fmt: skip
        assert sum(s.counters["stale_rows"] for s in stats) > 0
        steps = tr.progress(tr.batches())
        next(steps)
        assert _fetch_threads()
        steps.close()
        assert not _fetch_threads()
    finally:
        tr.close()


def test_lookahead_error_reaches_main_thread(data):
    """An id out of range, found by the fetch thread's dispatch, is raised on the main thread."""
    from dataclasses import replace

    _, sets, places = data
    cfg = _config("hotline", "sgd", places["onehot"], steps=4, lookahead=2)
    tr = Trainer(cfg, sets["onehot"], Comm(0, 1))
    try:
        shards = list(tr.batches())
        bad = shards[2].sparse.copy()
        bad[3, 1, 0] = TABLES[1]
        shards[2] = replace(shards[2], sparse=bad)
        with pytest.raises(IndexError, match=f"table 1: id {TABLES[1]} out of range"):
            for _ in tr.progress(iter(shards)):
                pass
        assert not _fetch_threads()
    finally:
        tr.close()
