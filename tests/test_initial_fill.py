"""The disk file's initial fill (``hotline.tiers.initial_fill``): the same numbers every mode starts from, written
in file order by streams or by the fallback, the hot rows' weights from the same draws, and start-up memory that
does not grow with the rows (the file's order freed before the fill, the profile's counted rows carried instead
of a count of every row)."""

import tracemalloc
import weakref

import numpy as np
import pytest

import hotline.tiers.initial_fill as fill_mod
from hotline.kernels.profile import order_by_count
from hotline.models.dlrm import init_embedding_table
from hotline.table_layout import TableLayout
from hotline.tiers.base import initial_tables
from hotline.tiers.disk_pages import RowPositions
from hotline.tiers.disk_store import DiskColdStore, DiskRows, popularity_order
from hotline.tiers.sparse_optim import SparseOptimizer


@pytest.mark.parametrize("dim", [1, 3, 8])
def test_a_block_is_the_rows_of_the_whole_table(dim):
    whole = init_embedding_table(1000, dim, 5, 2)
    for lo, n in [(0, 1000), (0, 1), (1, 7), (333, 250), (999, 1)]:
        rec = fill_mod.initial_block(1000, dim, 5, 2, lo, n, state_floats=2)
        assert np.array_equal(rec[:, :dim], whole[lo : lo + n])
        assert not rec[:, dim:].any()


def _order(layout, rng, rank, N, hot, shuffled=False):
    n = layout.num_rows
    local = len(range(rank, n, N))
    if shuffled is True:  # no long ascending run: the fallback
        return rng.permutation(local).astype(np.int32)
    counts = np.zeros(n, np.uint32)
    np.add.at(counts, rng.zipf(1.3, 6000) % n, 1)
    counted = order_by_count(counts)
    if shuffled == "tables":  # the never-counted rows table by table, the last table first: a run each
        once = np.arange(len(layout.table_sizes))
        return popularity_order(None, local, hot, layout.table_sizes, counted=counted, once=once)
    return popularity_order(None, local, hot[hot % N == rank] // N, counted=counted[counted % N == rank] // N)


@pytest.mark.parametrize(
    "sizes, dim, optimizer, N, shuffled",
    [
        ([5000, 300, 17, 9000], 8, "rowwise-adagrad", 1, False),
        ([5000, 300, 17, 9000], 5, "adam", 1, False),
        ([5000, 300, 17, 9000], 6, "rowwise-adagrad", 1, "tables"),
        ([777, 3000, 4001], 4, "sgd", 2, False),
        ([777, 3000, 4001], 3, "adagrad", 3, False),
        ([2000, 1500], 4, "rowwise-adagrad", 1, True),
    ],
)
@pytest.mark.parametrize("lazy", [False, True])
def test_the_file_holds_the_initial_tables(tmp_path, monkeypatch, sizes, dim, optimizer, N, shuffled, lazy):
    """Eager: the file holds every initial record. Lazy: it holds none (all pending) and reads as if it did."""
    # small streams and blocks, so that small tables have several of each, short runs and shared pages
    monkeypatch.setattr(fill_mod, "MIN_STREAM_ROWS", 24)
    monkeypatch.setattr(fill_mod, "BLOCK_FLOATS", 1000)
    rng = np.random.default_rng(len(sizes) + dim)
    layout = TableLayout(sizes)
    hot = rng.choice(layout.num_rows, 400, replace=False)
    expect = initial_tables(layout, dim, 3)
    for r in range(N):
        order = _order(layout, rng, r, N, hot, shuffled)
        rows = DiskRows(
            tmp_path / f"f{r}.bin", order.shape[0], dim, SparseOptimizer(optimizer, 0.1, dim=dim), order
        )
        try:
            streamed = fill_mod._streamed(rows.file)
            if streamed is not None:  # its plan, then the fill makes its own
                assert len([s for s in streamed.seg_stream if s is not None]) >= 2 and streamed.short_rows > 0
                assert len(streamed.mains) == (2 if shuffled == "tables" else 1)  # tables 3 and 0: long runs
                streamed.discard()
            assert (streamed is None) == (shuffled is True or not rows.file.direct)
            assert isinstance(rows.file.positions, RowPositions) != (shuffled is True)
            hot_w = rows.fill_initial(layout, 3, r, N, hot=hot, lazy=lazy)
            assert (rows.file.pending is not None) == lazy
            if lazy:
                assert rows.file.pending.count() == order.shape[0]
            w, s = rows.all()
            assert np.array_equal(w, expect[r::N])
            assert not np.asarray(s).any()
            assert np.array_equal(hot_w, expect[hot])
            data = (tmp_path / f"f{r}.bin").read_bytes()
            pad = data[order.shape[0] * rows.file.record : rows.file.size]
            assert pad == bytes(len(pad))  # past the last record: zeros, as the file was made
            held = np.frombuffer(data[: order.shape[0] * rows.file.record], np.float32)
            assert held.any() != lazy  # lazily: nothing written
        finally:
            rows.close()


def _fill_peak(tmp_path, n: int) -> int:
    layout = TableLayout([n // 2, n - n // 2])
    hot = np.arange(0, n, 50)
    rows = DiskRows(tmp_path / f"m{n}.bin", n, 8, SparseOptimizer("rowwise-adagrad", 0.1, dim=8),
                    popularity_order(None, n, hot, counted=np.arange(1, n, 97)))  # fmt: skip
    try:
        tracemalloc.start()
        rows.fill_initial(layout, 0, hot=hot, lazy=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        rows.close()
    return peak - (hot.shape[0] * 8 * 4 + hot.nbytes * 3)  # less the hot rows' weights and their order


def test_the_fills_memory_does_not_grow_with_the_rows(tmp_path, monkeypatch):
    """The fill holds the blocks in flight, the streams' buffers and the records of short runs: the same at 1M and
    4M rows, with blocks small enough that both fills keep the pipeline full."""
    monkeypatch.setattr(fill_mod, "BLOCK_FLOATS", 1 << 16)
    monkeypatch.setattr(fill_mod, "STREAM_BYTES", 8 << 20)
    small, large = _fill_peak(tmp_path, 1 << 20), _fill_peak(tmp_path, 1 << 22)
    assert large < small + (2 << 20), (small, large)  # a byte a row would be 3 MiB more
    blocks = (2 * fill_mod.fill_threads() + 1) * (1 << 16) * 5 + fill_mod.fill_threads() * (1 << 16) * 8
    assert large < blocks + (8 << 20) + (4 << 20), (large, blocks)


def test_the_order_is_freed_before_the_fill(tmp_path, monkeypatch):
    """The store makes the order from the function it is given, writes it to its file, and holds only that file
    through the fill (the array is 4 bytes a row)."""
    layout = TableLayout([3000, 5000])
    made = []

    def make():
        order = popularity_order(None, layout.num_rows, np.arange(0, 8000, 9))
        made.append(weakref.ref(order))
        return order

    alive = []
    real = DiskRows.fill_initial

    def watched(self, *a, **k):
        alive.append(made[0]() is not None)
        return real(self, *a, **k)

    monkeypatch.setattr(DiskRows, "fill_initial", watched)
    store = DiskColdStore(tmp_path / "c.bin", layout, 4, SparseOptimizer("sgd", 0.1, dim=4), 1, make,
                          hot=np.arange(0, 8000, 9))  # fmt: skip
    try:
        assert alive == [False]
        assert np.array_equal(store.hot_initial, initial_tables(layout, 4, 1)[::9])
    finally:
        store.close()


def test_a_profiled_placement_carries_the_counted_rows_not_a_count_of_every_row(tmp_path):
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.placement import Placement
    from hotline.profiling.profiler import Profiler

    ds = Dataset(generate(tmp_path / "d", 2000, seed=1, table_sizes=[40_000, 900, 30_000], progress=False))
    profile = Profiler(progress=False).profile(ds)
    placement = Placement.profiled(profile, 4096)
    order = placement.sample_order
    assert order.shape[0] == profile.num_accessed < ds.total_rows // 4  # the sample's rows, not every row
    assert np.array_equal(order, order_by_count(profile.counts))
    assert placement.take_sample_order()[0] is order and placement.sample_order is None


def test_build_mode_reports_the_start_up_phases(tmp_path):
    from hotline import TrainConfig
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.tiers.build import build_mode
    from hotline.training.placing import placement_for

    ds = Dataset(generate(tmp_path / "d", 1500, seed=2, table_sizes=[3000, 50, 8000], progress=False))
    (tmp_path / "c").mkdir()
    cfg = TrainConfig(mode="hotline", cold_store="disk", cold_dir=str(tmp_path / "c"), hbm_budget=16 << 10,
                      optimizer="rowwise-adagrad", embedding_dim=4, bottom_mlp=[13, 8, 4], top_mlp=[8, 1],
                      mini_batch_size=64, progress=False, quiet=True)  # fmt: skip
    mode = build_mode(cfg, ds, placement_for(cfg, ds, progress=False))
    try:
        assert set(mode.startup_s) == {"profile_s", "count_s", "order_s", "fill_s", "store_s"}
        assert mode.startup_s["store_s"] >= mode.startup_s["fill_s"] > 0 and mode.startup_s["profile_s"] > 0
    finally:
        mode.close()


@pytest.mark.parametrize("seed", range(4))
def test_runs_are_the_maximal_ascending_runs(seed):
    rng = np.random.default_rng(seed)
    order = np.concatenate(
        [np.sort(rng.choice(10**6, rng.integers(1, 40), replace=False)) for _ in range(30)]
    )
    for lo, hi in [(0, order.shape[0]), (3, order.shape[0] - 5), (7, 7)]:
        part = order[lo:hi]
        cuts = [i for i in range(1, part.shape[0]) if part[i] <= part[i - 1]]
        want = (
            (np.array([0, *cuts]) + lo, np.array([*cuts, part.shape[0]]) + lo) if part.shape[0] else ([], [])
        )
        for chunk in (1, 5, 1 << 22):
            starts, stops = fill_mod._runs(order, lo, hi, chunk)
            assert starts.tolist() == list(want[0]) and stops.tolist() == list(want[1])


def test_the_eager_fill_draws_on_the_configured_threads():
    """``--threads`` sets the Numba threads of the run's thread; the eager fill draws on no more."""
    from hotline.pipeline.threads import numba_threads

    with numba_threads(1):
        assert fill_mod.fill_threads() == 1
    assert 1 <= fill_mod.fill_threads() <= 4
