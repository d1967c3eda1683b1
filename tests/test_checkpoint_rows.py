"""Checkpoints of a disk-store run stream their rows (``hotline.training.checkpoint_rows``): the host memory a
save or a load takes is a chunk, not the table; a run killed mid-checkpoint resumes bit-identically; the
rows load into another store, another file order, and into evaluate / predict / export."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from arrays import assert_equal_arrays, fitted_arrays
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.tiers.disk_store import DiskColdStore
from hotline.training import checkpoint_delta, checkpoint_rows
from hotline.training.checkpoint import load_checkpoint, save_checkpoint
from hotline.training.checkpoint_dir import CheckpointManager
from hotline.training.checkpoint_rows import rows_path
from tests.test_placement_memory import _peak as _traced  # fn()'s result and tracemalloc's peak

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
BATCH, STEPS = 64, 24
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}
CLI_ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-32-8", "--arch-mlp-top", "32-1"]
# The memory tests' tables (36 MB of rows and state at dim 8), their copy chunk, and what a save or a load of
# them may allocate: the digest's blocks (4 MiB, two alive at once), a few chunks, small things.
MILLION = [250_000] * 4
CHUNK = 64 << 10
BOUND = (8 << 20) + 8 * CHUNK + (256 << 10)


def _placement(ds, path, share: float, skip: int = 0) -> str:
    """Hot rows by count over the first batches (``skip``: leave the most counted out: another placement)."""
    return hot_placement(ds, path, share, BATCH * 8, skip, embedding_dim=ARCH["embedding_dim"])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckrows")
    ds = zipf_dataset(root / "d", BATCH * STEPS * 7 // 6 + 200, 3, TABLES)
    return ds, _placement(ds, root / "p.npz", 0.4), _placement(ds, root / "q.npz", 0.2, skip=3)


def _config(placement, cold=None, mode="hotline", steps=STEPS, **kw):
    store = {"cold_store": "disk", "cold_dir": str(cold)} if cold is not None else {}
    return TrainConfig(mode=mode, optimizer=kw.pop("optimizer", "rowwise-adagrad"), learning_rate=0.05,
                       mini_batch_size=BATCH, num_batches=steps, progress=False, lookahead=2,
                       placement_path=placement if mode == "hotline" else None, **ARCH, **store,
                       **kw)  # fmt: skip


_straight: dict = {}


def _device(ds, optimizer="rowwise-adagrad") -> dict:
    """The straight run every resumed one must equal bit for bit (a fused pass equals device mode)."""
    if optimizer not in _straight:
        _straight[optimizer] = fitted_arrays(ds, _config(None, mode="device", optimizer=optimizer))
    return _straight[optimizer]


def _checkpointed(ds, placement, tmp_path, **kw):
    """A disk-store run of 20 steps with checkpoints at 8 and 16; returns the checkpoint directory."""
    ck, cold = tmp_path / "ck", tmp_path / "cold"
    cold.mkdir(parents=True)
    fitted_arrays(ds, _config(placement, cold, steps=20, checkpoint_dir=str(ck), checkpoint_every=8, **kw))
    return ck


# -- what a checkpoint of the disk store is -------------------------------------------------------------
def test_the_rows_go_to_a_rows_file_and_the_checkpoint_holds_no_table(data, tmp_path):
    ds, placement, _ = data
    ck = _checkpointed(ds, placement, tmp_path)
    latest = CheckpointManager(ck).latest()
    assert latest.name == "step-000000016.pt"
    payload = torch.load(latest, weights_only=True)
    assert "tables" not in payload and "states" not in payload
    assert payload["rows"]["file"] == rows_path(latest).name
    n = sum(TABLES)
    head, start = checkpoint_rows.read_header(rows_path(ck / "step-000000008.pt"))  # the first: a full copy
    assert head["step"] == 8 and head["rows"] == n and head["record_bytes"] == 4 * (8 + 1)
    assert rows_path(ck / "step-000000008.pt").stat().st_size == start + 4096 + n * 4 + head["held"] * 36
    head, start = checkpoint_rows.read_header(rows_path(latest))  # the next: a delta on it
    assert head["step"] == 16 and head["format"] == checkpoint_delta.DELTA_FORMAT
    assert head["base"]["file"] == "step-000000008.pt.rows" and 0 < head["changed"] < n / 2
    assert rows_path(latest).stat().st_size == start + 4096 + head["changed"] * 36  # bitmap page, records
    # rotation keeps two: steps 8 and 16, each with its rows; nothing else in the directory
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        f"step-{s:09d}.pt{x}" for s in (8, 16) for x in ("", ".sha256", ".rows")
    )


@pytest.mark.parametrize("optimizer,cache", [("rowwise-adagrad", 0), ("adam", 4096)])
def test_resume_from_the_rows_file_is_bit_identical(data, tmp_path, optimizer, cache):
    """With the DRAM tier too (its rows saved from memory and loaded into it)."""
    ds, placement, _ = data
    ck = _checkpointed(ds, placement, tmp_path, optimizer=optimizer, cold_cache=cache)
    resumed = fitted_arrays(ds, _config(placement, tmp_path / "cold", checkpoint_dir=str(ck), resume=True,
                                  optimizer=optimizer, cold_cache=cache))  # fmt: skip
    assert_equal_arrays(_device(ds, optimizer), resumed)


def test_a_users_file_at_the_rows_path_is_kept(data, tmp_path):
    ds, placement, _ = data
    cold = tmp_path / "cold"
    cold.mkdir()
    ck = tmp_path / "mine.pt"
    rows_path(ck).write_text("my notes")
    tr = Trainer(_config(placement, cold, steps=2), ds)
    try:
        tr.fit()
        with pytest.raises(ValueError, match="mine.pt.rows exists and is not a checkpoint's rows file"):
            save_checkpoint(tr, ck)
    finally:
        tr.close()
    assert rows_path(ck).read_text() == "my notes" and not ck.exists()


def test_the_rows_load_into_another_file_order_and_into_the_memory_store(data, tmp_path):
    """Another placement makes another file order (rows copied row by row); the host-memory store takes
    the rows whole; both resume bit-identically."""
    ds, placement, other = data
    ck = _checkpointed(ds, placement, tmp_path)
    cold2 = tmp_path / "cold2"
    cold2.mkdir()
    assert_equal_arrays(
        _device(ds), fitted_arrays(ds, _config(other, cold2, checkpoint_dir=str(ck), resume=True))
    )
    ck2 = _checkpointed(ds, placement, tmp_path / "b")
    assert_equal_arrays(
        _device(ds), fitted_arrays(ds, _config(placement, checkpoint_dir=str(ck2), resume=True))
    )


# -- killed mid-checkpoint --------------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def resume_argv(ds, placement, cold: Path, ck: Path) -> list[str]:
    """``hotline train``'s arguments that resume the disk-store run of ``placement`` from ``ck``."""
    return ["train", str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement,
            "--optimizer", "rowwise-adagrad", "--mini-batch-size", str(BATCH), "--no-progress",
            "--cold-store", "disk", "--cold-dir", str(cold), "--checkpoint-dir", str(ck), "--resume"]  # fmt: skip


def killed_during(ck: Path, step: int, when: str) -> Path:
    """What a kill during step ``step``'s checkpoint in ``ck`` leaves (``when``: ``mid-copy``, its rows half
    written under a temporary name of a process gone; ``after-copy``, its rows complete without its checkpoint
    file): the file left behind."""
    ckpt = ck / f"step-{step:09d}.pt"
    ckpt.unlink()
    (ck / f"{ckpt.name}.sha256").unlink()
    rows = rows_path(ckpt)
    if when != "mid-copy":
        return rows
    left = ck / f".{rows.name}.hotline-tmp-{_dead_pid()}-0badc0de"
    left.write_bytes(rows.read_bytes()[: rows.stat().st_size // 2])
    rows.unlink()
    return left


@pytest.mark.parametrize("when", ["mid-copy", "after-copy"])
def test_killed_mid_checkpoint_resumes_from_the_previous_one(data, tmp_path, when, capsys):
    """The states a kill during step 16's checkpoint leaves: its rows half written under a temporary name
    (the process gone), or its rows complete but its checkpoint file not written. The resume loads step 8,
    removes what the killed run left, and ends bit-identical to the straight run."""
    ds, placement, _ = data
    ck = _checkpointed(ds, placement, tmp_path)
    left = killed_during(ck, 16, when)
    capsys.readouterr()
    resumed = fitted_arrays(ds, _config(placement, tmp_path / "cold", checkpoint_dir=str(ck), resume=True))
    assert_equal_arrays(_device(ds), resumed)
    assert not left.exists()
    assert left.name in capsys.readouterr().err


def test_a_corrupt_rows_file_is_refused_in_one_line_and_kept(data, tmp_path, capsys):
    ds, placement, _ = data
    ck = _checkpointed(ds, placement, tmp_path)
    rows = rows_path(ck / "step-000000016.pt")
    raw = bytearray(rows.read_bytes())
    raw[-100] ^= 0xFF
    rows.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(resume_argv(ds, placement, tmp_path / "cold", ck)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and rows.name in err[0] and "corrupt" in err[0]
    assert rows.read_bytes() == bytes(raw)


# -- memory: a chunk, not the table -----------------------------------------------------------------------
def _million_rows(tmp_path, share: float, monkeypatch=None):
    """The memory tests' set-up (here and in test_checkpoint_memory.py): ``MILLION``'s rows and 400 samples, a
    placement of ``share`` of each table hot, and the empty cold folders of the run that saves and of the run
    that loads; with ``monkeypatch``, the checkpoint's copy chunk at ``CHUNK`` bytes."""
    ds = Dataset(generate(tmp_path / "d", 400, seed=1, table_sizes=MILLION, progress=False))
    cold, cold2 = tmp_path / "cold", tmp_path / "cold2"
    cold.mkdir()
    cold2.mkdir()
    if monkeypatch is not None:
        monkeypatch.setattr(checkpoint_rows, "CHUNK_BYTES", CHUNK)
    return ds, _placement(ds, tmp_path / "p.npz", share), cold, cold2


def test_save_and_load_take_a_chunk_of_memory_not_the_table(tmp_path, monkeypatch):
    """With the chunk at 64 KiB, saving and loading 36 MB of rows and state allocate (tracemalloc: numpy's
    arrays, Python's buffers) a few chunks and the digest's blocks (``hotline._io.sha256`` reads 4 MiB at a
    time, two alive at once): the copy streams. Holding the table, as a save once did, allocates it all."""
    ds, placement, cold, cold2 = _million_rows(tmp_path, 0.001, monkeypatch)
    table_bytes = sum(MILLION) * 4 * (8 + 1)
    tr = Trainer(_config(placement, cold, steps=3), ds)
    try:
        tr.fit()
        assert isinstance(tr.mode.cold, DiskColdStore)
        _, saved_peak = _traced(lambda: save_checkpoint(tr, tmp_path / "step-000000003.pt"))
        expected = tr.named_arrays()
    finally:
        tr.close()
    tr = Trainer(_config(placement, cold2, steps=3), ds)
    try:
        _, loaded_peak = _traced(lambda: load_checkpoint(tr, tmp_path / "step-000000003.pt"))
        assert_equal_arrays(expected, tr.named_arrays())
    finally:
        tr.close()
    assert table_bytes > 3 * BOUND
    assert saved_peak < BOUND, saved_peak
    assert loaded_peak < BOUND, loaded_peak


# -- evaluate, predict, export -----------------------------------------------------------------------------
def test_evaluate_predict_and_export_read_the_rows_file(data, tmp_path):
    """A disk-store checkpoint scores on the disk store (its rows copied into a scratch folder, removed once
    open), with the predictions of the run that wrote it; export takes its tables whole."""
    from hotline.training.export import export_torchrec_dlrm
    from hotline.training.inference import trainer_from_checkpoint

    ds, placement, _ = data
    cold = tmp_path / "cold"
    cold.mkdir()
    tr = Trainer(_config(placement, cold, steps=10), ds)
    try:
        tr.fit()
        ck = tmp_path / "ck" / "step-000000010.pt"
        save_checkpoint(tr, ck)
        want, _ = tr.predict(ds.split("val"), 0)
        arrays = tr.named_arrays()
    finally:
        tr.close()
    scorer = trainer_from_checkpoint(ds, ck, progress=False)
    try:
        assert isinstance(scorer.mode.cold, DiskColdStore) and scorer.step_count == 10
        assert sorted(p.name for p in ck.parent.iterdir()) == sorted(
            [ck.name, ck.name + ".sha256", ck.name + ".rows"]
        )  # the scratch folder is gone
        got, _ = scorer.predict(ds.split("val"), 0)
        np.testing.assert_array_equal(want, got)
    finally:
        scorer.close()
    export_torchrec_dlrm(ck, tmp_path / "m.pt")
    state = torch.load(tmp_path / "m.pt", weights_only=True)["state_dict"]
    for t in range(len(TABLES)):
        key = f"sparse_arch.embedding_bag_collection.embedding_bags.t_cat_{t}.weight"
        assert np.array_equal(state[key].numpy(), arrays[f"embedding.table_{t}"]), t


def test_two_ranks_stream_their_shards_and_resume_bit_identically(data, tmp_path):
    """``--nproc 2`` on the disk store: each rank streams its own file's rows beside its checkpoint file (rank
    0's holds the hot tier), and the resume, into the disk store or into the host-memory store, ends
    bit-identical to the straight run of two ranks."""
    ds, placement, _ = data
    common = [str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement, "--nproc", "2",
              "--optimizer", "rowwise-adagrad", "--learning-rate", "0.05", "--mini-batch-size", str(BATCH),
              "--no-progress", "--eval-max-samples", "64", "--lookahead", "2"]  # fmt: skip
    disk = ["--cold-store", "disk", "--cold-dir"]
    for d in ("c0", "c1"):
        (tmp_path / d).mkdir()
    assert (
        main(["train", *common, *disk, str(tmp_path / "c0"), "--dump-params", str(tmp_path / "a.npz")]) == 0
    )
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "8"]
    assert main(["train", *common, *disk, str(tmp_path / "c1"), *ck, "--num-batches", "20"]) == 0
    for r in range(2):
        f = tmp_path / "ck" / f"step-000000016.rank{r:03d}-of-002.pt"
        payload = torch.load(f, weights_only=True)
        assert "tiers" not in payload and ("hot" in payload) == (r == 0)
        head, _ = checkpoint_rows.read_header(rows_path(f))  # a delta on step 8, on every rank
        assert head["format"] == checkpoint_delta.DELTA_FORMAT
        assert head["base"]["file"] == f"step-000000008.rank{r:03d}-of-002.pt.rows"
    import shutil

    shutil.copytree(tmp_path / "ck", tmp_path / "ck2")
    resume = ["--resume", "--dump-params"]
    assert main(["train", *common, *disk, str(tmp_path / "c1"), *ck, *resume, str(tmp_path / "b.npz")]) == 0
    ck2 = ["--checkpoint-dir", str(tmp_path / "ck2")]
    assert main(["train", *common, *ck2, *resume, str(tmp_path / "c.npz")]) == 0
    a = np.load(tmp_path / "a.npz")
    for other in ("b.npz", "c.npz"):
        b = np.load(tmp_path / other)
        assert a.files == b.files
        assert_equal_arrays(a, b, other)
