"""The disk cold store (``--cold-store disk``): its file, exactness against device mode and the host-memory
store for every optimizer (records of the row and its whole optimizer state), checkpoints and crashes,
re-placement, N ranks, and the errors a user can cause."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.distributed.launcher import spawn, train_and_dump
from hotline.models.dlrm import init_embedding_table
from hotline.placement import Placement
from hotline.profiling.costmodel import STEP_FORMAT
from hotline.table_layout import OPTIMIZERS, bytes_per_row, state_floats_per_row
from hotline.tiers.disk_file import PAGE, RowFile, pages_per_record
from hotline.tiers.disk_store import cold_file, popularity_order, table_chunks
from hotline.tiers.store_files import made_by_hotline, manifest_path, order_path
from hotline.training.checkpoint_dir import CheckpointManager

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
BATCH, STEPS = 64, 24
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]}
CLI_ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-32-8", "--arch-mlp-top", "32-1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk")
    ds = Dataset(generate(root / "d", BATCH * STEPS * 7 // 6 + 200, seed=3, table_sizes=TABLES, zipf=1.3,
                          progress=False))  # fmt: skip
    sp = ds.train.sparse[: BATCH * 8]
    hot = [
        np.argsort(-np.bincount(sp[:, t].reshape(-1), minlength=n), kind="stable")[: max(1, int(n * 0.4))]
        for t, n in enumerate(ds.table_sizes)
    ]
    placement = root / "p.npz"
    Placement.from_hot_ids(ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8).save(
        placement
    )
    return ds, str(placement)


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


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


_device: dict = {}


def _device_run(ds, optimizer):
    if optimizer not in _device:
        _device[optimizer] = _run(ds, _config("device", None, None, optimizer, disk=False))[0]
    return _device[optimizer]


# -- the file ---------------------------------------------------------------------------------------------
def test_table_chunks_are_the_initial_table():
    for chunk in (1, 7, 100, 1000):
        got = np.concatenate([w for _, w in table_chunks(333, 5, 11, 2, chunk)])
        assert np.array_equal(got, init_embedding_table(333, 5, 11, 2))


def test_popularity_order():
    counts = np.array([0, 5, 1, 0, 5, 9, 0])
    order = popularity_order(counts, 7, last=np.array([5]))
    assert order.tolist() == [1, 4, 2, 0, 3, 6, 5]  # by count (ties by id), never counted, then the hot rows


def _model_file(tmp_path, n: int, dim: int, state: int, cache: int, rng, io_depth: int):
    """A RowFile of ``n`` random records in a random order, and the numpy model of its rows."""
    f = RowFile(
        tmp_path / "rows.bin", n, dim, state, rng.permutation(n), io_depth=io_depth, cache_bytes=cache
    )
    model = rng.standard_normal((n, dim + state)).astype(np.float32)
    f.put_rows(np.arange(n), model)
    f.flush()
    return f, model


@pytest.mark.parametrize(
    "dim,state,cache",
    [(16, 1, 0), (8, 0, 0), (16, 1, 3000), (1100, 1, 0), (8, 17, 0), (16, 16, 3000), (600, 1201, 0)],
)  # (8, 17): Adam at dim 8, 100-byte records across page boundaries; (600, 1201): Adam records of 3 pages
def test_row_file_reads_and_writes_rows(tmp_path, dim, state, cache):
    """Random rows (records straddling pages; duplicates in a read) read and written in place, through the
    DRAM tier or not, equal a numpy model of the rows; rows that share a page are read by one call."""
    n, rng = 3000, np.random.default_rng(0)
    f, model = _model_file(tmp_path, n, dim, state, cache, rng, io_depth=4)
    order = f.order
    try:
        for _ in range(20):
            rows = rng.choice(n, size=rng.integers(1, 400), replace=False)
            got, pages = f.read_rows(np.concatenate([rows, rows[:3]]))
            assert np.array_equal(got[: rows.shape[0]], model[rows]) and np.array_equal(
                got[rows.shape[0] :], model[rows[:3]]
            )  # the repeated rows (fewer than 3 when rows has fewer)
            new = rng.standard_normal((rows.shape[0], dim + state)).astype(np.float32)
            f.write_rows(rows, new)
            model[rows] = new
        every = np.concatenate([recs for _, recs in f.read_all(chunk_rows=999)])
        assert np.array_equal(every, model[f.order])
        # One page's rows (the file is in ``order``): one read.
        per_page = PAGE // f.record
        if per_page >= 2:
            rows = order[cache // f.record + per_page * 3 : cache // f.record + per_page * 3 + per_page // 2]
            _, pages = f.read_rows(rows)
            assert pages.reads == 1 and pages.pages.shape[0] <= 2
    finally:
        f.close()
    assert made_by_hotline(tmp_path / "rows.bin") and order_path(tmp_path / "rows.bin").is_file()
    assert np.array_equal(np.load(order_path(tmp_path / "rows.bin")), order)


def test_the_header_records_the_optimizer_and_refuses_a_file_made_for_another(tmp_path):
    """The manifest (the file's header) records the record: rows, dim, the optimizer and its state floats,
    the record's bytes. RowFile.open takes the file as it stands (its rows, its order, its DRAM tier's rows
    read back) and refuses, with one line, a file made for another optimizer or dim, or cut short."""
    import json

    path, dim, n = tmp_path / "rows.bin", 8, 700
    S = state_floats_per_row("adam", dim)
    rng = np.random.default_rng(1)
    order, model = rng.permutation(n), rng.standard_normal((n, dim + S)).astype(np.float32)
    f = RowFile(path, n, dim, S, order, optimizer="adam")
    try:
        f.put_rows(np.arange(n), model)
    finally:
        f.close()
    header = json.loads(manifest_path(path).read_text())
    assert (header["rows"], header["dim"], header["optimizer"], header["state_floats"]) == (n, dim, "adam", S)
    assert header["record_bytes"] == bytes_per_row(dim, "adam") == 4 * (dim + 2 * dim + 1)
    g = RowFile.open(path, dim, S, "adam", io_depth=2, cache_bytes=5000)
    try:
        assert np.array_equal(g.order, order) and g.cache_rows > 0
        rows = rng.choice(n, 300, replace=False)
        assert np.array_equal(g.read_rows(rows)[0], model[rows])
    finally:
        g.close()
    for d, s, opt, what in [(dim, dim, "adagrad", "optimizer adam, dim 8, 17 state floats per row"),
                            (dim, 1, "rowwise-adagrad", "17 state floats"), (4, 9, "adam", "dim 8")]:  # fmt: skip
        with pytest.raises(ValueError, match="was made for") as e:
            RowFile.open(path, d, s, opt)
        assert what in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
    os.truncate(path, PAGE)
    with pytest.raises(ValueError, match="truncated"):
        RowFile.open(path, dim, S, "adam")
    (tmp_path / "mine.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a cold-row file Hotline made"):
        RowFile.open(tmp_path / "mine.bin", dim, S, "adam")


def test_pages_per_record_and_the_cost_models_default_disk_tier():
    """A row read alone costs the pages its record spans: the mean over the file's packed records (counted
    here record by record), which the cost model's DiskTier.of_records takes from the optimizer's record."""
    from hotline.profiling.costmodel import DiskTier

    for record in (16, 100, 1540, PAGE, PAGE + 4, 3 * PAGE - 8):
        start = np.arange(PAGE, dtype=np.int64) * record  # a whole period of offsets within a page
        spans = (start + record - 1) // PAGE - start // PAGE + 1
        assert pages_per_record(record) == pytest.approx(spans.mean())
    assert pages_per_record(PAGE) == 1.0 and pages_per_record(64) == 1.0
    for opt in OPTIMIZERS:
        tier = DiskTier.of_records(128, opt, cached_share=0.25)
        assert tier.pages_per_cold_row == pytest.approx(pages_per_record(bytes_per_row(128, opt)))
        assert tier.cached_share == 0.25
    # Adam at dim 128: 1540-byte records at offsets 4 bytes apart, 384 of each 1024 across a page boundary
    assert DiskTier.of_records(128, "adam").pages_per_cold_row == 1.375


def test_direct_io_mode_is_reported(tmp_path):
    f = RowFile(tmp_path / "r.bin", 10, 4, 0)
    try:
        assert f.mode == "direct" or f.mode.startswith("buffered (O_DIRECT refused")
    finally:
        f.close()
    f = RowFile(tmp_path / "r.bin", 10, 4, 0, direct=False)  # Hotline's own file: made again
    try:
        assert f.mode.startswith("buffered")
    finally:
        f.close()


def test_a_write_keeps_the_neighbours_another_write_changed(tmp_path):
    """Step A's fetch reads a page; step B writes a row on that page; A's write-back (reusing A's pages)
    must not put B's row back to its old value."""
    f = RowFile(tmp_path / "rows.bin", 64, 4, 0)  # 16-byte records: 256 per page, all on page 0
    try:
        f.put_rows(np.arange(64), np.zeros((64, 4), np.float32))
        f.flush()
        a, b = np.array([1, 2]), np.array([3])
        _, pages_a = f.read_rows(a)
        _, pages_b = f.read_rows(b)
        f.write_rows(b, np.full((1, 4), 7, np.float32), pages_b)
        f.write_rows(a, np.full((2, 4), 5, np.float32), pages_a)
        got, _ = f.read_rows(np.array([1, 2, 3, 4]))
        assert got[:, 0].tolist() == [5, 5, 7, 0]
    finally:
        f.close()


@pytest.mark.parametrize("dim,state,cache", [(4, 0, 0), (8, 17, 0), (600, 1201, 0), (16, 1, 3000)])
def test_a_fetch_skips_the_pages_only_stale_rows_need_and_the_refresh_reads_them_into_its_pages(
    tmp_path, dim, state, cache
):
    """A fetch with ``skip`` leaves the skipped rows as they were and reads no page that only they need (its
    ``read_at`` -1); another (untracked) write then changes some of them and their neighbours; ``reread`` of a
    third of the skipped rows returns their new values and reads their pages into the fetch's page set, so the
    write-back reads first only the pages nobody read and those changed since the fetch that the refresh did
    not read; the file equals a numpy model of the rows, neighbours included."""
    n, rng = 3000, np.random.default_rng(5)
    f, model = _model_file(tmp_path, n, dim, state, cache, rng, io_depth=3)
    try:
        for _ in range(12):
            rows = rng.choice(n, size=300, replace=False)
            skip = np.sort(rng.choice(300, size=120, replace=False))
            out = np.full((300, dim + state), -9.0, np.float32)
            got, pages = f.read_rows(rows, out, skip=skip)
            kept = np.setdiff1d(np.arange(300), skip)
            assert np.array_equal(got[kept], model[rows[kept]])
            on_disk = f.positions[rows[skip]] >= f.cache_rows
            assert (got[skip[on_disk]] == -9.0).all()  # left as they were
            assert np.array_equal(pages.on_disk, np.flatnonzero(f.positions[rows] >= f.cache_rows))
            # a page is read iff a kept row on disk touches it
            need = np.zeros(pages.pages.shape[0], bool)
            keep = np.ones(rows.shape[0], bool)
            keep[skip] = False
            for o in pages.offsets[keep[pages.on_disk]]:
                need[o // PAGE : (o + f.record - 1) // PAGE + 1] = True
            assert np.array_equal(pages.read_at >= 0, need) and pages.pages_read == need.sum()
            assert pages.disk_rows == pages.on_disk.shape[0]
            # another step writes some skipped rows and rows beside them, then this step's refresh
            other = np.unique(np.concatenate([rows[skip[::2]], rng.choice(n, size=200, replace=False)]))
            other = np.setdiff1d(other, rows[kept])
            new = rng.standard_normal((other.shape[0], dim + state)).astype(np.float32)
            f.write_rows(other, new)
            model[other] = new
            refreshed = skip[::3]  # the rest as if forwarded from the step that held them
            again = f.reread(rows, pages, refreshed)
            assert np.array_equal(again, model[rows[refreshed]])
            got[refreshed] = again
            got[np.setdiff1d(skip, refreshed)] = model[rows[np.setdiff1d(skip, refreshed)]]
            # the write-back reads first the pages not read yet and those the other write changed after the
            # fetch and were not read again by the refresh
            changed = np.setdiff1d(_file_pages(f, other), _file_pages(f, rows[refreshed]))
            expect = np.union1d(pages.pages[pages.read_at < 0], np.intersect1d(pages.pages, changed))
            before = f.bytes_read
            upd = got + 1.0
            f.write_rows(rows, upd, pages)
            model[rows] = upd
            assert f.bytes_read - before == PAGE * expect.shape[0]
        every = np.concatenate([recs for _, recs in f.read_all(chunk_rows=999)])
        assert np.array_equal(every, model[f.order])
    finally:
        f.close()


@pytest.mark.parametrize("dim,state,cache", [(4, 0, 0), (8, 17, 0), (16, 1, 3000)])
def test_tracked_pages_take_the_bytes_of_earlier_steps_writes_so_nothing_is_read_twice(
    tmp_path, dim, state, cache
):
    """Look-ahead's order, two steps ahead: step t+2 is fetched (tracked, its rows that an unwritten step holds
    skipped) before steps t and t+1 write back; each write copies its pages' bytes into the tracked page sets
    that share them, so step t's refresh of its stale rows and its write-back read nothing from disk, and the
    file equals a numpy model of the rows (neighbours on shared pages included). An untracked fetch still
    reads again the pages a later write changed."""
    n, rng = 2000, np.random.default_rng(11)
    f, model = _model_file(tmp_path, n, dim, state, cache, rng, io_depth=3)
    try:
        pool = rng.choice(n, size=600, replace=False)  # rows recur across steps and share pages
        steps = [rng.choice(pool, size=150, replace=False) for _ in range(14)]
        held, inflight, extra = {}, {}, 0  # row -> last step that fetched it; step -> (records, pages)

        def fetch(t):
            rows = steps[t]
            stale = np.flatnonzero([held.get(r, -1) >= 0 for r in rows.tolist()])
            for r in rows.tolist():
                held[r] = t
            inflight[t] = (*f.read_rows(rows, skip=stale, track=True), stale)

        fetch(0), fetch(1)
        for t in range(len(steps)):
            if t + 2 < len(steps):
                fetch(t + 2)
            recs, pages, stale = inflight.pop(t)
            before = f.bytes_read
            recs[stale] = f.reread(steps[t], pages, stale)  # every earlier step has written back by now
            assert np.array_equal(recs, model[steps[t]])
            upd = recs + rng.standard_normal(recs.shape).astype(np.float32)
            f.write_rows(steps[t], upd, pages)
            extra += f.bytes_read - before
            model[steps[t]] = upd
            for r in steps[t].tolist():
                if held[r] == t:
                    held[r] = -1
        assert extra == 0  # neither a refresh nor a write-back read a page again
        every = np.concatenate([recs for _, recs in f.read_all(chunk_rows=999)])
        assert np.array_equal(every, model[f.order])
        # untracked: the write-back reads again the pages another write changed after the fetch
        a, b = f.order[f.cache_rows :: 2][:40], f.order[f.cache_rows + 1 :: 2][:5]  # b: a's neighbours
        recs, pages = f.read_rows(a)
        f.write_rows(b, model[b] + 1)
        model[b] += 1
        before = f.bytes_read
        f.write_rows(a, recs - 1, pages)
        model[a] = recs - 1
        assert f.bytes_read > before
        every = np.concatenate([recs for _, recs in f.read_all(chunk_rows=999)])
        assert np.array_equal(every, model[f.order])
    finally:
        f.close()


@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad", "adam"])
def test_a_disk_shards_update_takes_its_rows_from_the_fetched_pages(tmp_path, kind):
    """A rank's disk shard (``DiskRows``, N ranks): the rows the ranks asked for (repeated: several ranks ask
    for one row) fetched tracked, the pages only flagged rows need left unread, as the sharded store's fetch
    does; earlier steps' updates of some of them and of their neighbours land; the refresh of the flagged rows
    reads at most the pages the fetch left, and this step's update takes the rows from the fetched pages,
    which those writes kept current, and reads nothing from disk; the shard then equals the same updates
    applied, each read from disk, to a second shard."""
    from hotline.tiers.sparse_optim import SparseOptimizer

    n, dim, rng = 3000, 128, np.random.default_rng(13)  # 4-8 records a page: some hold only flagged rows
    opt = SparseOptimizer(kind, 0.05, dim=dim)
    ours, theirs = _twin_shards(tmp_path, n, dim, opt, rng)
    try:
        pool = rng.choice(n, 500, replace=False)
        for _ in range(6):
            asked = rng.choice(pool, 200)  # repeats
            stale_rows = rng.choice(
                np.unique(asked), 40, replace=False
            )  # the claim flags a row wherever asked
            flagged = np.flatnonzero(np.isin(asked, stale_rows))
            before = ours.file.bytes_read
            w0, _, pages = ours.get(asked, skip=flagged, track=True)
            kept = np.delete(asked, flagged)
            assert ours.file.bytes_read - before == PAGE * _file_pages(ours.file, kept).shape[0]
            left = np.setdiff1d(_file_pages(ours.file, stale_rows), _file_pages(ours.file, kept))
            assert left.shape[0] > 0  # pages only flagged rows need: not read
            for _ in range(2):  # earlier steps' updates, after this fetch
                rows = rng.choice(pool, 150)
                g = torch.from_numpy(rng.standard_normal((rows.shape[0], dim)).astype(np.float32))
                ours.apply(opt, rows, g)
                theirs.apply(opt, rows, g)
            before = ours.file.bytes_read
            again = ours.reread(asked, pages, flagged)[0]
            assert np.array_equal(again, theirs.get(asked[flagged])[0])
            assert ours.file.bytes_read - before <= PAGE * left.shape[0]  # the pages the fetch left, at most
            before = ours.file.bytes_read
            g = torch.from_numpy(rng.standard_normal((asked.shape[0], dim)).astype(np.float32))
            ours.apply(opt, asked, g, pages)
            assert ours.file.bytes_read == before  # nothing read from disk again
            theirs.apply(opt, asked, g)
            assert not np.array_equal(w0, theirs.get(asked)[0])  # the rows did change
        for a, b in zip(ours.all(), theirs.all()):
            assert np.array_equal(a, b)
    finally:
        ours.close()
        theirs.close()


def test_the_sharded_stores_fetch_leaves_the_flagged_rows_pages_to_the_refresh(tmp_path):
    """The sharded store over a disk shard (N ranks; one here, the same code): a look-ahead fetch of rows that an
    unfinished earlier step holds reads only the pages the other rows need; once that step's update lands, the
    refresh sends the flagged rows as the update left them, and this step's update reads nothing more from
    disk. The shard then equals a second one given the same updates, each read from disk."""
    from hotline.distributed.comm import Comm
    from hotline.tiers.sharded_store import ShardedColdStore
    from hotline.tiers.sparse_optim import SparseOptimizer

    n, dim, rng = 4000, 128, np.random.default_rng(17)
    opt = SparseOptimizer("sgd", 0.05, dim=dim)
    ours, theirs = _twin_shards(tmp_path, n, dim, opt, rng)
    try:
        store = ShardedColdStore(Comm(), ours, opt, n)

        def update(fetch, rows: np.ndarray, g: torch.Tensor) -> None:
            at = np.arange(rows.shape[0])
            store.update(fetch, opt, torch.empty(rows.shape[0], dim), None, at, g, at)
            theirs.apply(opt, rows, g)

        with store.lookahead():
            a = rng.choice(n, 300, replace=False)
            fa = store.fetch(a, None, None, step=0)
            shared = rng.choice(a, 60, replace=False)
            b = np.concatenate([shared, rng.choice(np.setdiff1d(np.arange(n), a), 240, replace=False)])
            before = ours.file.bytes_read
            fb = store.fetch(b, None, None, step=1)
            assert sorted(b[fb.stale]) == sorted(shared)  # step 0 holds them and has not updated them
            kept = np.delete(b, fb.stale)
            assert ours.file.bytes_read - before == PAGE * _file_pages(ours.file, kept).shape[0]
            left = np.setdiff1d(_file_pages(ours.file, shared), _file_pages(ours.file, kept))
            assert left.shape[0] > 0  # pages only flagged rows need: left unread by the fetch
            update(fa, a, torch.from_numpy(rng.standard_normal((300, dim)).astype(np.float32)))
            before = ours.file.bytes_read
            slots, values, _ = store.refresh(fb)
            assert ours.file.bytes_read - before <= PAGE * left.shape[0]
            assert np.array_equal(values, theirs.get(b[slots])[0])  # as step 0's update left them
            before = ours.file.bytes_read
            update(fb, b, torch.from_numpy(rng.standard_normal((300, dim)).astype(np.float32)))
            assert ours.file.bytes_read == before  # nothing read from disk again
        for x, y in zip(ours.all(), theirs.all()):
            assert np.array_equal(x, y)
    finally:
        ours.close()
        theirs.close()


def _twin_shards(tmp_path, n: int, dim: int, opt, rng: np.random.Generator) -> tuple:
    """Two disk shards (``DiskRows``) of ``n`` rows in one random file order, with the same random rows and zero
    state: one to drive, the other to give the same updates, each read from disk."""
    from hotline.tiers.disk_store import DiskRows

    order = rng.permutation(n)
    shards = tuple(DiskRows(tmp_path / name, n, dim, opt, order, io_depth=3) for name in ("a.bin", "b.bin"))
    try:
        init = rng.standard_normal((n, dim)).astype(np.float32)
        for h in shards:
            h.replace_all(init, np.zeros(opt.state_shape(n), np.float32))
    except BaseException:
        for h in shards:
            h.close()
        raise
    return shards


def _file_pages(f: RowFile, rows: np.ndarray) -> np.ndarray:
    """The file's pages the records of ``rows`` on disk (not in the DRAM tier) span, from their positions."""
    pos = f.positions[rows]
    start = pos[pos >= f.cache_rows] * f.record
    return np.unique(
        np.concatenate([np.arange(a // PAGE, (a + f.record - 1) // PAGE + 1) for a in start] or [[]])
    )


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
    _equal(_device_run(ds, optimizer), got)
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
    _equal(mem, _run(ds, _config("hotline", placement, tmp_path, optimizer, lookahead=0))[0])
    _equal(mem, _run(ds, _config("hotline", placement, tmp_path, optimizer, lookahead=0, cold_cache=2000))[0])


@pytest.mark.parametrize("optimizer", ["rowwise-adagrad", "adam"])
def test_dram_tier_with_lookahead_is_bit_identical(data, tmp_path, optimizer):
    ds, placement = data
    got = _run(ds, _config("hotline", placement, tmp_path, optimizer, lookahead=2, cold_cache=4096))[0]
    _equal(_device_run(ds, optimizer), got)


@pytest.mark.parametrize("optimizer", ["rowwise-adagrad", "adagrad", "adam"])
def test_replacement_with_the_disk_store(data, tmp_path, optimizer):
    """Re-placement moves rows and their whole state between the hot tier and the file: the same bits as
    with the memory store."""
    ds, placement = data
    kw = {"lookahead": 2, "replace_every": 6, "optimizer": optimizer}
    mem, mem_stats = _run(ds, _config("hotline", placement, tmp_path, disk=False, **kw))
    got, _ = _run(ds, _config("hotline", placement, tmp_path, **kw))
    _equal(mem, got)
    _equal(_device_run(ds, optimizer), got)


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
        _equal(straight, tr.named_arrays())
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
    deadline = time.time() + 180
    while time.time() < deadline and len(CheckpointManager(ck).complete()) < 3 and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert CheckpointManager(ck).latest() is not None
    resumed = ["--checkpoint-dir", str(ck), "--resume", "--dump-params", str(tmp_path / "resumed.npz")]
    assert main(["train", *common, *disk, *resumed]) == 0
    a, b = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k


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
     (["--cold-dir", "/tmp"], "directory of --cold-store disk"),
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
    a, b = np.load(tmp_path / "m.npz"), np.load(tmp_path / "d.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    assert made_by_hotline(cold_file(tmp_path)) and order_path(cold_file(tmp_path)).is_file()


# -- calibration, cost model, benchmark -----------------------------------------------------------------
STEP = {"version": STEP_FORMAT, "record_bytes": 256, "rows": [256], "repeats": 1,
        "read": {"fixed_us": 1000.0, "us_per_call": 20.0, "cpu_us_per_call": 5.0},
        "write": {"fixed_us": 500.0, "us_per_call": 25.0, "cpu_us_per_call": 6.0},
        "read_write_penalty": 0.5, "compute_penalty": 0.25}  # fmt: skip
DISK = {"read_iops": {"1": 20_000.0, "depth": 60_000.0}, "write_iops": 40_000.0, "cpu_us_per_read": 5.0,
        "cpu_us_per_write": 5.0, "depth": 32, "seq_write_mbps": 900.0, "step": STEP}  # fmt: skip


def test_cost_model_prices_the_disk_tier():
    """Golden values by hand: 20,000 cold rows of one page each are 20,000 pages, one request each (no two
    neighbours); reads 1 ms + 20 us/request = 401 ms, write-backs 0.5 ms + 25 us/request = 500.5 ms, their CPU
    11 us/request = 220 ms (inside them)."""
    from test_costmodel import HW, W, stats

    from hotline.profiling import costmodel as cm

    hw = {**HW, "disk": DISK}
    s = stats(cold=20_000, unique=60_000)
    for mode in ("hybrid", "hotline_k0", "hotline_k1"):
        mem = cm.predict(mode, W, s, hw)
        none = cm.predict(mode, W, s, hw, cm.DiskTier(pages_per_cold_row=0.0))  # no page read: as in memory
        assert none.samples_per_s == pytest.approx(mem.samples_per_s)
        disk = cm.predict(mode, W, s, hw, cm.DiskTier(pages_per_cold_row=1.0))
        assert disk.samples_per_s < mem.samples_per_s
        pages = 60_000 if mode == "hybrid" else 20_000
        assert disk.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * pages)
        assert disk.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * pages)
        assert disk.phases_s["disk_cpu"] == pytest.approx(11e-6 * pages)
        if mode != "hotline_k1":  # sequential: fetch, compute, write-back one after the other (CPU inside)
            assert disk.step_s == pytest.approx(mem.step_s + 1.5e-3 + 45e-6 * pages)
    k1 = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0))
    # the producer's 401 ms of reads beside the writer's 500.5 ms: the longer plus half the shorter
    assert k1.phases_s["lane: disk (reads beside writes)"] == pytest.approx(0.5005 + 0.5 * 0.401)
    shared = k1.phases_s["lane: shared cores"]
    assert shared < 0.7010  # this workload's compute is shorter than the disk's lane
    # that I/O beside the compute on the same cores: the longer plus a quarter of the shorter
    assert k1.phases_s["lane: disk beside compute"] == pytest.approx(0.7010 + 0.25 * shared)
    assert k1.bottleneck == "disk beside compute"
    assert k1.step_s == pytest.approx(0.7010 + 0.25 * shared + HW["host"].get("handover_us", 0.0) * 1e-6)
    # half of the fetched pages read again (write-backs' read-modify-write, stale rows): 10,000 pages at the
    # reads' 20 us/page = 200 ms more on the writer's side; a sequential step reads none again
    again = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, reread_share=0.5))
    assert again.phases_s["disk_reread"] == pytest.approx(0.2)
    assert again.phases_s["lane: disk (reads beside writes)"] == pytest.approx(0.7005 + 0.5 * 0.401)
    seq = cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0, reread_share=0.5))
    assert seq.step_s == pytest.approx(cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0)).step_s)
    # a quarter of the step's pages only stale rows need: the fetch reads 15,000 of the 20,000 pages (1 ms +
    # 300 ms), the write-back still writes all 20,000; a sequential step has no stale rows (the share ignored)
    left = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, reread_share=0.5, skipped_share=0.25))
    assert left.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 15_000)
    assert left.phases_s["disk_write"] == pytest.approx(0.5005) and left.phases_s[
        "disk_reread"
    ] == pytest.approx(0.2)
    assert left.phases_s["lane: disk (reads beside writes)"] == pytest.approx(0.7005 + 0.5 * 0.301)
    seq = cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0, skipped_share=0.25))
    assert seq.phases_s["disk_read"] == pytest.approx(0.401)
    with pytest.raises(ValueError, match="skipped_share"):
        cm.DiskTier(1.0, skipped_share=1.5)
    half = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, cached_share=0.5))  # the DRAM tier serves half
    assert half.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 10_000)
    # neighbouring pages read by one request: 20,000 pages in 15,000 requests, priced per request (reads,
    # write-backs, their CPU and, under look-ahead, the pages read again: their requests alike)
    runs = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, reread_share=0.5, calls_per_page=0.75))
    assert runs.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 15_000)
    assert runs.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * 15_000)
    assert runs.phases_s["disk_cpu"] == pytest.approx(11e-6 * 15_000)
    assert runs.phases_s["disk_reread"] == pytest.approx(0.5 * 20e-6 * 15_000)
    # a cost per page besides the request's: 20,000 pages at 5 us more on each direction (and the re-reads)
    paged = {**hw, "disk": {**DISK, "step": {**STEP, "read": {**STEP["read"], "us_per_page": 5.0},
                                             "write": {**STEP["write"], "us_per_page": 5.0}}}}  # fmt: skip
    p = cm.predict("hotline_k1", W, s, paged, cm.DiskTier(1.0, reread_share=0.5, calls_per_page=0.75))
    assert p.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 15_000 + 5e-6 * 20_000)
    assert p.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * 15_000 + 5e-6 * 20_000)
    assert p.phases_s["disk_reread"] == pytest.approx(0.5 * (20e-6 * 15_000 + 5e-6 * 20_000))
    with pytest.raises(ValueError, match=r"calls_per_page must be in \[0, 1\].*got 1.5"):
        cm.DiskTier(1.0, calls_per_page=1.5)
    gpu = {**hw, "link": {"h2d_gbps": 8.0, "d2h_gbps": 8.0}}  # a device of its own: no shared cores
    k1 = cm.predict("hotline_k1", W, s, gpu, cm.DiskTier(1.0))
    assert "lane: disk beside compute" not in k1.phases_s and k1.bottleneck == "disk (reads beside writes)"
    with pytest.raises(ValueError, match="calibrate --disk"):
        cm.predict("hybrid", W, s, HW, cm.DiskTier())
    old = {**hw, "disk": {k: v for k, v in DISK.items() if k != "step"}}  # a calibration from before
    with pytest.raises(ValueError, match="predates step-shaped disk timing.*calibrate --disk DIR` again"):
        cm.predict("hotline_k1", W, s, old, cm.DiskTier())


def test_step_fit_and_penalty():
    """The calibration's fit (medians of each size's timings, then a line) and overlap penalty, on fixed
    timings: 2 ms + 10 us/request with one outlier per size that the median drops, the sizes interleaved as
    the calibration times them (rounds in a random order; a size's requests vary a little from draw to
    draw)."""
    from hotline.profiling.disk_calibrate import _fit
    from hotline.profiling.fitting import overlap_penalty as _penalty

    sizes = [1000, 100, 5000, 5000, 1000, 100, 100, 5000, 1000]
    calls = [990, 100, 4990, 5000, 1000, 99, 100, 5010, 1010]
    seconds = [0.5, 0.003, 0.052, 0.052, 0.012, 0.9, 0.003, 0.0, 0.012]
    fit = _fit(calls, seconds, sizes)
    assert fit["fixed_us"] == pytest.approx(2000.0) and fit["us_per_call"] == pytest.approx(10.0)
    assert fit["us_per_page"] == 0.0
    # with the pages each timing read (pairs of neighbouring pages in one request for the odd sizes): 2 ms +
    # 10 us/request + 4 us/page, recovered from the medians of each size
    sizes, calls, pages = [100, 101, 1000, 1001, 5000, 5001] * 2, [100, 50, 1000, 500, 5000, 2500] * 2, [
        100, 100, 1000, 1000, 5000, 5000] * 2  # fmt: skip
    seconds = [2e-3 + 10e-6 * c + 4e-6 * p for c, p in zip(calls, pages)]
    seconds[0] = 9.0  # one outlier: the median of two drops half of it
    seconds[6] = seconds[6] - (9.0 - seconds[6])
    fit = _fit(calls, seconds, sizes, pages)
    assert fit["fixed_us"] == pytest.approx(2000.0, rel=1e-6) and fit["us_per_call"] == pytest.approx(10.0)
    assert fit["us_per_page"] == pytest.approx(4.0)
    assert _penalty(1.0, 1.0, 0.5) == 0.0  # the shorter lane hidden entirely
    assert _penalty(1.5, 1.0, 0.5) == 1.0  # one after the other
    assert _penalty(1.25, 0.5, 1.0) == 0.5 and _penalty(9.0, 1.0, 1.0) == 3.0  # capped


def test_at_probe_scales_the_step_fits():
    """A disk section priced at a probe: each direction's fit scaled by the probe's time over the
    calibration's (golden), the CPU per request and the penalties as calibrated; no probe: unchanged."""
    from hotline.profiling.disk_calibrate import at_probe

    step = {"read": {"fixed_us": 100.0, "us_per_call": 20.0, "us_per_page": 2.0, "cpu_us_per_call": 25.0},
            "write": {"fixed_us": 50.0, "us_per_call": 30.0, "us_per_page": 0.0, "cpu_us_per_call": 28.0},
            "read_write_penalty": 0.4, "compute_penalty": 0.7,
            "probe": {"rows": 2048, "read_us": 40_000.0, "write_us": 60_000.0}}  # fmt: skip
    disk = {"depth": 32, "step": step}
    got = at_probe(disk, {"rows": 2048, "read_us": 60_000.0, "write_us": 30_000.0})
    assert got["step"]["read"] == {"fixed_us": 150.0, "us_per_call": 30.0, "us_per_page": 3.0,
                                   "cpu_us_per_call": 25.0}  # fmt: skip
    assert got["step"]["write"] == {"fixed_us": 25.0, "us_per_call": 15.0, "us_per_page": 0.0,
                                    "cpu_us_per_call": 28.0}  # fmt: skip
    assert got["step"]["at_probe"] == {"read": 1.5, "write": 0.5} and got["depth"] == 32
    assert got["step"]["compute_penalty"] == 0.7 and got["step"]["probe"] == step["probe"]
    assert disk["step"]["read"]["us_per_call"] == 20.0  # the section given is not changed
    old = {"step": {k: v for k, v in step.items() if k != "probe"}}
    assert at_probe(old, {"read_us": 1.0, "write_us": 1.0}) is old


def test_disk_probe_times_and_cleans_up(tmp_path):
    """The probe beside a run: step-shaped read and write-back times of its rows, on a scratch file in a folder
    of its own that close removes (a user's file of the scratch file's name untouched)."""
    from hotline.profiling.disk_calibrate import PROBE_ROWS, DiskProbe

    mine = tmp_path / "hotline-disk-calibration-step.bin"
    mine.write_text("user data")
    with DiskProbe(tmp_path, 256, depth=4, file_bytes=4 << 20) as probe:
        assert len(list(tmp_path.glob(".hotline-disk-calibration*"))) == 1
        got = probe(repeats=2)
    assert got["rows"] == PROBE_ROWS and got["read_us"] > 0 and got["write_us"] > 0
    assert not list(tmp_path.glob(".hotline-disk-calibration*")) and mine.read_text() == "user data"


def test_disk_probe_closes_its_file_when_writing_it_fails(tmp_path, monkeypatch):
    """An I/O error while the scratch file is written whole (before any timing): one OSError, and the file's
    descriptors and its folder are gone (a calibration or probe that fails leaks nothing)."""
    import errno

    from hotline.profiling.disk_calibrate import DiskProbe

    real = os.pwrite

    def failing(
        fd, data, offset
    ):  # the scratch file's 1 MiB sequential chunks; nothing else writes by pwrite
        if len(data) == 1 << 20 and offset >= 2 << 20:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, data, offset)

    def fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    before = fds()
    monkeypatch.setattr(os, "pwrite", failing)
    with pytest.raises(OSError, match="Input/output error"):
        DiskProbe(tmp_path, 256, depth=4, file_bytes=4 << 20)
    monkeypatch.undo()
    assert fds() <= before and not list(tmp_path.glob(".hotline-disk-calibration*"))


def test_calibrate_disk_cli(tmp_path, capsys):
    out = tmp_path / "hw.json"
    out.write_text('{"format": "hotline-hardware", "host": {"x": 1}}')
    # the user's files named as the calibration's scratch files were: never opened, refused or removed
    mine = {tmp_path / n: f"user data {n}" for n in ("hotline-disk-calibration.bin",
                                                     "hotline-disk-calibration-step.bin")}  # fmt: skip
    for p, text in mine.items():
        p.write_text(text)
    assert (
        main(
            [
                "calibrate",
                "--out",
                str(out),
                "--disk",
                str(tmp_path),
                "--disk-only",
                "--disk-depth",
                "4",
                "--disk-record-bytes",
                "128",
            ]
        )  # fmt: skip
        == 0
    )
    import json

    hw = json.loads(out.read_text())
    d = hw["disk"]
    assert hw["host"] == {"x": 1}  # what the file held stays
    assert d["depth"] == 4 and d["io_mode"] in ("direct",) or d["io_mode"].startswith("buffered")
    for v in (d["read_iops"]["1"], d["read_iops"]["depth"], d["write_iops"], d["seq_write_mbps"]):
        assert v > 0
    t = d["step"]  # the step-shaped figures the cost model prices, at the record asked for
    assert t["version"] == STEP_FORMAT and t["record_bytes"] == 128 and t["rows"] and t["repeats"] >= 1
    for k in ("read", "write"):
        assert t[k]["fixed_us"] >= 0 and t[k]["us_per_call"] >= 0 and t[k]["cpu_us_per_call"] >= 0
        assert t[k]["us_per_call"] + t[k]["us_per_page"] > 0
    assert 0 <= t["read_write_penalty"] <= 3 and 0 <= t["compute_penalty"] <= 3
    for name in ("read_write", "compute"):  # what was measured beside what is priced
        got = t["penalties_measured"][name]
        assert got["penalty"] == t[f"{name}_penalty"] and got["se"] >= 0 and 0 <= got["pooled"] <= 3
    # the I/O beside compute timed twice: a compute as long as the I/O (priced alone before) and a quarter as long,
    # each a point (the lanes' ratio as timed, the penalty priced) of what the model interpolates
    (r_short, p_short), (r_long, p_long) = t["compute_penalties"]
    assert 0 < r_short < r_long <= 1 and r_short < 0.6 and p_long == t["compute_penalty"]
    assert p_short == t["penalties_measured"]["compute_at_0.25"]["penalty"] and 0 <= p_short <= 3
    # fitted to timed look-ahead pipelines at the priced compute's penalties
    piped = t["penalties_measured"]["read_write"]
    assert len(piped["pairs"]) >= 2 and all(len(p) == 4 and min(p) > 0 for p in piped["pairs"])
    assert piped["compute_penalty"] == t["compute_penalties"]
    pair = t["penalties_measured"]["read_write_pair"]  # the two-thread pair, kept for the record
    assert len(pair["pairs"]) >= 3 and all(len(p) == 3 for p in pair["pairs"]) and 0 <= pair["pooled"] <= 3
    json.dumps(t, allow_nan=False)  # plain JSON: no Infinity or NaN
    assert t["probe"]["rows"] == 2048 and t["probe"]["read_us"] > 0 and t["probe"]["write_us"] > 0
    printed = capsys.readouterr().out
    assert "random 4 KiB reads" in printed and "a step's I/O (128-byte records)" in printed
    assert f"of the I/O beside compute {p_short:.2f} with the compute {r_short:.2f} of the I/O, " in printed
    assert not list(tmp_path.glob(".hotline-disk-calibration*"))  # its scratch folder is gone
    assert {p: p.read_text() for p in mine} == mine
    assert main(["calibrate", "--out", str(out), "--disk-only"]) == 2
    assert main(["calibrate", "--out", str(out), "--disk", str(tmp_path), "--disk-only",
                 "--disk-record-bytes", "6"]) == 2  # not whole floats  # fmt: skip
    assert "--disk-record-bytes must be a positive multiple of 4, got 6" in capsys.readouterr().err


def test_bench_disk_tier_prices_a_row_where_both_probes_agree(monkeypatch):
    """A disk row is priced at the median of the two probes beside it and the calibration's (golden): a stall
    in one probe does not move the price; both slower (or both faster) moves it by the nearer of the two."""
    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    hw = {"disk": {"step": {"probe": {"rows": 2048, "read_us": 40.0, "write_us": 50.0}}}}

    def row(before, after):
        return {"disk_probe": {"before": {"read_us": before[0], "write_us": before[1]},
                               "after": {"read_us": after[0], "write_us": after[1]}}}  # fmt: skip

    assert bench_disk_tier.row_probe(row((36.0, 55.0), (240.0, 60.0)), hw) == {
        "read_us": 40.0,
        "write_us": 55.0,
    }
    assert bench_disk_tier.row_probe(row((44.0, 45.0), (48.0, 40.0)), hw) == {
        "read_us": 44.0,
        "write_us": 45.0,
    }
    assert bench_disk_tier.row_probe({}, hw) is None
    assert bench_disk_tier.row_probe(row((1.0, 1.0), (1.0, 1.0)), {"disk": {"step": {}}}) is None


def test_bench_disk_tier_keeps_each_rows_median_round(monkeypatch):
    """Of a disk row's rounds the median by samples/s stands for it (a round that raised left out), every
    round's samples/s and predicted/measured beside it; a row whose every round raised: its first error."""
    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    def rnd(n, sps, ratio):
        return {"mode": "hotline_k2_disk", "round": n, "samples_per_s": sps, "predicted_ratio": ratio}

    got = bench_disk_tier.typical([rnd(1, 900.0, 1.4), rnd(2, 1200.0, 1.05), {"error": "x", "round": 3},
                                   rnd(4, 1000.0, 1.1)])  # fmt: skip
    assert got["round"] == 4 and got["samples_per_s"] == 1000.0 and got["predicted_ratio"] == 1.1
    assert got["rounds_samples_per_s"] == [900.0, 1200.0, 1000.0]
    assert got["rounds_predicted_ratio"] == [1.4, 1.05, 1.1]
    failed = [{"mode": "hybrid_disk", "error": "first"}, {"mode": "hybrid_disk", "error": "second"}]
    assert bench_disk_tier.typical(failed)["error"] == "first"


def test_bench_disk_tier_smoke(tmp_path, monkeypatch):
    import json

    import numba

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        report = bench_disk_tier.main(["--smoke", "--threads", "1", "--json", str(tmp_path / "r.json")])
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["benchmark"] == report["benchmark"] == "bench_disk_tier"
    modes = [r["mode"] for r in written["results"]]
    assert modes == ["device", "mmap", "mmap_dram", "hybrid_disk", "hotline_k0_disk", "hotline_k2_disk"]
    for r in written["results"]:
        assert r["samples_per_s"] > 0
        if r["mode"].endswith("_disk"):
            assert r["io_mode"] == "direct" or r["io_mode"].startswith("buffered")
            assert r["disk_bytes_per_step"] > 0 and r["cold_rows_per_step"] > 0 and r["exposed_read_ms"] >= 0
            assert r["coverage"] is not None and r["popular_share"] is not None
            # two rounds in --smoke: the slower (the lower middle) stands for the row, both kept beside it
            assert len(r["rounds_samples_per_s"]) == 2 and r["samples_per_s"] == min(
                r["rounds_samples_per_s"]
            )
            pr = r["disk_probe"]  # the disk beside the run: before its clock, after it, and their mean
            assert pr["before"]["read_us"] > 0 and pr["after"]["write_us"] > 0
            assert pr["read_us"] == pytest.approx((pr["before"]["read_us"] + pr["after"]["read_us"]) / 2)
    mmap, held = written["results"][1], written["results"][2]
    assert mmap["page_cache_dropped_by"] and mmap["page_cache"] == "used (mmap), the machine's memory"
    # the same baseline with its page cache held to the disk store's DRAM budget, or the reason it could not be
    limited = held["page_cache_limit_bytes"] is not None
    assert held["page_cache"].startswith("used (mmap), held to" if limited else "used (mmap), not limited: ")
    if limited:
        assert held["cgroup_cache_bytes"] <= held["page_cache_limit_bytes"]
    assert mmap["readahead"] == "kernel default" and held["readahead"] == "off (MADV_RANDOM)"
    # what it really read, counted per timed step by the kernel (3 steps in --smoke)
    assert len(mmap["os_read_bytes_by_step"]) == len(mmap["major_faults_by_step"]) == 3
    assert all(f >= 0 for f in mmap["major_faults_by_step"]) and mmap["table_bytes"] > 0
    if mmap["os_read_bytes_per_step"] is not None:  # /proc/self/io where the kernel has it
        assert all(b >= 0 for b in mmap["os_read_bytes_by_step"])
    for r in written["results"][3:]:
        assert r["page_cache"] in ("bypassed (O_DIRECT)", "used (buffered I/O)")
        assert r["os_read_bytes_per_step"] is None or r["os_read_bytes_per_step"] >= 0
    for v in written["targets"].values():  # a missed target says why, in the run's figures
        assert v["met"] or "MiB" in v["why"] or "ms/step" in v["why"]
    assert set(written["targets"]) == {
        "hotline_k2_disk/hybrid_disk",
        "hotline_k2_disk/mmap_dram" if limited else "hotline_k2_disk/mmap",
        "hotline_k2_disk/device",
    }
    assert isinstance(written["target_met"], bool)


def test_bench_disk_io_shape_smoke(tmp_path, monkeypatch):
    """The paired probe of the I/O after a compute pass against after a pause runs and writes both medians
    and their ratio per direction (its figures are for a person to read: no time bound here)."""
    import json

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_io_shape
    import numba

    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        report = bench_disk_io_shape.main(["--smoke", "--threads", "1", "--buffered", "--dir", str(tmp_path),
                                           "--json", str(tmp_path / "r.json")])  # fmt: skip
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    written = json.loads((tmp_path / "r.json").read_text())
    assert written == json.loads(json.dumps(report)) and written["pairs"] == 2
    for what in ("read", "write_back"):
        r = written[what]
        assert r["after_pause_ms"] > 0 and r["after_compute_ms"] > 0 and r["ratio_median"] > 0
        assert r["ratio_iqr"][0] <= r["ratio_median"] <= r["ratio_iqr"][1]
    assert written["io_mode"].startswith("buffered") and not list(tmp_path.glob("tmp*"))  # scratch removed


def test_pooled_penalty_credits_only_the_overlap_its_timings_show():
    """Golden: pooled over pairs (sums, not a vote of each pair); a gain within the pairs' noise is priced as
    none (1); a clear gain, and a loss (worse than one after the other), as measured."""
    from hotline.profiling.fitting import pooled_penalty

    clear = [(1.5, 1.0, 1.0), (1.52, 1.0, 1.0), (1.48, 1.0, 1.0), (1.5, 1.0, 1.0), (1.5, 1.0, 1.0)]
    got = pooled_penalty(clear)
    assert got["pooled"] == pytest.approx(0.5) and got["penalty"] == got["pooled"] and got["se"] < 0.02
    # pairs as spread as those timed here on 2026-12-02 (0.3-1.45 each): pooled 0.8, but not beyond the noise
    noisy = [(1.3, 1.0, 1.0), (2.0, 1.0, 1.0), (1.9, 1.0, 1.0), (1.35, 1.0, 1.0), (2.45, 1.0, 1.0)]
    got = pooled_penalty(noisy)
    assert (
        got["pooled"] == pytest.approx(0.8) and got["pooled"] + 2 * got["se"] >= 1 and got["penalty"] == 1.0
    )
    worse = [(2.2, 1.0, 1.0), (2.3, 1.0, 1.0), (2.1, 1.0, 1.0)]
    assert pooled_penalty(worse)["penalty"] == pytest.approx(1.2)
    # unequal lanes pool by sums: (3.0 + 1.2 - 2.0 - 1.0) / (1.0 + 0.2) = 1.0
    assert pooled_penalty([(3.0, 2.0, 1.0), (1.2, 0.2, 1.0)])["pooled"] == pytest.approx(1.0)
    assert pooled_penalty([])["penalty"] == 1.0  # nothing timed shows no gain: priced as none
    one = pooled_penalty([(1.5, 1.0, 1.0)])  # one pair shows nothing beyond its noise, which it cannot tell
    assert one["penalty"] == 1.0 and one["pooled"] == pytest.approx(0.5) and one["se"] is None


def test_pipeline_penalty_is_the_read_write_penalty_that_prices_the_timed_pipeline():
    """Reads beside write-backs are priced with the penalty at which the cost model's look-ahead step (the disk
    lane, reads beside write-backs, and that beside the compute) takes what the timed pipeline took (golden,
    each branch), and the model's own step at the fitted penalty gives the timing back (property)."""
    import numpy as np

    from hotline.profiling.costmodel import _overlapped
    from hotline.profiling.disk_calibrate import _read_write_fit, pipeline_penalty

    # the disk lane the longer: 2.0 = disk + 0.5 * 1.0, disk = 1.5 = 1.0 + p * 1.0
    assert _read_write_fit(2.0, 1.0, 1.0, 1.0, 0.5) == pytest.approx(0.5)
    # the compute the longer: 4.5 = 4.0 + 0.5 * disk, disk = 1.0 = 1.0 + p * 0.5
    assert _read_write_fit(4.5, 1.0, 4.0, 0.5, 0.5) == pytest.approx(0.0)
    assert _read_write_fit(4.4, 1.0, 4.0, 0.5, 0.5) == 0.0  # faster than the lanes allow: clipped
    # any disk lane up to 4 s gives that step: the largest, clipped
    assert _read_write_fit(4.0, 1.0, 4.0, 0.5, 0.0) == pytest.approx(3.0)
    assert _read_write_fit(9.0, 1.0, 1.0, 1.0, 1.0) == 3.0
    rng = np.random.default_rng(3)
    for _ in range(200):
        r, c, w = rng.uniform(0.1, 2.0, 3)
        p_rw, p_c = rng.uniform(0.0, 1.5, 2)
        together = _overlapped(_overlapped(r, w, p_rw), c, p_c)
        got = _read_write_fit(together, r, c, w, p_c)
        assert _overlapped(_overlapped(r, w, got), c, p_c) == pytest.approx(together)
        if p_c > 0 and _overlapped(r, w, p_rw) != c:
            assert got == pytest.approx(p_rw)
    tight = [(2.0, 1.0, 1.0, 1.0), (2.04, 1.0, 1.0, 1.0), (1.96, 1.0, 1.0, 1.0)]
    got = pipeline_penalty(tight, 0.5)
    assert got["penalty"] == got["pooled"] == pytest.approx(0.5)
    assert got["se"] == pytest.approx(0.0231, abs=1e-4)
    assert got["pairs"] == [list(t) for t in tight] and got["compute_penalty"] == 0.5
    noisy = [(1.6, 1.0, 1.0, 1.0), (2.4, 1.0, 1.0, 1.0)]  # 0.1 and 0.9: a gain within the noise
    got = pipeline_penalty(noisy, 0.5)
    assert got["pooled"] == pytest.approx(0.5) and got["penalty"] == 1.0
    assert pipeline_penalty([], 0.5)["penalty"] == 1.0
    assert pipeline_penalty([(2.0, 1.0, 1.0, 1.0)], 0.5)["penalty"] == 1.0  # one pair: no noise known


def _piped(read: float, compute: float, write: float, p_rw: float, curve: list) -> float:
    """The cost model's look-ahead step of a disk lane (reads beside writes at ``p_rw``) beside the compute, at
    the penalty ``curve`` gives their ratio."""
    from hotline.profiling.costmodel import _overlapped, penalty_at

    disk = _overlapped(read, write, p_rw)
    return _overlapped(disk, compute, penalty_at(curve, min(disk, compute) / max(disk, compute)))


def test_the_io_beside_compute_is_priced_by_the_lanes_ratio():
    """Timed at two compute lengths, the I/O beside compute is priced at the lanes' ratio: linear between the two
    points, the nearer one's beyond them (golden); the pipeline's fit and the cost model's look-ahead step price
    with the same points, and one figure (an older calibration) prices every ratio alike."""
    from hotline.profiling.costmodel import _beside, penalty_at
    from hotline.profiling.disk_calibrate import _lane_ratio, _read_write_fit, pipeline_penalty

    points = [[0.25, 0.1], [1.0, 0.85]]
    assert penalty_at(points, 0.25) == pytest.approx(0.1) and penalty_at(points, 1.0) == pytest.approx(0.85)
    assert penalty_at(points, 0.5) == pytest.approx(0.35)  # 0.1 + 0.75 * (0.25 / 0.75)
    assert penalty_at(points, 0.1) == pytest.approx(0.1)  # below the shorter compute timed: its penalty
    assert penalty_at(points[::-1], 0.7) == pytest.approx(0.55)  # the points in any order
    assert penalty_at(0.69, 0.1) == penalty_at(0.69, 1.0) == 0.69
    # a point rising faster than the ratio is taken at that bound, one below the point before at its level
    assert penalty_at([[0.25, 0.0], [0.5, 0.9]], 0.5) == pytest.approx(0.25)
    assert penalty_at([[0.25, 0.4], [1.0, 0.1]], 1.0) == pytest.approx(0.4)
    assert _lane_ratio([(1.2, 1.0, 0.2), (1.1, 1.0, 0.3)]) == pytest.approx(0.25)  # 0.5 s beside 2 s
    # the cost model: 200 ms of I/O beside 40 ms of compute (ratio 0.2: 0.1 of it), and beside 150 ms (0.75: 0.6)
    assert _beside(0.2, 0.04, {"compute_penalty": 0.85, "compute_penalties": points}) == pytest.approx(0.204)
    assert _beside(0.15, 0.2, {"compute_penalty": 0.85, "compute_penalties": points}) == pytest.approx(0.29)
    assert _beside(0.2, 0.04, {"compute_penalty": 0.85}) == pytest.approx(0.234)
    # the fit: a disk lane of 2 s (1 s of reads, 1 s of writes at 1.0) beside 1 s of compute (ratio 0.5: 0.35)
    assert _read_write_fit(2.35, 1.0, 1.0, 1.0, points) == pytest.approx(1.0)
    rng = np.random.default_rng(4)
    for _ in range(200):  # the fitted penalty gives back the pipelined seconds through the model's own step
        r, c, w = rng.uniform(0.1, 2.0, 3)
        p_rw = rng.uniform(0.0, 1.5)
        curve = sorted(
            [[rng.uniform(0.05, 0.5), rng.uniform(0.0, 0.5)], [rng.uniform(0.6, 1.0), rng.uniform(0.3, 1.2)]]
        )

        got = _read_write_fit(_piped(r, c, w, p_rw, curve), r, c, w, curve)
        assert _piped(r, c, w, got, curve) == pytest.approx(_piped(r, c, w, p_rw, curve), rel=1e-9)
    got = pipeline_penalty([(2.35, 1.0, 1.0, 1.0), (2.35, 1.0, 1.0, 1.0)], points)
    assert got["pooled"] == pytest.approx(1.0) and got["compute_penalty"] == points


def test_bench_disk_tier_pools_the_two_calibrations_pairs(monkeypatch):
    """The benchmark's disk figures are the mean of a calibration before its rows and one after; the overlap
    penalties are pooled from both calibrations' pairs (golden), not averaged: a gain within the pooled noise is
    priced as none even where one calibration alone showed it."""
    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    from hotline.profiling.disk_calibrate import pipeline_penalty
    from hotline.profiling.fitting import pooled_penalty

    clear = [(1.5, 1.0, 1.0), (1.52, 1.0, 1.0), (1.48, 1.0, 1.0)]  # 0.5, tight: shown alone
    # look-ahead pipelines (pipelined, reads, compute, write-backs) at a compute penalty of 0.5: the disk lane
    # is together - 0.5 s, the reads-beside-writes penalty its excess over 1 s
    piped = [(2.0, 1.0, 1.0, 1.0), (2.02, 1.0, 1.0, 1.0), (1.98, 1.0, 1.0, 1.0)]  # 0.5, tight: shown alone
    spread = [(2.8, 1.0, 1.0, 1.0), (2.2, 1.0, 1.0, 1.0), (2.5, 1.0, 1.0, 1.0)]  # 1.3, 0.7, 1.0
    a = {"penalties_measured": {"read_write": pipeline_penalty(piped, 0.5), "compute": pooled_penalty(clear),
                                "read_write_pair": pooled_penalty(clear)}}  # fmt: skip
    b = {"penalties_measured": {"read_write": pipeline_penalty(spread, 0.5), "compute": pooled_penalty(clear),
                                "read_write_pair": pooled_penalty(clear)}}  # fmt: skip
    assert a["penalties_measured"]["read_write"]["penalty"] == pytest.approx(0.5)
    step = bench_disk_tier.mean_of(a, b) | {"read_write_penalty": 0.75, "compute_penalty": 0.5}
    bench_disk_tier.pool_penalties(step, a, b)
    rw = step["penalties_measured"]["read_write"]
    assert rw["pooled"] == pytest.approx(0.75) and len(rw["pairs"]) == 6 and rw["compute_penalty"] == 0.5
    # the six pairs' own fits: 0.5, 0.52, 0.48, 1.3, 0.7 and 1
    assert rw["se"] == pytest.approx(0.1361, abs=1e-4)
    assert step["read_write_penalty"] == 1.0  # 0.75 + 2 se >= 1: not the mean, 0.75
    assert step["compute_penalty"] == pytest.approx(0.5)  # both show it: pooled, as each
    assert step["penalties_measured"]["read_write_pair"]["penalty"] == pytest.approx(0.5)  # kept, not priced
    # calibrations that also timed a compute a quarter of the I/O: both points pooled, the pipeline fitted at them
    short = [(1.0, 1.0, 0.25), (1.05, 1.0, 0.25)]  # 0 and 0.2 of the compute: 0.1 pooled, ratio 0.25
    a["penalties_measured"]["compute_at_0.25"] = b["penalties_measured"]["compute_at_0.25"] = pooled_penalty(
        short
    )
    step = bench_disk_tier.mean_of(a, b) | {
        "compute_penalty": 0.5,
        "compute_penalties": [[0.3, 0.2], [1.0, 0.5]],
    }
    bench_disk_tier.pool_penalties(step, a, b)
    assert step["compute_penalties"] == [[pytest.approx(0.25), pytest.approx(0.1)], [1.0, pytest.approx(0.5)]]
    assert step["penalties_measured"]["read_write"]["compute_penalty"] == step["compute_penalties"]
    # the six pipelines' sums: 13.5 s, 6 s of each lane; the disk lane D beside 6 s of compute at ratio r = 6 / D:
    # D + 6 (0.1 + 0.4 (r - 0.25) / 0.75) = 13.5, so D^2 - 13.7 D + 19.2 = 0, D = 12.115, (D - 6) / 6 = 1.019
    # (at one figure, 0.5, it was 0.75)
    assert step["penalties_measured"]["read_write"]["pooled"] == pytest.approx(1.0192, abs=1e-4)
    old = {"penalties_measured": {"read_write": {"penalty": 0.6, "pooled": 0.6, "se": 0.1}}}
    step = {"read_write_penalty": 0.8}
    bench_disk_tier.pool_penalties(step, old, b)  # one without pairs: the mean stands
    assert step == {"read_write_penalty": 0.8}


def test_bench_disk_tier_pairs_autos_choice_with_each_row_round_by_round(monkeypatch):
    """Auto's paired margin: within each round every row over the chosen row, a geometric mean per row over
    the rounds both ran (golden); a round the choice lost (raised) pairs nothing, and an unmeasured choice gives
    None. The rows' median rounds can put the choice far below a row that, round by round, it ties."""
    import math

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    def row(mode, target, budget, speeds):
        return [
            {"mode": mode, "target": target, "budget_bytes": budget, "round": n + 1, "samples_per_s": v}
            if v is not None
            else {"mode": mode, "round": n + 1, "error": "raised"}
            for n, v in enumerate(speeds)
        ]

    k0 = row("hotline_k0_disk", 0.95, 64, [100.0, 130.0, 100.0, None])
    k2 = row("hotline_k2_disk", 0.95, 64, [75.0, 133.0, 130.0, 500.0])
    hybrid = row("hybrid_disk", None, None, [50.0, 65.0, 60.0, 40.0])
    got = bench_disk_tier.paired_margin([hybrid, k0, k2], "hotline_k0_disk", 64)
    assert got["choice"] == "hotline_k0_disk at 95%"
    k2_mean = (0.75 * 133.0 / 130.0 * 1.3) ** (1 / 3)  # round 4 has no K=0 to pair with
    by = {t["configuration"]: t for t in got["rows"]}
    assert by["hotline_k2_disk at 95%"]["mean_over_choice"] == pytest.approx(k2_mean)
    assert by["hotline_k2_disk at 95%"]["draws"] == 3 and by["hybrid_disk"]["lowest"] == pytest.approx(0.5)
    # K=2: 0.997 of K=0 round by round, where the median rounds (100 against 130) put K=0 23% below it
    assert got["fastest"] == "hotline_k0_disk at 95%" and got["margin"] == 0.0
    faster = bench_disk_tier.paired_margin([k0, row("hotline_k2_disk", 0.95, 64, [110.0, 143.0, 110.0])],
                                           "hotline_k0_disk", 64)  # fmt: skip
    assert faster["fastest"] == "hotline_k2_disk at 95%"
    assert faster["margin"] == pytest.approx(1 - 1 / 1.1) and math.isclose(faster["rows"][0]["lowest"], 1.1)
    assert bench_disk_tier.paired_margin([k0, k2], "hotline_k2_disk", 128) is None
