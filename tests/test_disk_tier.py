"""The disk cold store (``--cold-store disk``) in training: exactness against device mode and the host-memory
store for every optimizer (records of the row and its whole optimizer state), checkpoints and crashes,
re-placement, N ranks, and the errors a user can cause. Its file and pages: test_disk_pages.py; its
calibration and pricing: test_disk_costmodel.py; its benchmarks: test_disk_bench.py."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from arrays import assert_equal_arrays
from ranks import spawn, train_and_dump
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.table_layout import OPTIMIZERS
from hotline.tiers.disk_file import PAGE, RowFile
from hotline.tiers.disk_store import cold_file
from hotline.tiers.store_files import made_by_hotline, order_path
from hotline.training.checkpoint_dir import CheckpointManager

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
BATCH, STEPS = 64, 24
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}
CLI_ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-32-8", "--arch-mlp-top", "32-1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk")
    ds = zipf_dataset(root / "d", BATCH * STEPS * 7 // 6 + 200, 3, TABLES)
    return ds, hot_placement(ds, root / "p.npz", 0.4, BATCH * 8)


def _config(mode, placement, tmp, optimizer="sgd", disk=True, steps=STEPS, **kw):
    cold = {"cold_store": "disk", "cold_dir": str(tmp)} if disk else {}
    return TrainConfig(mode=mode, optimizer=optimizer, learning_rate=0.05, mini_batch_size=BATCH, num_batches=steps,
                       progress=False, placement_path=placement if mode == "hotline" else None, print_freq=1,
                       **ARCH, **cold, **kw)  # fmt: skip


def _run(ds, cfg):
    tr = Trainer(cfg, ds)
    try:
        stats = list(tr.progress(tr.batches()))
        return tr.named_arrays(), stats
    finally:
        tr.close()


_device: dict = {}


def _device_run(ds, optimizer):
    if optimizer not in _device:
        _device[optimizer] = _run(ds, _config("device", None, None, optimizer, disk=False))[0]
    return _device[optimizer]


# -- exactness ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("mode,lookahead,micro", [("hybrid", 0, "auto"), ("hotline", 0, "fused"),
                                                  ("hotline", 1, "auto"), ("hotline", 2, "auto"),
                                                  ("hotline", 4, "auto")])  # fmt: skip
def test_disk_store_is_bit_identical_to_device(data, tmp_path, optimizer, mode, lookahead, micro):
    """hybrid and the fused hotline paths with the disk store: every parameter bit-identical to device mode
    (as the host-memory store is), for every optimizer (Adagrad's D and Adam's 2 D + 1 state floats per row
    in each record)."""
    ds, placement = data
    got, stats = _run(
        ds, _config(mode, placement, tmp_path, optimizer, lookahead=lookahead, micro_batches=micro)
    )
    assert_equal_arrays(_device_run(ds, optimizer), got)
    read = sum(s.counters["disk_bytes_read"] for s in stats)
    assert (
        0 < read <= PAGE * sum(s.counters["disk_pages"] for s in stats)
    )  # pages only stale rows need: unread
    if lookahead >= 2:
        assert sum(s.counters["stale_rows"] for s in stats) > 0  # the claim rule had rows to re-read


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_split_path_equals_the_memory_store(data, tmp_path, optimizer):
    """K = 0 with split micro-batches (equal to device mode up to reassociation): the same bits as the
    host-memory store; also with a DRAM tier holding part of the rows."""
    ds, placement = data
    mem = _run(ds, _config("hotline", placement, tmp_path, optimizer, disk=False, lookahead=0))[0]
    assert_equal_arrays(mem, _run(ds, _config("hotline", placement, tmp_path, optimizer, lookahead=0))[0])
    assert_equal_arrays(
        mem, _run(ds, _config("hotline", placement, tmp_path, optimizer, lookahead=0, cold_cache=2000))[0]
    )


@pytest.mark.parametrize("optimizer", ["rowwise-adagrad", "adam"])
def test_dram_tier_with_lookahead_is_bit_identical(data, tmp_path, optimizer):
    ds, placement = data
    got = _run(ds, _config("hotline", placement, tmp_path, optimizer, lookahead=2, cold_cache=4096))[0]
    assert_equal_arrays(_device_run(ds, optimizer), got)


@pytest.mark.parametrize("optimizer", ["rowwise-adagrad", "adagrad", "adam"])
def test_replacement_with_the_disk_store(data, tmp_path, optimizer):
    """Re-placement moves rows and their whole state between the hot tier and the file: the same bits as
    with the memory store."""
    ds, placement = data
    kw = {"lookahead": 2, "replace_every": 6, "optimizer": optimizer}
    mem, mem_stats = _run(ds, _config("hotline", placement, tmp_path, disk=False, **kw))
    got, _ = _run(ds, _config("hotline", placement, tmp_path, **kw))
    assert_equal_arrays(mem, got)
    assert_equal_arrays(_device_run(ds, optimizer), got)


def test_two_ranks_each_with_its_own_file(data, tmp_path):
    """N = 2: each rank's shard in its own file; the same bits as the sharded host-memory store."""
    ds, placement = data
    cold = tmp_path / "cold"
    cold.mkdir()
    jobs = []
    runs = [("mem", False, 2, "rowwise-adagrad"), ("disk", True, 2, "rowwise-adagrad"),
            ("hmem", False, 0, "sgd"), ("hdisk", True, 0, "sgd"), ("amem", False, 2, "adam"), ("adisk", True, 2, "adam")]  # fmt: skip
    for name, disk, k, opt in runs:
        mode = "hybrid" if name.startswith("h") else "hotline"
        jobs.append((_config(mode, placement, cold, opt, disk=disk, steps=12, lookahead=k), str(ds.path),
                     str(tmp_path / f"{name}.npz")))  # fmt: skip
    spawn(2, train_and_dump, jobs)
    out = {name: np.load(tmp_path / f"{name}.npz") for name, *_ in runs}
    for a, b in (("mem", "disk"), ("hmem", "hdisk"), ("amem", "adisk")):
        assert out[a].files == out[b].files
        for k in out[a].files:
            if k not in ("step_end_s", "stale_rows", "bytes_sent"):  # timing: how far ahead it fetched
                assert np.array_equal(out[a][k], out[b][k]), (a, k)
    assert cold_file(cold, 0, 2).is_file() and cold_file(cold, 1, 2).is_file()


# -- checkpoints, crashes -------------------------------------------------------------------------------
@pytest.mark.parametrize("lookahead,optimizer", [(0, "rowwise-adagrad"), (2, "rowwise-adagrad"), (2, "adam")])
def test_resume_from_a_disk_backed_checkpoint(data, tmp_path, lookahead, optimizer):
    """A checkpoint is taken between steps with every row and its state back in the file (a consistent
    snapshot); the file then moves on past it (a later step, or a crash, leaves it ahead of the checkpoint),
    and the resume loads the checkpoint into the file: bit-identical to the straight run (Adam: its moments
    and per-row step counts carried through the checkpoint into the file)."""
    ds, placement = data
    kw = {"lookahead": lookahead, "optimizer": optimizer}
    straight = _run(ds, _config("hotline", placement, tmp_path / "a", disk=False, **kw))[0]
    ck, cold = tmp_path / "ck", tmp_path / "cold"
    cold.mkdir()
    tr = Trainer(
        _config("hotline", placement, cold, steps=15, checkpoint_dir=str(ck), checkpoint_every=8, **kw), ds
    )
    try:
        tr.fit()
    finally:
        tr.close()
    assert CheckpointManager(ck).latest().name == "step-000000008.pt"  # the file holds step 15
    tr = Trainer(_config("hotline", placement, cold, checkpoint_dir=str(ck), resume=True, **kw), ds)
    try:
        tr.fit()
        assert_equal_arrays(straight, tr.named_arrays())
    finally:
        tr.close()


def test_sigkill_anywhere_then_resume(data, tmp_path):
    """Killed at any moment (mid-step with reads and writes in flight, or mid-checkpoint): the last complete
    checkpoint resumes into the same --cold-dir and the run ends bit-identical to a straight one."""
    ds, placement = data
    cold = tmp_path / "cold"
    cold.mkdir()
    common = [str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement, "--mini-batch-size", "32",
              "--num-batches", "80", "--no-progress", "--eval-max-samples", "64", "--lookahead", "2"]  # fmt: skip
    assert main(["train", *common, "--dump-params", str(tmp_path / "straight.npz")]) == 0
    ck = tmp_path / "ck"
    disk = ["--cold-store", "disk", "--cold-dir", str(cold)]
    cmd = [sys.executable, "-m", "hotline", "train", *common, *disk, "--checkpoint-dir", str(ck),
           "--checkpoint-every", "2", "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while len(CheckpointManager(ck).complete()) < 3 and proc.poll() is None:  # no clock: the run ends
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert CheckpointManager(ck).latest() is not None
    resumed = ["--checkpoint-dir", str(ck), "--resume", "--dump-params", str(tmp_path / "resumed.npz")]
    assert main(["train", *common, *disk, *resumed]) == 0
    assert_equal_arrays(np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz"))


# -- errors a user can cause ----------------------------------------------------------------------------
def test_refuses_a_file_hotline_did_not_make(data, tmp_path, capsys):
    ds, placement = data
    mine = cold_file(tmp_path)
    mine.write_bytes(b"my thesis")
    args = ["train", str(ds.path), *CLI_ARCH, "--mode", "hybrid", "--num-batches", "2", "--no-progress",
            "--cold-store", "disk", "--cold-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists: pass --force" in err[0] and str(mine) in err[0]
    assert mine.read_bytes() == b"my thesis"


@pytest.mark.parametrize(
    "flags,match",
    [(["--cold-store", "disk"], "needs --cold-dir"),
     (["--cold-store", "disk", "--cold-dir", "/nonexistent/x"], "not a directory"),
     (["--cold-dir", "/tmp"], "--cold-dir has an effect with --cold-store disk only; --cold-store memory would"),
     (["--cold-store", "disk", "--cold-dir", "/tmp", "--cold-io-depth", "0"], "--cold-io-depth"),
     (["--cold-store", "disk", "--cold-dir", "/tmp", "--cold-cache", "lots"], "lots")],
)  # fmt: skip
def test_bad_flags_are_one_line(data, flags, match, capsys):
    ds, _ = data
    assert main(["train", str(ds.path), *CLI_ARCH, "--mode", "hybrid", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]


def test_device_mode_has_no_cold_store(data, capsys):
    ds, _ = data
    argv = ["train", str(ds.path), *CLI_ARCH, "--mode", "device", "--cold-store", "disk", "--cold-dir",
            "/tmp"]  # fmt: skip
    assert main(argv) == 2  # --mode auto prices the disk store (tests/test_auto_disk.py)
    assert "--mode hybrid, hotline or auto (not --mode device)" in capsys.readouterr().err


def test_disk_full_is_one_line_naming_the_file(data, tmp_path):
    """A file-size limit below the store's size (as a full disk): refused up front, one line, exit 2."""
    ds, _ = data
    cmd = [sys.executable, "-m", "hotline", "train", str(ds.path), *CLI_ARCH, "--mode", "hybrid", "--num-batches",
           "2", "--no-progress", "--cold-store", "disk", "--cold-dir", str(tmp_path)]  # fmt: skip

    def limit():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and str(cold_file(tmp_path)) in err[0] and "reserving" in err[0], err


def test_io_error_names_the_file(tmp_path):
    """A read past a file cut short under the store (an I/O error) is one OSError naming the file."""
    f = RowFile(tmp_path / "rows.bin", 5000, 16, 1)
    try:
        os.truncate(tmp_path / "rows.bin", PAGE)
        with pytest.raises(OSError, match=str(tmp_path / "rows.bin")):
            f.read_rows(np.array([4000]))
    finally:
        f.close()


def test_a_second_run_on_the_same_file_is_refused(tmp_path):
    f = RowFile(tmp_path / "rows.bin", 10, 4, 0)
    try:
        with pytest.raises(ValueError, match="in use by another Hotline run"):
            RowFile(tmp_path / "rows.bin", 10, 4, 0)
    finally:
        f.close()


def test_cli_trains_with_the_disk_store(data, tmp_path, capsys):
    ds, placement = data
    common = [str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement, "--num-batches", "10",
              "--no-progress", "--eval-max-samples", "64"]  # fmt: skip
    assert main(["train", *common, "--dump-params", str(tmp_path / "m.npz")]) == 0
    disk = [
        "--cold-store",
        "disk",
        "--cold-dir",
        str(tmp_path),
        "--cold-io-depth",
        "4",
        "--cold-cache",
        "1KiB",
    ]
    assert main(["train", *common, *disk, "--dump-params", str(tmp_path / "d.npz")]) == 0
    assert_equal_arrays(np.load(tmp_path / "m.npz"), np.load(tmp_path / "d.npz"))
    assert made_by_hotline(cold_file(tmp_path)) and order_path(cold_file(tmp_path)).is_file()
