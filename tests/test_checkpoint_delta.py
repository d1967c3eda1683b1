"""Delta checkpoints of the disk store (``hotline.training.checkpoint_delta``): after a full copy, a checkpoint
writes only the records written since (a bit per row marks them), its bytes are those rows' records, and every
reader (resume, evaluate, predict, export) sees the same rows as from a full copy. Rotation keeps the base a
kept delta needs; a missing or damaged base is refused in one line before anything changes; a kill mid-delta
leaves the previous checkpoint to resume from."""

import numpy as np
import pytest
import torch
from arrays import assert_equal_arrays, fitted_arrays
from test_checkpoint_rows import ARCH, BATCH, CLI_ARCH, _config, _device, data, killed_during, resume_argv  # noqa: F401 - data: fixture

from hotline import Trainer
from hotline.cli import main
from hotline.tiers.disk_file import RowFile
from hotline.tiers.written_rows import WrittenRows, track
from hotline.training import checkpoint_delta, checkpoint_rows
from hotline.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from hotline.training.checkpoint_rows import read_header, rows_path
from hotline.training.export import export_torchrec_dlrm
from hotline.training.inference import trainer_from_checkpoint


# -- the bitmap -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000])
def test_the_bitmap_is_a_bit_a_row_and_marks_what_was_written(n):
    rng = np.random.default_rng(n)
    w = WrittenRows(n)
    assert w.nbytes == -(-n // 8)  # 0.125 bytes a row
    want = np.zeros(n, bool)
    for _ in range(5):
        pos = rng.integers(0, n, rng.integers(0, 20))  # repeats too
        w.mark(pos)
        want[pos] = True
        lo = int(rng.integers(0, n))
        hi = int(rng.integers(lo, n + 1))
        w.mark_range(lo, hi)
        want[lo:hi] = True
        assert w.count() == want.sum()
        got = np.unpackbits(w.bits, bitorder="little")[:n].astype(bool)
        np.testing.assert_array_equal(got, want)


def test_a_row_file_marks_every_position_it_writes_once_tracked(tmp_path):
    """Step writes (disk and DRAM tier) and bulk writes; nothing before :func:`track`."""
    n, dim = 100, 4
    order = np.random.default_rng(0).permutation(n)
    f = RowFile(tmp_path / "rows.bin", n, dim, 1, order=order, direct=False, cache_bytes=10 * 20)
    try:
        f.write_rows(np.array([3, 4]), np.ones((2, 5), np.float32))  # untracked: costs nothing, marks nothing
        assert getattr(f, "written_rows", None) is None
        w = track(f)
        rows = np.array([order[0], order[50], order[99]])  # the DRAM tier's first position, two on disk
        f.write_rows(rows, np.ones((3, 5), np.float32))
        f.put_positions(60, np.ones((5, 5), np.float32))
        marked = np.flatnonzero(np.unpackbits(w.bits, bitorder="little")[:n])
        np.testing.assert_array_equal(marked, [0, 50, 60, 61, 62, 63, 64, 99])
    finally:
        f.close()


# -- a delta's bytes and what it holds -----------------------------------------------------------------
def _run(ds, placement, tmp_path, steps, every, **kw):
    """A disk-store run of ``steps`` steps with a checkpoint every ``every``; returns the directory."""
    ck, cold = tmp_path / "ck", tmp_path / "cold"
    cold.mkdir(parents=True, exist_ok=True)
    fitted_arrays(
        ds, _config(placement, cold, steps=steps, checkpoint_dir=str(ck), checkpoint_every=every, **kw)
    )
    return ck


def _head(ck, step):
    return read_header(rows_path(ck / f"step-{step:09d}.pt"))


def test_a_delta_holds_the_rows_written_since_the_full_copy(data, tmp_path):  # noqa: F811
    ds, placement, _ = data
    n = sum(ds.table_sizes)
    ck = _run(ds, placement, tmp_path, 12, 4)
    full, start = _head(ck, 4)
    assert full["format"] == checkpoint_rows.ROWS_FORMAT
    for step in (8, 12):
        head, start = _head(ck, step)
        assert head["format"] == checkpoint_delta.DELTA_FORMAT
        assert head["base"]["file"] == "step-000000004.pt.rows"
        assert head["deltas"] == step // 4 - 1
        size = rows_path(ck / f"step-{step:09d}.pt").stat().st_size
        assert size == start + 4096 + head["changed"] * 36  # a page of bitmap, then the changed rows' records
        assert 0 < head["changed"] < n / 2
    # differential: each delta holds everything since the base, so the later one holds at least as many
    assert _head(ck, 12)[0]["changed"] >= _head(ck, 8)[0]["changed"]
    # rotation keeps two to resume from, and the base they stand on
    assert sorted(p.name for p in ck.iterdir() if p.name.endswith(".pt")) == [
        f"step-{s:09d}.pt" for s in (4, 8, 12)
    ]


def test_rotation_keeps_the_base_a_kept_delta_needs_and_no_more(data, tmp_path):  # noqa: F811
    ds, placement, _ = data
    ck = _run(ds, placement, tmp_path, 16, 4)
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        f"step-{s:09d}.pt{x}" for s in (4, 12, 16) for x in ("", ".sha256", ".rows")
    )  # 8 rotated away; 4 kept: 12 and 16 are deltas on it


def test_full_again_after_full_every_deltas(data, tmp_path, monkeypatch):  # noqa: F811
    ds, placement, _ = data
    monkeypatch.setattr(checkpoint_delta, "FULL_EVERY", 1)
    ck = _run(ds, placement, tmp_path, 16, 4)
    head = _head(ck, 16)[0]
    assert (
        head["format"] == checkpoint_delta.DELTA_FORMAT and head["base"]["file"] == "step-000000012.pt.rows"
    )
    assert _head(ck, 12)[0]["format"] == checkpoint_rows.ROWS_FORMAT  # after one delta on step 4
    assert sorted(p.name for p in ck.iterdir() if p.name.endswith(".pt")) == [
        "step-000000012.pt",
        "step-000000016.pt",
    ]  # step 4 went with step 8, the last delta that needed it


# -- readers -------------------------------------------------------------------------------------------------
def test_a_delta_reads_as_a_full_copy_of_the_same_state(data, tmp_path):  # noqa: F811
    """Load (the disk store, the host-memory store), evaluate / predict and export of a delta equal those of a
    full checkpoint of the same step, saved by the same trainer in another directory (always a full copy)."""
    ds, placement, _ = data
    cold = tmp_path / "cold"
    cold.mkdir()
    tr = Trainer(
        _config(placement, cold, steps=10, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=5), ds
    )
    try:
        tr.fit()
        full = save_checkpoint(tr, tmp_path / "full" / "step-000000010.pt")
        want, _ = tr.predict(ds.split("val"), 0)
        arrays = tr.named_arrays()
    finally:
        tr.close()
    delta = tmp_path / "ck" / "step-000000010.pt"
    assert read_header(rows_path(delta))[0]["format"] == checkpoint_delta.DELTA_FORMAT
    assert read_header(rows_path(full))[0]["format"] == checkpoint_rows.ROWS_FORMAT
    assert rows_path(delta).stat().st_size < read_header(rows_path(full))[0]["rows"] * 36 / 2  # the table's
    for store in ("disk", "memory"):
        d = tmp_path / f"load-{store}"
        d.mkdir()
        tr = Trainer(_config(placement, d if store == "disk" else None, steps=10), ds)
        try:
            assert load_checkpoint(tr, delta) == 10
            assert_equal_arrays(arrays, tr.named_arrays())
        finally:
            tr.close()
    scorer = trainer_from_checkpoint(ds, delta, progress=False)
    try:
        got, _ = scorer.predict(ds.split("val"), 0)
        np.testing.assert_array_equal(want, got)
    finally:
        scorer.close()
    for fmt in ("torch-save", "dcp"):
        export_torchrec_dlrm(delta, tmp_path / f"d-{fmt}", format=fmt, chunk_bytes=4096)
        export_torchrec_dlrm(full, tmp_path / f"f-{fmt}", format=fmt, chunk_bytes=4096)
    a = torch.load(tmp_path / "d-torch-save", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "f-torch-save", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (tmp_path / "d-dcp").iterdir()) == sorted(
        p.name for p in (tmp_path / "f-dcp").iterdir()
    )
    for p in (tmp_path / "f-dcp").iterdir():
        if p.suffix == ".distcp":
            assert (tmp_path / "d-dcp" / p.name).read_bytes() == p.read_bytes(), p.name


# -- a missing or damaged base ----------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["missing", "flipped", "cut"])
def test_a_missing_or_damaged_base_is_refused_in_one_line_and_nothing_changes(data, tmp_path, damage, capsys):  # noqa: F811
    ds, placement, _ = data
    ck = _run(ds, placement, tmp_path, 8, 4)
    base = rows_path(ck / "step-000000004.pt")
    raw = base.read_bytes()
    if damage == "missing":
        base.unlink()
    elif damage == "flipped":
        base.write_bytes(raw[:-100] + bytes([raw[-100] ^ 0xFF]) + raw[-99:])
    else:
        base.write_bytes(raw[:-36])
    cold = tmp_path / "cold2"
    cold.mkdir()
    tr = Trainer(_config(placement, cold, steps=8), ds)
    try:
        before = tr.named_arrays()
        with pytest.raises(CheckpointError, match="delta on step-000000004.pt.rows") as e:
            load_checkpoint(tr, ck / "step-000000008.pt")
        assert "\n" not in str(e.value) and tr.step_count == 0
        assert_equal_arrays(before, tr.named_arrays())
    finally:
        tr.close()
    capsys.readouterr()
    assert main(resume_argv(ds, placement, tmp_path / "cold", ck)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and base.name in err[0]
    assert rows_path(ck / "step-000000008.pt").is_file()  # kept


# -- killed mid-delta ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("when", ["mid-copy", "after-copy"])
def test_killed_mid_delta_resumes_from_the_previous_delta(data, tmp_path, when, capsys):  # noqa: F811
    """A kill during step 12's delta (its rows half written under a temporary name, or complete without its
    checkpoint file): the resume loads step 8, itself a delta on step 4, and ends bit-identical to the
    straight run; its next checkpoints are deltas again, and load as that end."""
    ds, placement, _ = data
    ck = _run(ds, placement, tmp_path, 12, 4)
    left = killed_during(ck, 12, when)
    capsys.readouterr()
    resumed = fitted_arrays(
        ds, _config(placement, tmp_path / "cold", checkpoint_dir=str(ck), checkpoint_every=4, resume=True)
    )
    assert_equal_arrays(_device(ds), resumed)
    assert left.name in capsys.readouterr().err
    last = ck / "step-000000024.pt"  # written after the resume: a delta, the rows it holds right
    assert read_header(rows_path(last))[0]["format"] == checkpoint_delta.DELTA_FORMAT
    cold = tmp_path / "cold3"
    cold.mkdir()
    tr = Trainer(_config(placement, cold), ds)
    try:
        load_checkpoint(tr, last)
        assert_equal_arrays(resumed, tr.named_arrays())
    finally:
        tr.close()
