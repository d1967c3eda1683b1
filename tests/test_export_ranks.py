"""``hotline export`` of N-rank checkpoints, of a rows file read once, and ``--force`` over a sharded export:
the tables of a two-rank run (disk store or host memory) come out exactly, named by any rank's file or their
stem; the rows file is read once (its digest on the same pass); an export is replaced whole, the old one
kept under its name until the new one is complete."""

import numpy as np
import pytest
import torch

from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.training import checkpoint_delta, checkpoint_rows, export_sharded
from hotline.training.checkpoint_rows import rows_path
from hotline.training.export import export_torchrec_dlrm, load_torchrec_dlrm
from tests.test_checkpoint_rows import BATCH, CLI_ARCH, TABLES, data  # noqa: F401 -- data: a fixture
from tests.test_export_sharded import CHUNK, _disk_checkpoint, _placement, disk, killed_export  # noqa: F401 -- disk: a fixture


def _key(t: int) -> str:
    return export_sharded.table_key(f"t_cat_{t}")


def _export(capsys, *argv) -> tuple[int, list[str]]:
    code = main(["export", *argv])
    return code, capsys.readouterr().err.strip().splitlines()


def _assert_tables(out, arrays, what) -> dict:
    """The export in ``out`` loads into torchrec's DLRM with every table equal to ``arrays``' (``what``: named
    in a failure); its state dict."""
    state = load_torchrec_dlrm(out)[0].state_dict()
    for t in range(sum(k.startswith("embedding.table_") for k in arrays)):
        assert np.array_equal(state[_key(t)].numpy(), arrays[f"embedding.table_{t}"]), (what, t)
    return state


@pytest.fixture(scope="module")
def two_ranks(data, tmp_path_factory):  # noqa: F811 -- the fixture imported above
    """Two-rank runs' checkpoints (``--save``) on the disk store and in host memory, and their tables."""
    ds, placement, _ = data
    root = tmp_path_factory.mktemp("xranks")
    out = {}
    for store in ("disk", "memory"):
        extra = ["--cold-store", "disk", "--cold-dir", str(root / f"c-{store}")] if store == "disk" else []
        if extra:  # its step-10 checkpoint there: a delta on step 5's rows files
            extra += ["--checkpoint-dir", str(root / "ck-disk"), "--checkpoint-every", "5"]
        if extra:
            (root / f"c-{store}").mkdir()
        argv = [str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement, "--nproc", "2",
                "--optimizer", "rowwise-adagrad", "--learning-rate", "0.05", "--mini-batch-size", str(BATCH),
                "--no-progress", "--eval-max-samples", "64", "--num-batches", "10", *extra,
                "--save", str(root / f"{store}.pt"), "--dump-params", str(root / f"{store}.npz")]  # fmt: skip
        assert main(["train", *argv]) == 0
        out[store] = (root / f"{store}.pt", dict(np.load(root / f"{store}.npz")))
    return out


@pytest.mark.parametrize("store", ["disk", "memory"])
def test_a_two_rank_checkpoint_exports_exactly(two_ranks, store, tmp_path, capsys):
    """Named by its stem (``--save``'s path) or by one rank's file, in either format: every table equals the
    run's own (its hot rows' current values included, which a shard's stale copies would break)."""
    base, arrays = two_ranks[store]
    one_rank = base.with_name(f"{store}.rank001-of-002.pt")
    assert not base.exists() and rows_path(one_rank).is_file() == (store == "disk")
    for i, (name, fmt) in enumerate([(base, "dcp"), (one_rank, "torch-save")]):
        out = tmp_path / f"m{i}"
        code, err = _export(capsys, str(out), "--load", str(name), "--format", fmt)
        assert code == 0, err
        _assert_tables(out, arrays, fmt)


def test_a_two_rank_delta_checkpoint_exports_exactly(two_ranks, tmp_path, capsys):
    """Each rank's rows file a delta on its step-5 base: the export lays it over the base (both formats)."""
    base, arrays = two_ranks["disk"]
    ck = base.parent / "ck-disk" / "step-000000010"
    for r in range(2):
        head, _ = checkpoint_rows.read_header(rows_path(ck.with_name(f"{ck.name}.rank{r:03d}-of-002.pt")))
        assert head["format"] == checkpoint_delta.DELTA_FORMAT, r
    for fmt in ("dcp", "torch-save"):
        out = tmp_path / fmt
        code, err = _export(capsys, str(out), "--load", str(ck), "--format", fmt)
        assert code == 0, err
        _assert_tables(out, arrays, fmt)


def test_an_incomplete_two_rank_checkpoint_is_one_line_and_nothing_is_written(two_ranks, tmp_path, capsys):
    base, _ = two_ranks["disk"]
    ck = tmp_path / "ck"
    ck.mkdir()
    for p in base.parent.glob("disk.rank000-of-002.pt*"):
        (ck / p.name).write_bytes(p.read_bytes())
    code, err = _export(capsys, str(tmp_path / "out"), "--load", str(ck / "disk.pt"), "--format", "dcp")
    assert code == 2 and len(err) == 1 and "disk.rank001-of-002.pt is missing" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_rank_files_of_two_checkpoints_are_one_line(two_ranks, tmp_path, capsys):
    """Rank 0 of the disk-store run beside rank 1 of the memory-store run, under one name: refused, one line."""
    ck = tmp_path / "ck"
    ck.mkdir()
    disk_base, memory_base = two_ranks["disk"][0], two_ranks["memory"][0]
    for src, r in ((disk_base, 0), (memory_base, 1)):
        for p in src.parent.glob(f"{src.stem}.rank{r:03d}-of-002.pt*"):
            (ck / p.name.replace(src.stem, "mixed")).write_bytes(p.read_bytes())
    code, err = _export(capsys, str(tmp_path / "out"), "--load", str(ck / "mixed.pt"), "--format", "dcp")
    assert code == 2 and len(err) == 1 and "not one checkpoint" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def _io_bytes() -> tuple[int, int]:
    """Bytes this process has read and written through system calls so far (``rchar``, ``wchar``: page-cache
    hits included)."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(":") for line in f)
    return int(fields["rchar"]), int(fields["wchar"])


def _traffic(ck, out, **kwargs) -> tuple[int, int]:
    """The bytes read and written by an export of ``ck`` to ``out``."""
    before = _io_bytes()
    export_torchrec_dlrm(ck, out, format="dcp", **kwargs)
    return tuple(b - a for a, b in zip(before, _io_bytes()))


@pytest.mark.parametrize("lazy", [True, False])
def test_the_rows_file_is_read_once_and_the_tables_written_once(tmp_path, monkeypatch, lazy):
    """The export reads the rows file once, its sha256 on the same pass (only the bitmap and the order region
    twice: the plan's pass feeds them to the digest), and writes the tables once: no scratch copy. A second whole
    read (a digest pass first), a third pass over the order or a scratch copy of the rows fails here. Rows read
    before their chunk's window are held in memory (the hold made to cover them here); with no hold each is
    written and read once more, and it is still exact. Lazy: most rows never written, drawn, not read; eager:
    every record in the file."""
    from hotline.tiers import initial_fill

    if not lazy:
        monkeypatch.setattr(initial_fill, "lazy_fill", initial_fill.fill_file)
    tables = [100_000] * 4
    ds = Dataset(generate(tmp_path / "d", 300, seed=2, table_sizes=tables, progress=False))
    ck, arrays = _disk_checkpoint(ds, _placement(ds, tmp_path / "p.npz", 0.001), tmp_path, steps=2)
    rows = rows_path(ck).stat().st_size
    export_torchrec_dlrm(ck, tmp_path / "warm", format="dcp")  # the imports' own reads, once
    chunk = 256 << 10  # many chunks and windows: rows early by a window, the head's early by many
    # the early rows (a chunk's rows read in the window before its last; the head's counted rows that are not
    # hot): held in memory where the hold covers them, else written and read once more
    from hotline.training import export_rows
    from hotline.training.inference import checkpoint_payload

    p = checkpoint_payload(ck)
    source = export_rows.StreamedRows([(ck, p["rows"])], tables, p["hot"], tmp_path / "x", chunk)
    early, spilled = source.early_rows, source.early_rows * (4 * 8 + 4)  # weights, place in the chunk
    source.close()
    monkeypatch.setattr(export_rows, "HOLD_CHUNKS", spilled // chunk + 1)
    read, written = _traffic(ck, tmp_path / "m", chunk_bytes=chunk)
    n = sum(tables)
    twice, table_bytes = 4 * n + n // 8, 4 * 8 * n  # the order and the bitmap
    allowance = ck.stat().st_size + (1 << 20)  # the checkpoint's file, small files: under another order pass
    assert rows + twice <= read < rows + twice + allowance, (read, rows, allowance)
    if not lazy:
        assert rows > allowance + 2 * twice  # a second pass over the records would not fit
    assert twice > allowance - ck.stat().st_size  # nor a third pass over the order
    assert table_bytes <= written < table_bytes + (1 << 20), (written, table_bytes)
    _assert_tables(tmp_path / "m", arrays, "streamed")
    monkeypatch.setattr(export_rows, "HOLD_CHUNKS", 0)  # none held: exact all the same
    read_s, written_s = _traffic(ck, tmp_path / "s", chunk_bytes=chunk)
    _assert_tables(tmp_path / "s", arrays, "spilled")
    assert 0 < early < n and written_s - written == spilled, (early, written_s - written)
    assert abs(read_s - read - spilled) < 4096, (read_s - read, spilled)  # (small files' names vary)


def test_force_replaces_an_export_whole_and_a_killed_one_keeps_the_old(disk, tmp_path, capsys):  # noqa: F811
    """``--force`` over a sharded export: refused without it (one line, kept); a replacement killed mid-write
    leaves the old export whole under its name; a complete one replaces it, nothing of the old left."""
    _, ck, arrays = disk
    out = tmp_path / "m"
    export_torchrec_dlrm(ck, out, format="dcp", chunk_bytes=CHUNK)
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    code, err = _export(capsys, str(out), "--load", str(ck), "--format", "dcp")
    assert code == 2 and len(err) == 1 and "--force" in err[0], err
    proc = killed_export(
        "from hotline.cli import main\n"
        f"main(['export', {str(out)!r}, '--load', {str(ck)!r}, '--format', 'dcp', '--force'])\n"
    )
    assert proc.returncode == -9, proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old
    # a torch-save over it is refused; then the replacement, complete
    code, err = _export(capsys, str(out), "--load", str(ck), "--format", "torch-save", "--force")
    assert code == 2 and len(err) == 1 and "--format dcp" in err[0], err
    next(out.glob("*.distcp")).unlink()  # the old one damaged: the new one must not be built on it
    code, err = _export(capsys, str(out), "--load", str(ck), "--force")
    assert code == 0, err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["m"] or all(n == "m" or n.endswith(".hotline-lock") for n in left), left
    state = _assert_tables(out, arrays, "replaced")
    assert torch.equal(state[_key(0)], torch.from_numpy(arrays["embedding.table_0"]))
