"""The disk cold store's file (``--cold-store disk``): records of a row and its optimizer state in a
popularity order, the header, 4 KiB pages read and written in place, a fetch's pages tracked until its
write, and the stores (one rank or sharded) that take a step's rows from them."""

import os

import numpy as np
import pytest
import torch

from hotline.models.dlrm import init_embedding_table
from hotline.table_layout import OPTIMIZERS, bytes_per_row, state_floats_per_row
from hotline.tiers.disk_file import PAGE, RowFile, pages_per_record
from hotline.tiers.disk_store import popularity_order, table_chunks
from hotline.tiers.store_files import made_by_hotline, manifest_path, order_path


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
    here record by record), which the cost model's records_tier takes from the optimizer's record."""
    from hotline.costmodel.choose import records_tier

    for record in (16, 100, 1540, PAGE, PAGE + 4, 3 * PAGE - 8):
        start = np.arange(PAGE, dtype=np.int64) * record  # a whole period of offsets within a page
        spans = (start + record - 1) // PAGE - start // PAGE + 1
        assert pages_per_record(record) == pytest.approx(spans.mean())
    assert pages_per_record(PAGE) == 1.0 and pages_per_record(64) == 1.0
    for opt in OPTIMIZERS:
        tier = records_tier(128, opt, cached_share=0.25)
        assert tier.pages_per_cold_row == pytest.approx(pages_per_record(bytes_per_row(128, opt)))
        assert tier.cached_share == 0.25
    # Adam at dim 128: 1540-byte records at offsets 4 bytes apart, 384 of each 1024 across a page boundary
    assert records_tier(128, "adam").pages_per_cold_row == 1.375


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
