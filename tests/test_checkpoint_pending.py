"""A disk-store checkpoint's rows file names the rows never written (lazy initialization's pending rows) by a
bit each and holds only the others' records (``hotline.training.checkpoint_rows``): its size is those records,
the bitmap and the order; every reader draws the pending rows back exactly; a file of the first format (every
record drawn into it) still loads and exports; a seed that does not draw the store's rows writes every record.
Loaded into a lazily initialized store of the same seed, the rows never written stay pending and only the
records held are written (a full file, a delta on one)."""

import contextlib
import hashlib
import json
import struct

import numpy as np
import pytest
import torch
from arrays import assert_equal_arrays

from hotline import Trainer
from hotline._io import write_with_digest
from hotline.tiers.position_bits import PositionBits
from hotline.training import checkpoint_rows
from hotline.training.checkpoint import load_checkpoint, save_checkpoint
from hotline.training.checkpoint_rows import read_header, read_tables, rows_path
from hotline.training.export import export_torchrec_dlrm
from tests.test_checkpoint_rows import _config, data  # noqa: F401 -- data: a fixture
from tests.test_export_ranks import _assert_tables

SEED = 0  # TrainConfig's default: the seed the store's rows were drawn from


def _state(n: int):
    return (n, 1)  # row-wise Adagrad: a float a row


@contextlib.contextmanager
def _fresh(ds, placement, cold, **kw):
    """A Trainer on a new disk store at ``cold`` (``_config``'s fields ``kw``), closed after the block."""
    cold.mkdir()
    tr = Trainer(_config(placement, cold, **kw), ds)
    try:
        yield tr
    finally:
        tr.close()


def _resumes(ds, placement, cold, ck, arrays, steps, **kw):
    """A new store at ``cold`` resumes ``ck`` at step ``steps`` with the run's ``arrays``, bit for bit."""
    with _fresh(ds, placement, cold, steps=steps, **kw) as tr:
        assert load_checkpoint(tr, ck) == steps
        assert_equal_arrays(arrays, tr.named_arrays())


def _run(ds, placement, tmp_path, steps=6, also=None):
    """A lazily initialized disk-store run (with a DRAM tier), its checkpoint, its arrays, the rows pending at
    the save and the store's file as its own reads give it, by row (weights, state); ``also(trainer)`` run
    before it closes."""
    cold = tmp_path / "cold"
    cold.mkdir()
    tr = Trainer(_config(placement, cold, steps=steps, cold_cache=4096), ds)
    try:
        tr.fit()
        ck = save_checkpoint(tr, tmp_path / "ck" / f"step-{steps:09d}.pt")
        f = tr.mode.cold.host.file
        pending = f.pending.count()
        n, D = f.num_rows, tr.config.embedding_dim
        w, s = np.empty((n, D), np.float32), np.empty((n, 1), np.float32)
        for rows, rec in f.read_all():  # the DRAM tier and pending_rows' own draws
            w[rows], s[rows] = rec[:, :D], rec[:, D:]
        if also is not None:
            also(tr)
        return ck, tr.named_arrays(), pending, (w, s.reshape(-1))
    finally:
        tr.close()


def test_the_rows_file_holds_the_written_rows_and_reads_as_the_store(data, tmp_path):  # noqa: F811
    ds, placement, _ = data
    ck, _, pending, (w, s) = _run(ds, placement, tmp_path)
    head, start = read_header(rows_path(ck))
    n = head["rows"]
    assert head["format"] == checkpoint_rows.ROWS_FORMAT and head["initial"]["seed"] == SEED
    assert 0 < pending < n and head["held"] == n - pending
    bits = -(-n // 8)
    size = start + bits + (-bits % 4096) + 4 * n + head["held"] * 36  # bitmap, order, the records held
    assert rows_path(ck).stat().st_size == size
    got_w, got_s = read_tables(ck, lambda m: (m,))
    assert np.array_equal(got_w, w) and np.array_equal(got_s, s)


def _as_first_format(ck) -> None:
    """Rewrites the rows file of ``ck`` in the first format (every record drawn into it, then the order) and
    the checkpoint's record of it, as an older Hotline wrote them."""
    path = rows_path(ck)
    head, start = read_header(path)
    order, records = [], []
    for o, rec in checkpoint_rows._rows_file_chunks(path, head, start, 1000):
        order.append(o)
        records.append(rec)
    old = {k: v for k, v in head.items() if k not in ("initial", "held")} | {
        "format": checkpoint_rows.ROWS_FORMAT_1
    }
    raw = json.dumps(old, sort_keys=True).encode()
    raw = checkpoint_rows.MAGIC + struct.pack("<Q", len(raw)) + raw
    raw += b"\0" * (-len(raw) % 4096)
    body = np.concatenate(records).tobytes() + np.concatenate(order).astype(head["order_dtype"]).tobytes()
    path.write_bytes(raw + body)
    payload = torch.load(ck, weights_only=True)
    payload["rows"] = payload["rows"] | {"bytes": path.stat().st_size,
                                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}  # fmt: skip
    write_with_digest(ck, lambda f: torch.save(payload, f))


def test_a_rows_file_of_the_first_format_still_loads_and_exports(data, tmp_path):  # noqa: F811
    ds, placement, _ = data
    ck, arrays, _, (w, s) = _run(ds, placement, tmp_path)
    _as_first_format(ck)
    assert read_header(rows_path(ck))[0]["format"] == checkpoint_rows.ROWS_FORMAT_1
    got_w, got_s = read_tables(ck, lambda m: (m,))
    assert np.array_equal(got_w, w) and np.array_equal(got_s, s)
    _resumes(ds, placement, tmp_path / "cold2", ck, arrays, steps=6, cold_cache=4096)
    export_torchrec_dlrm(ck, tmp_path / "out", format="dcp")
    _assert_tables(tmp_path / "out", arrays, "first format")


def test_a_seed_that_does_not_draw_the_stores_rows_writes_every_record(data, tmp_path):  # noqa: F811
    """The seed checked against the store's own draws: another (or none) and the file holds every record, drawn
    into it, and reads the same."""
    ds, placement, _ = data

    def wrong_seed(tr):
        host = checkpoint_rows.disk_rows(tr.mode)
        assert checkpoint_rows.pending_of(host, SEED) is host.file.pending
        assert checkpoint_rows.pending_of(host, None) is None
        checkpoint_rows.write_rows(host, tmp_path / "other.pt", 6, {}, seed=SEED + 1)

    _run(ds, placement, tmp_path, also=wrong_seed)
    head, _ = read_header(rows_path(tmp_path / "other.pt"))
    assert head["initial"] is None and head["held"] == head["rows"]
    got = read_tables(tmp_path / "other.pt", lambda m: (m,))
    want = read_tables(tmp_path / "ck" / "step-000000006.pt", lambda m: (m,))
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_damaged_bitmap_is_one_line_and_nothing_is_written(data, tmp_path, capsys):  # noqa: F811
    """A bit flipped in the bitmap shifts every record after it: the export says the rows file is corrupt in
    one line (its sha256), before its directory is put under its name."""
    from hotline.cli import main

    ds, placement, _ = data
    ck, *_ = _run(ds, placement, tmp_path)
    capsys.readouterr()
    path = rows_path(ck)
    head, start = read_header(path)
    raw = bytearray(path.read_bytes())
    raw[start] ^= 1  # position 0's bit
    path.write_bytes(bytes(raw))
    code = main(["export", str(tmp_path / "out"), "--load", str(ck), "--format", "dcp"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and path.name in err[0] and "corrupt" in err[0], err
    assert not (tmp_path / "out").exists()


def _read_store(f, D):
    n = f.num_rows
    w, s = np.empty((n, D), np.float32), np.empty((n, 1), np.float32)
    for rows, rec in f.read_all():
        w[rows], s[rows] = rec[:, :D], rec[:, D:]
    return w, s.reshape(-1)


@pytest.mark.parametrize(
    "chunk_bytes, tier", [(None, False), (36 * 1001, False), (36 * 1001, True)]
)  # one chunk; chunks off the bitmap's bytes; the DRAM tier read before the load (its rows go to it)
def test_a_load_into_a_lazy_store_writes_the_written_rows_alone(data, tmp_path, chunk_bytes, tier):  # noqa: F811
    """Loaded into a lazily initialized store of the same seed, tables and order, the rows file's rows never
    written stay pending (the store's bits are the file's bitmap, its pending count the file's) and the load
    writes the records held alone (RowFile.bytes_written; those of the DRAM tier's positions into it, when
    it is read already); the store then reads as the checkpointed one, and a resume from it is
    bit-identical."""
    ds, placement, _ = data
    ck, arrays, pending, (w, s) = _run(ds, placement, tmp_path)
    path = rows_path(ck)
    head, start = read_header(path)
    n = head["rows"]
    bitmap = np.fromfile(path, np.uint8, -(-n // 8), offset=start)
    with _fresh(ds, placement, tmp_path / "cold2", steps=6, cold_cache=4096) as tr:
        host = checkpoint_rows.disk_rows(tr.mode)
        f = host.file
        assert f.pending.count() == n and not f._cache_loaded  # nothing written, the DRAM tier not read yet
        if tier:
            f._load_cache()
            written = ~np.unpackbits(bitmap, bitorder="little")[: f.cache_rows].astype(bool)
            assert written.any()  # the load puts records into the tier
        before = f.bytes_written
        checkpoint_rows.load_rows(host, ck, chunk_bytes=chunk_bytes)
        assert f.pending.count() == pending == n - head["held"]
        assert np.array_equal(f.pending.bits, bitmap)
        if not tier:
            assert f.bytes_written - before == head["held"] * f.record
        got_w, got_s = _read_store(f, tr.config.embedding_dim)
        assert np.array_equal(got_w, w) and np.array_equal(got_s, s)
    _resumes(ds, placement, tmp_path / "cold3", ck, arrays, steps=6, cold_cache=4096)


def test_a_seed_other_than_the_stores_draws_and_writes_every_row(data, tmp_path):  # noqa: F811
    """A rows file whose rows never written are drawn from another seed than the store's own: the load draws
    them and writes every record (none left pending), and the store reads as the file."""
    ds, placement, _ = data
    ck, *_ = _run(ds, placement, tmp_path)
    path = rows_path(ck)
    head, start = read_header(path)
    with _fresh(ds, placement, tmp_path / "cold2", steps=6, cold_cache=4096, seed=SEED + 1) as tr:
        host = checkpoint_rows.disk_rows(tr.mode)
        assert checkpoint_rows.loads_lazily(host, head) is None
        before = host.file.bytes_written
        checkpoint_rows.load_rows(host, ck)
        assert host.file.pending.count() == 0
        assert host.file.bytes_written - before == head["rows"] * host.file.record
        want = read_tables(ck, lambda m: (m,))
        got = _read_store(host.file, tr.config.embedding_dim)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("n", [1, 7, 8, 13, 45])
def test_put_range_sets_the_bits_of_a_range_to_a_mask(n):
    rng = np.random.default_rng(n)
    for lo in range(n):
        for hi in range(lo, n + 1):
            bits = PositionBits(n, fill=bool(rng.integers(2)))
            twin = bits.range_mask(0, n)
            mask = rng.integers(0, 2, hi - lo).astype(bool)
            bits.put_range(lo, mask)
            twin[lo:hi] = mask
            assert np.array_equal(bits.bits, np.packbits(twin, bitorder="little"))


def test_a_delta_loads_into_a_lazy_store_by_its_base_bitmap_and_its_records(data, tmp_path):  # noqa: F811
    """A delta on a full rows file: the rows never written by the delta's step stay pending (the base's bitmap
    less the rows the delta holds), the records written are those held, and the store reads as the delta."""
    ds, placement, _ = data
    cold = tmp_path / "cold"
    cold.mkdir()
    ck_dir = tmp_path / "ck"
    tr = Trainer(_config(placement, cold, steps=10, checkpoint_dir=str(ck_dir), checkpoint_every=5), ds)
    try:
        tr.fit()
        arrays = tr.named_arrays()
        f = tr.mode.cold.host.file
        pending = f.pending.count()
        w, s = _read_store(f, tr.config.embedding_dim)
    finally:
        tr.close()
    ck = ck_dir / "step-000000010.pt"
    head, _ = read_header(rows_path(ck))
    base, _ = read_header(rows_path(ck_dir / "step-000000005.pt"))
    assert head["format"] == checkpoint_rows.checkpoint_delta.DELTA_FORMAT
    assert 0 < pending < base["rows"] - base["held"]  # the delta wrote rows the base has pending
    with _fresh(ds, placement, tmp_path / "cold2", steps=10) as tr:
        host = checkpoint_rows.disk_rows(tr.mode)
        before = host.file.bytes_written
        checkpoint_rows.load_rows(host, ck, chunk_bytes=36 * 1001)
        assert host.file.pending.count() == pending
        assert host.file.bytes_written - before == (head["rows"] - pending) * host.file.record
        got_w, got_s = _read_store(host.file, tr.config.embedding_dim)
        assert np.array_equal(got_w, w) and np.array_equal(got_s, s)
    _resumes(ds, placement, tmp_path / "cold3", ck, arrays, steps=10)
