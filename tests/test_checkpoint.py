"""Checkpoints and resume: bit-identical continuation, SIGKILL, corrupt and crafted files, NaN loss."""

import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from arrays import assert_equal_arrays, fitted_arrays

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.placement import Placement
from hotline.training.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from hotline.training.checkpoint_dir import CheckpointManager

ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    ds = Dataset(generate(root / "ds", 4000, seed=5, table_sizes=[40, 300, 25, 90], zipf=1.2, progress=False))
    hot = [np.arange(n // 4) for n in ds.table_sizes]
    Placement.from_hot_ids(
        ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8, bytes_per_row=36
    ).save(root / "p.npz")
    return ds, root / "p.npz"


def _config(mode, placement, steps, **kw):
    return TrainConfig(
        mode=mode,
        placement_path=str(placement),
        embedding_dim=8,
        bottom_mlp=[13, 16, 8],
        top_mlp=[16, 1],
        mini_batch_size=32,
        num_batches=steps,
        progress=False,
        optimizer="rowwise-adagrad",
        eval_max_samples=64,
        **kw,
    )


@pytest.mark.parametrize("mode,lookahead", [("device", 0), ("hybrid", 0), ("hotline", 0), ("hotline", 2)])
def test_resume_is_bit_identical(data, tmp_path, mode, lookahead):
    ds, placement = data
    straight = fitted_arrays(ds, _config(mode, placement, 24, lookahead=lookahead))
    ck = tmp_path / "ck"
    fitted_arrays(
        ds, _config(mode, placement, 12, lookahead=lookahead, checkpoint_dir=str(ck), checkpoint_every=4)
    )
    assert [p.name for p in CheckpointManager(ck).complete()] == ["step-000000008.pt", "step-000000012.pt"]
    resumed = fitted_arrays(
        ds, _config(mode, placement, 24, lookahead=lookahead, checkpoint_dir=str(ck), resume=True)
    )
    assert_equal_arrays(straight, resumed)


def test_sigkill_then_resume_equals_straight_run(data, tmp_path):
    ds, placement = data
    common = [
        str(ds.path),
        *ARCH,
        "--mode",
        "hotline",
        "--placement",
        str(placement),
        "--mini-batch-size",
        "32",
        "--num-batches",
        "100",
        "--no-progress",
        "--eval-max-samples",
        "64",
    ]
    assert main(["train", *common, "--dump-params", str(tmp_path / "straight.npz")]) == 0
    ck = tmp_path / "ck"
    cmd = [
        sys.executable,
        "-m",
        "hotline",
        "train",
        *common,
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "2",
        "--threads",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and len(CheckpointManager(ck).complete()) < 2:  # no wall-clock bound
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # anywhere: between steps or in the middle of a checkpoint write
    proc.wait()
    assert CheckpointManager(ck).latest() is not None
    assert (
        main(
            [
                "train",
                *common,
                "--checkpoint-dir",
                str(ck),
                "--resume",
                "--dump-params",
                str(tmp_path / "resumed.npz"),
            ]
        )
        == 0
    )
    assert_equal_arrays(np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz"))


def test_partial_write_is_ignored_and_corruption_refused(data, tmp_path):
    ds, placement = data
    ck = tmp_path / "ck"
    fitted_arrays(ds, _config("device", placement, 8, checkpoint_dir=str(ck), checkpoint_every=4))
    latest = CheckpointManager(ck).latest()
    # A run killed mid-write leaves a temporary file and a data file without digest: not complete, not used.
    (ck / "step-000000012.pt.tmp").write_bytes(b"partial")
    (ck / "step-000000012.pt").write_bytes(latest.read_bytes()[:100])
    assert CheckpointManager(ck).latest() == latest
    # A complete checkpoint whose bytes changed is refused, naming the file.
    raw = bytearray(latest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    latest.write_bytes(bytes(raw))
    tr = Trainer(_config("device", placement, 8), ds)
    before = {k: v.copy() for k, v in tr.named_arrays().items()}
    with pytest.raises(CheckpointError, match=r"step-000000008\.pt is corrupt"):
        load_checkpoint(tr, latest)
    after = tr.named_arrays()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing half-loaded
    # A truncated file without digest is refused too.
    trunc = tmp_path / "trunc.pt"
    trunc.write_bytes(raw[: len(raw) // 3])
    with pytest.raises(CheckpointError, match="truncated, corrupt or unsafe"):
        read_checkpoint(trunc)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-checkpoint",))


def test_crafted_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"format": "hotline-checkpoint/1", "x": _Exploit()}, f, pickle_module=pickle)
    with pytest.raises(CheckpointError, match="unsafe"):
        read_checkpoint(path)
    assert not (tmp_path / "pwned-by-checkpoint").exists()


def test_mismatched_checkpoint_refused(data, tmp_path):
    ds, placement = data
    tr = Trainer(_config("device", placement, 2), ds)
    save_checkpoint(tr, tmp_path / "c.pt")
    other = Trainer(TrainConfig(embedding_dim=8, bottom_mlp=[13, 32, 8], top_mlp=[16, 1], progress=False), ds)
    with pytest.raises(CheckpointError, match="architecture"):
        load_checkpoint(other, tmp_path / "c.pt")


def test_nan_loss_stops_and_keeps_last_checkpoint(data, tmp_path, capsys):
    ds, placement = data
    ck = tmp_path / "ck"
    argv = [
        "train",
        str(ds.path),
        *ARCH,
        "--mini-batch-size",
        "32",
        "--num-batches",
        "60",
        "--no-progress",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "1",
        "--learning-rate",
        "1e30",
    ]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "training stopped before saving anything of this step" in err and "last good checkpoint" in err
    latest = CheckpointManager(ck).latest()
    payload = read_checkpoint(latest)
    assert all(torch.isfinite(t).all() for t in payload["tables"])


@pytest.mark.parametrize("lookahead", [1, 4])
def test_resume_is_bit_identical_with_lookahead_1_and_4(data, tmp_path, lookahead):
    ds, placement = data
    straight = fitted_arrays(ds, _config("hotline", placement, 24, lookahead=lookahead))
    ck = tmp_path / "ck"
    fitted_arrays(
        ds, _config("hotline", placement, 10, lookahead=lookahead, checkpoint_dir=str(ck), checkpoint_every=5)
    )
    assert [p.name for p in CheckpointManager(ck).complete()] == ["step-000000005.pt", "step-000000010.pt"]
    resumed = fitted_arrays(
        ds, _config("hotline", placement, 24, lookahead=lookahead, checkpoint_dir=str(ck), resume=True)
    )
    assert_equal_arrays(straight, resumed)


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """172 training samples: with batches of 32, 5 full batches and a short one of 12 per epoch."""
    root = tmp_path_factory.mktemp("ckpt-short")
    ds = Dataset(generate(root / "ds", 200, seed=5, table_sizes=[40, 300, 25, 90], zipf=1.2, progress=False))
    assert len(ds.train) == 172
    hot = [np.arange(n // 4) for n in ds.table_sizes]
    Placement.from_hot_ids(
        ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8, bytes_per_row=36
    ).save(root / "p.npz")
    return ds, root / "p.npz"


@pytest.mark.parametrize("stop", [5, 6], ids=["before-short-batch", "at-epoch-boundary"])
@pytest.mark.parametrize(
    "mode,lookahead,micro",
    [("device", 0, "auto"), ("hybrid", 0, "auto"), ("hotline", 0, "auto"), ("hotline", 1, "auto"),
     ("hotline", 2, "split"), ("hotline", 4, "auto")],
)  # fmt: skip
def test_resume_across_short_batch_and_epoch_boundary(short, tmp_path, mode, lookahead, micro, stop):
    """Two epochs of 6 steps: stopped after step 5 (the resumed run starts with the short last batch) or 6 (it
    starts the second epoch), the resumed run ends bit-identical to the straight one."""
    ds, placement = short
    kw = {"lookahead": lookahead, "micro_batches": micro, "nepochs": 2}
    straight = fitted_arrays(ds, _config(mode, placement, 0, **kw))
    ck = tmp_path / "ck"
    fitted_arrays(ds, _config(mode, placement, stop, checkpoint_dir=str(ck), checkpoint_every=stop, **kw))
    assert [p.name for p in CheckpointManager(ck).complete()] == [f"step-{stop:09d}.pt"]
    tr = Trainer(_config(mode, placement, 0, checkpoint_dir=str(ck), resume=True, **kw), ds)
    try:
        assert tr.train_steps() == 12
        tr.fit()
        assert tr.step_count == 12
        resumed = tr.named_arrays()
    finally:
        tr.close()
    assert_equal_arrays(straight, resumed)


# ------------------------------------------------------------------------------ trusted by content
def _cli_run(data, ck, steps, *extra):
    ds, _ = data
    argv = ["train", str(ds.path), *ARCH, "--mode", "device", "--mini-batch-size", "32", "--no-progress", "--eval-max-samples", "64",
            "--threads", "1", "--num-batches", str(steps), "--checkpoint-dir", str(ck), *extra]  # fmt: skip
    return main(argv)


def test_a_renamed_checkpoint_is_refused_and_rotates_nothing_away(data, tmp_path, capsys):
    ck = tmp_path / "ck"
    assert _cli_run(data, ck, 12, "--checkpoint-every", "4") == 0
    for suffix in (".pt", ".pt.sha256"):  # step 8, copied under a higher step's name (digest and all)
        (ck / f"step-000000900{suffix}").write_bytes((ck / f"step-000000008{suffix}").read_bytes())
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    capsys.readouterr()
    assert _cli_run(data, ck, 16, "--checkpoint-every", "4", "--resume") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "step-000000900.pt is named step 900 but holds step 8" in err[0], err
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before  # the real 8 and 12 are still there
    assert read_checkpoint(ck / "step-000000012.pt")["step"] == 12


def test_rotation_removes_only_checkpoints_verified_as_this_runs(data, tmp_path):
    ds, placement = data
    ck = tmp_path / "ck"
    cfg = _config("device", placement, 8, checkpoint_dir=str(ck), checkpoint_every=2)
    tr = Trainer(cfg, ds)
    tr.fit()
    tr.close()
    assert [p.name for p in CheckpointManager(ck).complete()] == ["step-000000006.pt", "step-000000008.pt"]
    # Replaced under the run's name by another run's checkpoint: not provably ours, so never removed.
    other_cfg = TrainConfig(embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1], mini_batch_size=16)
    other = Trainer(replace(other_cfg, progress=False), ds)
    other.step_count = 6  # its name tells the truth: only the run differs
    save_checkpoint(other, ck / "step-000000006.pt")
    other.close()
    theirs = (ck / "step-000000006.pt").read_bytes()
    manager = CheckpointManager(ck, keep=1)
    resumed = Trainer(
        _config("device", placement, 10, checkpoint_dir=str(ck), checkpoint_every=2, resume=True), ds
    )
    manager.start(resumed, resume=True)
    resumed.step_count = 10
    manager.save(resumed)
    manager.close()
    resumed.close()
    assert (ck / "step-000000006.pt").read_bytes() == theirs  # another run's: left alone
    assert not (ck / "step-000000008.pt").exists()  # this run's, older than the newest verified: removed
    assert (ck / "step-000000010.pt").exists()


def test_an_n_rank_checkpoint_is_complete_or_absent(data, tmp_path, capsys):
    """A crash between the ranks' parts and the commit marker leaves an incomplete checkpoint: not resumed
    from, and removed by the next run of the same fingerprint; another program's file is left alone."""
    ck = tmp_path / "ck"
    assert _cli_run(data, ck, 4, "--checkpoint-every", "2", "--nproc", "2") == 0
    # The crash: rank 1's part of step 4 and the marker never written (one rank's half checkpoint).
    for name in ("step-000000004.of-002.commit", "step-000000004.rank001-of-002.pt",
                 "step-000000004.rank001-of-002.pt.sha256"):  # fmt: skip
        (ck / name).unlink(missing_ok=True)
    foreign = ck / "step-000000008.rank000-of-002.pt"
    foreign.write_bytes(b"not a checkpoint of this run")
    assert [p.name for p in CheckpointManager(ck, comm=_Ranks(2)).complete()] == ["step-000000002"]
    capsys.readouterr()
    assert _cli_run(data, ck, 3, "--checkpoint-every", "2", "--nproc", "2", "--resume") == 0
    names = sorted(p.name for p in ck.iterdir())
    assert not any(n.startswith("step-000000004") for n in names), names  # the half checkpoint is gone
    assert foreign.read_bytes() == b"not a checkpoint of this run"
    assert "step-000000002.rank001-of-002.pt" in names  # the complete one resumed from stays
    assert "step-000000002.of-002.commit" in names  # with its commit marker


class _Ranks:
    """The rank and world size a CheckpointManager needs to name N-rank files (no process group)."""

    def __init__(self, world_size: int):
        self.rank, self.world_size = 0, world_size
