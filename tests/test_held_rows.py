"""Held writes of the disk store (``hotline.tiers.held_rows``): a step's written records kept in memory and swept
to the file in file order. The kernels against their numpy twins; a file with held writes reads and ends as the
file written in place, byte for byte; reads beside sweeps on another thread never see a value older than the
last write before them; runs with a write buffer small enough to sweep every few steps equal the in-place
runs and the host-memory store bit for bit (look-ahead 0-4, a DRAM tier, 2 ranks), and resume bit-identically
from a checkpoint taken with writes held."""

import threading

import numpy as np
import pytest
from arrays import assert_equal_arrays, assert_equal_runs
from ranks import spawn, train_and_dump
from small_data import hot_placement, zipf_dataset

import hotline.tiers.initial_fill as fill_mod
from hotline import TrainConfig, Trainer
from hotline.kernels.held_rows import EMPTY, insert, new_table, overlay, overlay_twin, sized
from hotline.tiers.disk_file import RowFile
from hotline.tiers.held_rows import write_buffer_bytes
from hotline.tiers.store_files import PAGE
from hotline.training.checkpoint import save_checkpoint
from hotline.training.preflight import memory_needed

TABLES = [3000, 20000, 12, 5000, 600, 5, 900, 40]
BATCH, STEPS = 64, 16
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}
SMALL = 12 << 10  # a write buffer of a few hundred records: a sweep every step or two


# -- the kernels --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_the_table_finds_what_was_inserted_as_a_dict_does(seed):
    rng = np.random.default_rng(seed)
    size, cap = sized(int(rng.integers(2_000, 200_000)), 36)
    keys, slots = new_table(size)
    held, count = {}, 0
    while True:
        pos = np.unique(rng.integers(0, 10**9 if seed % 2 else 5 * cap, int(rng.integers(1, 300))))
        if count + pos.shape[0] > cap:
            break
        got, count = insert(keys, slots, pos, count)
        for p in pos.tolist():
            held.setdefault(p, len(held))
        assert got.tolist() == [held[p] for p in pos.tolist()] and count == len(held)
    known = rng.permutation(np.array(list(held), np.int64))
    again, same = insert(keys, slots, known, count)  # found again: their slots, none added
    assert same == count and again.tolist() == [held[p] for p in known.tolist()]
    assert sorted(keys[keys != EMPTY].tolist()) == sorted(held) and count <= 0.75 * size


@pytest.mark.parametrize("record", [12, 36, 132, 4096, 5000])
def test_the_overlay_lays_every_byte_of_the_held_records_on_the_pages_read(record):
    rng = np.random.default_rng(record)
    n = 40 * PAGE // record + 3
    num_pages = -(-n * record // PAGE)
    keys, slots = new_table(1024)
    pos = np.unique(rng.integers(0, n, min(300, n // 2)))
    slot, _ = insert(keys, slots, pos, 0)
    records = rng.integers(0, 256, (pos.shape[0], record), dtype=np.uint8)
    pages = np.sort(rng.choice(num_pages, num_pages // 2, replace=False)).astype(np.int64)
    at = rng.permutation(pages.shape[0]).astype(np.int64)  # pages anywhere in the buffer
    read = rng.integers(0, 256, pages.shape[0] * PAGE, dtype=np.uint8)

    def bits(marked_pos):  # the held positions' bitmap, as HeldRows.put sets it
        out = np.zeros(-(-n // 8), np.uint8)
        np.bitwise_or.at(out, marked_pos >> 3, np.left_shift(1, marked_pos & 7).astype(np.uint8))
        return out

    held = dict(zip(pos.tolist(), slot.tolist()))
    half = {k: held[k] for k in pos[::2].tolist()}
    every = np.full(-(-n // 8), 0xFF, np.uint8)
    for marked, shown in [(bits(pos), held), (every, held), (bits(pos[::2]), half)]:
        a, b = read.copy(), read.copy()  # only the marked positions are probed: unmarked ones stay as read
        laid = overlay(pages, at, a, record, n, keys, slots, records, marked)
        overlay_twin(pages, at, b, record, n, shown, records)
        assert np.array_equal(a, b) and laid > 0
    c = read.copy()  # nothing marked: every page left as read
    assert overlay(pages, at, c, record, n, keys, slots, records, np.zeros(-(-n // 8), np.uint8)) == 0
    assert np.array_equal(c, read)


# -- a file -------------------------------------------------------------------------------------------------
def _steps(rows, floats, seed, steps=120):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = np.unique(rng.integers(0, rows, int(rng.integers(1, 900))))
        yield ids, rng.standard_normal((ids.shape[0], floats)).astype(np.float32)


@pytest.mark.parametrize("dim, cache", [(8, 0), (3, 2_000), (33, 0)])
def test_a_file_with_held_writes_reads_and_ends_as_the_file_written_in_place(tmp_path, dim, cache):
    rows, floats = 20_000, dim + 1
    order = np.random.default_rng(1).permutation(rows)
    first = np.random.default_rng(2).standard_normal((rows, floats)).astype(np.float32)
    files = [RowFile(tmp_path / f"{k}.rows", rows, dim, 1, order, cache_bytes=cache * 4 * floats,
                     held_bytes=h) for k, h in (("place", 0), ("held", 2000 * (4 * floats + 32)))]  # fmt: skip
    place, held = files
    ref = first.copy()
    try:
        for f in files:
            f.put_rows(np.arange(rows), first)
        calls = [0, 0]
        for ids, new in _steps(rows, floats, dim):
            got = [f.read_rows(ids)[0] for f in files]
            assert np.array_equal(got[0], ref[ids]) and np.array_equal(got[1], ref[ids])
            for i, f in enumerate(files):
                calls[i] += f.write_rows(ids, new)
            ref[ids] = new
        assert held.held.sweeps > 3 and held.held.count > 0  # swept many times, some held now
        assert calls[1] == 0 < calls[0]  # no page read or written by a held write: swept in order instead
        for rows_, recs in held.read_all():
            assert np.array_equal(recs, ref[rows_])
        for f in files:
            f.flush()
        assert held.held.count == 0
        data = rows * 4 * floats
        assert (
            np.fromfile(place.path, np.uint8, data).tobytes()
            == np.fromfile(held.path, np.uint8, data).tobytes()
        )
    finally:
        for f in files:
            f.close()


def test_reads_beside_sweeps_never_see_a_value_older_than_the_last_write_before_them(tmp_path):
    """A writer thread writes round k into every record of a set of rows spread over the file's pages, sweeping
    every round; the reader's records are each one round, never older than the rounds completed before its read
    began (a read a sweep's end overtook is read again) nor newer than the one under way."""
    rows, floats = 30_000, 9
    f = RowFile(tmp_path / "r.rows", rows, 8, 1, held_bytes=34_000)  # 489 records: a sweep a round
    ids = np.arange(0, rows, 97)
    f.put_rows(np.arange(rows), np.zeros((rows, floats), np.float32))
    done, stop, bad = [0], threading.Event(), []

    def writer():
        for k in range(1, 150):
            f.write_rows(ids, np.full((ids.shape[0], floats), k, np.float32))
            done[0] = k
        stop.set()

    t = threading.Thread(target=writer)
    t.start()
    reads = 0
    while not stop.is_set() or reads < 5:
        before = done[0]
        got = f.read_rows(ids)[0]
        after = done[0] + 1
        if not ((got == got[:, :1]).all() and (got[:, 0] >= before).all() and (got[:, 0] <= after).all()):
            bad.append((before, after, np.unique(got)))
        reads += 1
    t.join()
    f.close()
    assert not bad, bad[:3]
    assert f.held.sweeps > 20


def test_a_read_that_a_sweep_overtook_is_read_again(tmp_path, monkeypatch):
    """The sweep ends between a read of the file and the held records' overlay (the records gone, the read's bytes
    older): the read is made again, and sees the swept file."""
    rows, floats = 5_000, 9
    f = RowFile(tmp_path / "r.rows", rows, 8, 1, held_bytes=1 << 20)
    ids = np.arange(3, rows, 7)
    f.put_rows(np.arange(rows), np.zeros((rows, floats), np.float32))
    f.write_rows(ids, np.ones((ids.shape[0], floats), np.float32))
    assert f.held.count == ids.shape[0]
    real, armed, reads = RowFile._read_into, [True], []

    def read_then_sweep(self, out, start):
        real(self, out, start)
        reads.append(start)
        if armed.pop() if armed else False:
            self.held.sweep(self)  # its own reads of the file pass through here, unarmed

    monkeypatch.setattr(RowFile, "_read_into", read_then_sweep)
    try:
        got = f._read_positions(0, rows)
        assert f.held.sweeps == 1 and f.held.count == 0 and len(reads) >= 3  # read, the sweep's, read again
        assert np.array_equal(got[ids], np.ones((ids.shape[0], floats), np.float32))
        assert not got[np.setdiff1d(np.arange(rows), ids)].any()
    finally:
        monkeypatch.undo()
        f.close()


# -- runs ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("held")
    ds = zipf_dataset(root / "d", BATCH * STEPS * 7 // 6 + 200, 5, TABLES)
    return ds, hot_placement(ds, root / "p.npz", 1 / 50, BATCH * 4)


def _config(placement, cold=None, steps=STEPS, **kw):
    store = {"cold_store": "disk", "cold_dir": str(cold)} if cold is not None else {}
    return TrainConfig(mode="hotline", optimizer=kw.pop("optimizer", "rowwise-adagrad"), learning_rate=0.05,
                       mini_batch_size=BATCH, num_batches=steps, progress=False, placement_path=placement,
                       **ARCH, **store, **kw)  # fmt: skip


def _train(ds, cfg, checkpoint_at=None):
    tr = Trainer(cfg, ds)
    try:
        for _ in tr.progress(tr.batches()):
            pass
        host = tr.mode.cold.host if cfg.cold_store == "disk" else None
        held = None if host is None else host.file.held
        sweeps = None if held is None else (held.sweeps, held.count)
        ck = None if checkpoint_at is None else save_checkpoint(tr, checkpoint_at)
        return tr.named_arrays(), None if host is None else host.all(), sweeps, ck
    finally:
        tr.close()


@pytest.mark.parametrize(
    "optimizer, lookahead, cache", [("rowwise-adagrad", 2, 0), ("adam", 0, 0), ("adagrad", 4, 3000)]
)
def test_runs_with_held_writes_equal_the_in_place_runs_and_the_memory_store(data, tmp_path, optimizer,
                                                                            lookahead, cache):  # fmt: skip
    ds, placement = data
    kw = {"optimizer": optimizer, "lookahead": lookahead, "cold_cache": cache}
    mem = _train(ds, _config(placement, lookahead=lookahead, optimizer=optimizer))[0]
    runs = {}
    for name, buffer in (("place", 0), ("held", SMALL)):
        (tmp_path / name).mkdir()
        runs[name] = _train(ds, _config(placement, tmp_path / name, cold_write_buffer=buffer, **kw))
    assert_equal_arrays(mem, runs["held"][0])
    assert_equal_arrays(runs["place"][0], runs["held"][0])
    for a, b in zip(runs["place"][1], runs["held"][1]):
        assert np.array_equal(a, b)  # every row's weights and whole optimizer state
    assert runs["place"][2] is None and runs["held"][2][0] >= 3  # swept again and again


@pytest.mark.parametrize("fill", ["lazy", "eager"])  # rows read by their pages, or by spans of the file
def test_a_checkpoint_taken_with_writes_held_resumes_bit_identically(data, tmp_path, monkeypatch, fill):
    ds, placement = data
    if fill == "eager":
        monkeypatch.setattr(fill_mod, "lazy_fill", fill_mod.fill_file)
    straight = _train(ds, _config(placement, lookahead=2))[0]
    (tmp_path / "cold").mkdir()
    cfg = _config(
        placement, tmp_path / "cold", steps=9, lookahead=2, cold_write_buffer=SMALL, cold_cache=2000
    )
    *_, sweeps, ck = _train(ds, cfg, tmp_path / "ck" / "step-000000009.pt")
    assert sweeps[1] > 0  # records held when the checkpoint read the file
    tr = Trainer(_config(placement, tmp_path / "cold", lookahead=2, cold_write_buffer=SMALL,
                         checkpoint_dir=str(tmp_path / "ck"), resume=True), ds)  # fmt: skip
    try:
        tr.fit()
        assert_equal_arrays(straight, tr.named_arrays())
    finally:
        tr.close()


def test_two_ranks_with_held_writes_equal_the_memory_store(data, tmp_path):
    ds, placement = data
    (tmp_path / "cold").mkdir()
    runs = [("mem", None), ("disk", tmp_path / "cold")]
    jobs = [(_config(placement, cold, steps=10, lookahead=2, cold_write_buffer=SMALL if cold else "auto"),
             str(ds.path), str(tmp_path / f"{name}.npz")) for name, cold in runs]  # fmt: skip
    spawn(2, train_and_dump, jobs)
    assert_equal_runs(*(np.load(tmp_path / f"{name}.npz") for name, _ in runs))


def test_the_write_buffer_is_a_budget_the_preflight_counts(data, tmp_path):
    ds, placement = data
    auto = _config(placement, tmp_path)
    rows_bytes = sum(TABLES) * 36
    assert write_buffer_bytes(auto, sum(TABLES)) == rows_bytes // 8  # auto: an eighth of the rows, capped
    assert write_buffer_bytes(auto, 10**9) == 256 << 20  # 36 GB of rows: 3.7M records held pay for sweeps
    dim128 = TrainConfig(mode="hotline", optimizer="rowwise-adagrad", embedding_dim=128, bottom_mlp=[13, 128],
                         top_mlp=[32, 1], cold_store="disk", cold_dir=str(tmp_path))  # fmt: skip
    assert (
        write_buffer_bytes(dim128, 204_184_588) == 0
    )  # 105 GB of 516-byte records: in place (SWEEP_BREAK_EVEN)
    assert write_buffer_bytes(dim128, 10**6) == 10**6 * 516 // 8
    given = _config(placement, tmp_path, cold_write_buffer=1 << 20)
    none = _config(placement, tmp_path, cold_write_buffer=0)
    assert memory_needed(given, ds) - memory_needed(none, ds) == 1 << 20
    with pytest.raises(ValueError, match="--cold-write-buffer must be a size >= 0"):
        _config(placement, tmp_path, cold_write_buffer=-1)
