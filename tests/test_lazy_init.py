"""Lazy initialization of the disk store (``hotline.tiers.pending_rows``): rows never written are drawn when read,
not written at start-up. A lazily initialized run equals the eagerly filled one and the host-memory store bit for
bit (parameters, every row and its optimizer state), on one rank and on two; its checkpoints are the same bytes,
resume bit-identically, and predict, evaluate and export the same; the bitmap is a bit a row."""

import math

import numpy as np
import pytest
import torch
from arrays import assert_equal_arrays, assert_equal_runs
from ranks import spawn, train_and_dump
from small_data import hot_placement, zipf_dataset

import hotline.tiers.initial_fill as fill_mod
from hotline import TrainConfig, Trainer
from hotline.tiers.pending_rows import PendingRows
from hotline.tiers.store_files import PAGE, read_manifest
from hotline.training.checkpoint import save_checkpoint
from hotline.training.checkpoint_rows import read_tables
from hotline.training.export import export_torchrec_dlrm
from hotline.training.inference import trainer_from_checkpoint

TABLES = [3000, 20000, 12, 5000, 600, 5, 900, 40]  # most rows never looked up in a short run
BATCH, STEPS = 64, 16
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}


# -- the bitmap ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000])
def test_the_bitmap_is_a_bit_a_row_and_clears_what_is_written(n):
    p = PendingRows(np.arange(n)[::-1].copy(), [n], 3, 1, seed=2)
    assert p.nbytes == math.ceil(n / 8) and p.count() == n
    rng = np.random.default_rng(n)
    done = np.zeros(n, bool)
    for _ in range(4):
        lo = int(rng.integers(0, n))
        hi = int(rng.integers(lo, n + 1))
        p.clear_range(lo, hi)
        done[lo:hi] = True
        pos = rng.choice(n, min(n, 3), replace=False)
        p.clear(pos)
        done[pos] = True
        assert np.array_equal(p.mask(np.arange(n)), ~done) and p.count() == int((~done).sum())
        assert np.array_equal(p.range_mask(lo, n), ~done[lo:])


@pytest.mark.parametrize("record", [12, 36, 4096, 5000])
def test_a_page_is_blank_only_when_every_record_touching_it_is_pending(record):
    n = 3 * PAGE // record + 7
    pages = np.arange(-(-n * record // PAGE))
    for written in range(
        n
    ):  # one record written: the pages it touches (a straddling one's two) are not blank
        p = PendingRows(np.arange(n), [n], record // 4 - 1, 1, seed=0)
        p.clear(np.array([written]))
        touched = (pages * PAGE < (written + 1) * record) & ((pages + 1) * PAGE > written * record)
        assert p.whole_pages(pages, record).tolist() == (~touched).tolist(), written


@pytest.mark.parametrize("N, rank", [(1, 0), (3, 2)])
def test_the_drawn_records_are_the_initial_tables(N, rank):
    sizes = [50, 7, 300]
    whole = np.concatenate([fill_mod.initial_block(s, 5, 9, t, 0, s, 2) for t, s in enumerate(sizes)])
    local = np.arange(len(range(rank, sum(sizes), N)))
    p = PendingRows(local, sizes, 5, 2, seed=9, rank=rank, world_size=N)
    rows = np.random.default_rng(0).permutation(local)
    assert np.array_equal(p.records(rows), whole[rows * N + rank])
    hot = np.array([0, 356, 52, 49])
    assert np.array_equal(p.weights(hot), whole[hot, :5])


# -- runs ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lazy")
    ds = zipf_dataset(root / "d", BATCH * STEPS * 7 // 6 + 200, 5, TABLES)
    return ds, hot_placement(ds, root / "p.npz", 0.02, BATCH * 4)


def _config(placement, cold=None, steps=STEPS, **kw):
    store = {"cold_store": "disk", "cold_dir": str(cold)} if cold is not None else {}
    return TrainConfig(mode="hotline", optimizer=kw.pop("optimizer", "rowwise-adagrad"), learning_rate=0.05,
                       mini_batch_size=BATCH, num_batches=steps, progress=False, placement_path=placement,
                       print_freq=1, **ARCH, **store, **kw)  # fmt: skip


def _train(ds, cfg, checkpoint_at=None):
    """Named arrays, every row and its state of a disk store (None for memory), the summed step counters, the
    rows left pending and the zero-bytes check of the file, and the checkpoint written at the end."""
    tr = Trainer(cfg, ds)
    try:
        counters: dict = {}
        for s in tr.progress(tr.batches()):
            for k, v in s.counters.items():
                counters[k] = counters.get(k, 0.0) + v
        host = getattr(tr.mode.cold, "host", None)
        rows = None if cfg.cold_store != "disk" else host.all()
        pending = None if rows is None else host.file.pending
        left = None
        if pending is not None:
            assert pending.nbytes == math.ceil(host.num_rows / 8)
            pos = np.flatnonzero(pending.mask(np.arange(host.num_rows)))
            raw = np.fromfile(host.file.path, np.uint8, host.num_rows * host.file.record)
            held = raw.reshape(host.num_rows, -1)[pos]  # what the file holds at the pending positions
            left = (pos.shape[0], bool(held.any()))
        ck = None if checkpoint_at is None else save_checkpoint(tr, checkpoint_at)
        return tr.named_arrays(), rows, counters, left, ck
    finally:
        tr.close()


@pytest.mark.parametrize(
    "optimizer, lookahead, cache",
    [("rowwise-adagrad", 2, 0), ("adam", 0, 0), ("adagrad", 4, 3000), ("sgd", 1, 100_000)],
)
def test_a_lazy_run_equals_the_eager_run_and_the_memory_store(data, tmp_path, optimizer,
                                                             lookahead, cache):  # fmt: skip
    ds, placement = data
    kw = {"optimizer": optimizer, "lookahead": lookahead, "cold_cache": cache}
    mem = _train(ds, _config(placement, lookahead=lookahead, optimizer=optimizer))[0]
    (tmp_path / "lazy").mkdir()
    lazy, lazy_rows, counters, left, _ = _train(ds, _config(placement, tmp_path / "lazy", **kw))
    (tmp_path / "eager").mkdir()  # --no-cold-lazy: every row written at start-up
    eager, eager_rows, eager_counters, eager_left, _ = _train(
        ds, _config(placement, tmp_path / "eager", cold_lazy=False, **kw)
    )
    assert_equal_arrays(mem, lazy)
    assert_equal_arrays(eager, lazy)
    for a, b in zip(lazy_rows, eager_rows):
        assert np.array_equal(a, b)  # every row's weights and whole optimizer state
    pending, nonzero = left
    assert pending > sum(TABLES) // 2 and not nonzero  # most rows never written: the file holds zeros there
    assert eager_left is None and eager_counters.get("drawn_rows", 0) == 0
    if cache < 100_000:  # rows read from disk: their first reads drew instead
        assert 0 < counters["drawn_rows"] <= counters["disk_rows"]
        assert counters["disk_bytes_read"] < eager_counters["disk_bytes_read"]


def test_checkpoints_resume_and_readers_of_a_lazy_run_equal_the_eager_runs(data, tmp_path):
    """A checkpoint of a lazy run holds the same rows file, byte for byte, as the eager run's; resuming it equals
    the straight run; predict, evaluate and export of it equal the eager checkpoint's."""
    ds, placement = data
    straight = _train(ds, _config(placement, lookahead=2))[0]
    cks = {}
    for kind in ("lazy", "eager"):
        (tmp_path / kind).mkdir()
        cfg = _config(
            placement, tmp_path / kind, steps=8, lookahead=2, cold_cache=2000, cold_lazy=kind == "lazy"
        )
        *_, cks[kind] = _train(ds, cfg, tmp_path / f"ck-{kind}" / "step-000000008.pt")
        assert (read_manifest(tmp_path / kind / "hotline-cold-rows.bin").get("initial") == "lazy") == (
            kind == "lazy"
        )
    assert all(np.array_equal(*x) for x in zip(*(read_tables(cks[k], lambda n: (n, 1)) for k in cks)))
    tr = Trainer(_config(placement, tmp_path / "lazy", lookahead=2, checkpoint_dir=str(tmp_path / "ck-lazy"),
                         resume=True), ds)  # fmt: skip
    try:
        tr.fit()
        assert_equal_arrays(straight, tr.named_arrays())
        assert read_manifest(tr.mode.cold.file.path)["initial"] == "lazy"
    finally:
        tr.close()
    got = {}
    for kind, ck in cks.items():
        scorer = trainer_from_checkpoint(ds, ck, progress=False)
        try:
            got[kind] = scorer.predict(ds.split("val"), 0)[0], scorer.evaluate("val")
        finally:
            scorer.close()
        export_torchrec_dlrm(ck, tmp_path / f"x-{kind}", format="torch-save", chunk_bytes=4096)
    np.testing.assert_array_equal(got["lazy"][0], got["eager"][0])
    assert got["lazy"][1] == got["eager"][1]
    a = torch.load(tmp_path / "x-lazy", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "x-eager", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_ranks_lazy_equal_the_memory_store(data, tmp_path):
    """N = 2: each rank's file lazily initialized (rows ``r::2``): the same bits as the sharded memory store."""
    ds, placement = data
    (tmp_path / "cold").mkdir()
    runs = [("mem", None), ("disk", tmp_path / "cold")]
    jobs = [(_config(placement, cold, steps=10, lookahead=2), str(ds.path), str(tmp_path / f"{name}.npz"))
            for name, cold in runs]  # fmt: skip
    spawn(2, train_and_dump, jobs)
    assert_equal_runs(*(np.load(tmp_path / f"{name}.npz") for name, _ in runs))


# -- a page's write-back beside rows it did not read --------------------------------------------------------
def _lazy_file(tmp_path, n=2000, dim=8):
    from hotline.tiers.disk_file import RowFile

    f = RowFile(tmp_path / "rows.bin", n, dim, 1, np.arange(n), io_depth=2)
    f.pending = PendingRows(f.order, [n], dim, 1, seed=1)
    return f, f.pending.records(np.arange(n))


def test_a_write_back_keeps_the_rows_written_on_a_page_it_did_not_read(tmp_path):
    """A fetch of a pending row reads nothing of it; the page's other rows already written survive its
    write-back (the page is read first), and its never-written rows stay pending, reading as drawn."""
    f, initial = _lazy_file(tmp_path)
    try:
        x, p = np.array([5]), np.array([6])  # one page (36-byte records)
        f.write_rows(x, np.full((1, 9), 3.0, np.float32))
        got, pages = f.read_rows(p, track=True)
        assert np.array_equal(got, initial[p]) and pages.drawn_rows == 1 and f.bytes_read == 0
        assert pages.blank_pages == 0  # row 5 is on it: the write-back reads it first
        f.write_rows(p, np.full((1, 9), 4.0, np.float32), pages)
        back, _ = f.read_rows(np.arange(12))
        want = initial[:12].copy()
        want[5], want[6] = 3.0, 4.0
        assert np.array_equal(back, want)
    finally:
        f.close()


@pytest.mark.parametrize("track", [True, False])
def test_a_blank_page_written_by_another_step_is_read_before_the_write_back(tmp_path, track):
    """A fetch of pending rows alone leaves their page blank (not read); when an earlier step writes another
    row of that page before the fetch's write-back, the write-back keeps that row: the write copied its page
    into the tracked fetch's, or the untracked fetch's write-back reads the page first (its stamp is newer)."""
    f, initial = _lazy_file(tmp_path)
    try:
        got, pages = f.read_rows(np.array([300]), track=track)
        assert f.bytes_read == 0 and pages.pages_read == 0 and pages.blank_pages == 1  # nothing read
        assert np.array_equal(got, initial[[300]])
        f.write_rows(np.array([301]), np.full((1, 9), 5.0, np.float32))  # the earlier step, same page
        f.write_rows(np.array([300]), np.full((1, 9), 6.0, np.float32), pages)
        back, _ = f.read_rows(np.arange(290, 320))
        want = initial[290:320].copy()
        want[10], want[11] = 6.0, 5.0
        assert np.array_equal(back, want)
        assert f.pending.count() == 2000 - 2
    finally:
        f.close()


# -- the DRAM tier: pending slots drawn when first read, not at its load --------------------------------------
def _tier_file(tmp_path, n=3000, tier=1000):
    from hotline.tiers.disk_file import RowFile

    f = RowFile(tmp_path / "rows.bin", n, 8, 1, np.arange(n), io_depth=2, cache_bytes=tier * 36)
    f.pending = PendingRows(f.order, [n], 8, 1, seed=4)
    return f, f.pending.records(np.arange(n))


def test_tier_rows_first_read_steps_after_the_load_are_drawn_then(tmp_path):
    """The tier's load draws nothing (its pending slots stay zero); rows of the tier first read several writes
    later read as their initial records, those written as written, through read_rows, reread and read_all."""
    f, initial = _tier_file(tmp_path)
    try:
        want = initial.copy()
        rng = np.random.default_rng(3)
        for step in range(6):  # each step writes tier and disk rows; the tier's other rows stay unread
            rows = np.unique(rng.choice(np.r_[np.arange(0, 60), np.arange(2000, 2060)], 8))
            got, pages = f.read_rows(rows, track=True)
            assert np.array_equal(got, want[rows]), step
            assert np.array_equal(f.reread(rows, pages, np.arange(rows.shape[0])), want[rows]), step
            want[rows] = step + 1.0
            f.write_rows(rows, want[rows], pages)
        untouched = np.flatnonzero(f.pending.mask(np.arange(1000)))
        assert untouched.shape[0] > 900 and not f.cache[untouched].any()  # not drawn at the load
        late = np.array([999, 500, 61, 2999])  # first read now
        assert np.array_equal(f.read_rows(late)[0], want[late])
        assert np.array_equal(np.concatenate([r for _, r in f.read_all(chunk_rows=700)]), want)
    finally:
        f.close()


def test_a_flush_of_a_tier_with_untouched_pending_slots_keeps_them_pending(tmp_path):
    """A flush writes the tier's written rows and leaves its untouched slots pending (zeros in the file), so the
    file reads, and a checkpoint streams, the eager file's values."""
    f, initial = _tier_file(tmp_path)
    try:
        want = initial.copy()
        rows = np.array([3, 4, 700, 1500])
        f.read_rows(rows)
        want[rows] = 2.0
        f.write_rows(rows, want[rows])
        f.flush()
        assert f.pending.count() == 3000 - 4
        raw = np.fromfile(f.path, np.float32, 3000 * 9).reshape(3000, 9)
        assert np.array_equal(raw[rows], want[rows]) and not np.delete(raw, rows, axis=0).any()
        assert np.array_equal(np.concatenate([r for _, r in f.read_all()]), want)
        assert np.array_equal(f.read_rows(np.arange(3000))[0], want)
    finally:
        f.close()


@pytest.mark.parametrize("written", [[1, 1500, 2999], list(range(0, 3000, 2))])
def test_a_bulk_pass_reads_the_pages_of_the_written_rows_or_their_span(tmp_path, written):
    """read_all of a file with few rows written far apart reads only their pages (on the I/O threads), with
    many the span between them: the same records either way, pending ones drawn."""
    f, initial = _tier_file(tmp_path, tier=0)
    try:
        want = initial.copy()
        rows = np.array(written)
        want[rows] = 9.0
        f.write_rows(rows, want[rows])
        before = f.bytes_read
        assert np.array_equal(np.concatenate([r for _, r in f.read_all()]), want)
        assert (f.bytes_read - before > 0) == (len(written) == 3)  # the page reads counted, a span read not
    finally:
        f.close()
