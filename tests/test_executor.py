"""The pipelined executor: errors cross threads with their tracebacks, nothing outlives a run."""

import threading
import traceback

import numpy as np
import pytest

import naive
from hotline import TrainConfig, Trainer
from hotline.datasets.synthetic import generate
from hotline.kernels.claim_book import UNKNOWN_SLOT, RowsInFlight
from hotline.pipeline.executor import Executor, overlap_ratio
from hotline.placement import Placement


@pytest.fixture(scope="module")
def trainer_factory(tmp_path_factory):
    root = tmp_path_factory.mktemp("exec")
    ds = generate(root / "ds", 3000, seed=1, table_sizes=[50, 20, 300], zipf=1.2, progress=False)

    def make(lookahead=2):
        from hotline.datasets.format import Dataset

        d = Dataset(ds)
        hot = [np.arange(n // 3) for n in d.table_sizes]
        placement = Placement.from_hot_ids(
            d.table_sizes, hot, dataset_fingerprint=d.fingerprint, embedding_dim=8
        )
        placement.save(root / "p.npz", force=True)  # every trainer this factory makes writes it again
        cfg = TrainConfig(
            mode="hotline",
            placement_path=str(root / "p.npz"),
            lookahead=lookahead,
            embedding_dim=8,
            bottom_mlp=[13, 16, 8],
            top_mlp=[16, 1],
            mini_batch_size=32,
            progress=False,
            num_batches=40,
        )
        return Trainer(cfg, d)

    return make


def _hotline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("hotline-")]


def test_worker_exception_reaches_main_with_traceback(trainer_factory):
    tr = trainer_factory()

    def batches():
        yield from list(tr.batches())[:3]
        raise RuntimeError("bad batch source")

    with pytest.raises(RuntimeError, match="bad batch source") as info:
        list(tr.progress(batches()))
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "batches" in frames  # the original frame on the worker thread is kept
    assert _hotline_threads() == []


def test_out_of_range_id_in_worker_names_table(trainer_factory):
    tr = trainer_factory()
    good = list(tr.batches())[:2]
    bad = good[1]
    bad.sparse[5, 2, 0] = 10_000
    with pytest.raises(IndexError, match="table 2: id 10000"):
        list(tr.progress(iter(good)))
    assert _hotline_threads() == []


def test_interrupt_in_main_thread_stops_workers(trainer_factory):
    tr = trainer_factory(lookahead=4)
    calls = {"n": 0}
    compute = tr._compute_prepared

    def interrupted(prep):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return compute(prep)

    tr._compute_prepared = interrupted
    with pytest.raises(KeyboardInterrupt):
        list(tr.progress(tr.batches()))
    assert _hotline_threads() == []


def test_early_close_and_full_run_leave_nothing(trainer_factory):
    tr = trainer_factory()
    gen = tr.progress(tr.batches())
    next(gen)
    gen.close()
    assert _hotline_threads() == []
    stats = list(trainer_factory().progress(trainer_factory().batches()))
    assert len(stats) == 40 and all("stall" in s.times and "write_back" in s.times for s in stats)
    assert _hotline_threads() == []


def test_the_rows_in_flight_match_the_twin_over_many_steps():
    """The hash-table claim book against its twin over a dense (step, slot) array per row, step after step with
    the landed steps moving on: stale slots, their holder steps and the rows' slots in the holders' working sets.
    The table is rebuilt as it fills (keeping the live steps only), so it stays sized by the rows in flight."""
    rng = np.random.default_rng(0)
    rows, depth = 100_000, 4
    held = [(-1, UNKNOWN_SLOT)] * rows
    book = RowsInFlight()
    flagged = 0
    for step in range(60):
        ws = rng.choice(np.r_[rng.integers(0, rows, 400), rng.integers(0, 50, 100)], 300, replace=False)
        ws = np.unique(ws)[rng.permutation(np.unique(ws).shape[0])]
        applied = max(0, step - depth)  # the steps before it have landed
        expect = naive.claim_rows(ws, held, step, applied)
        held = expect[3]
        stale, owner, slot = book.claim(ws, step, applied)
        assert (stale.tolist(), owner.tolist(), slot.tolist()) == expect[:3]
        flagged += len(expect[0])
        probe = rng.integers(0, rows, 200)
        live = [(s << 32) | t if s >= applied else None for s, t in (held[r] for r in probe.tolist())]
        got = book.entries(probe).tolist()
        assert all(g == e for g, e in zip(got, live) if e is not None)
        assert all(g == -1 or (g >> 32) < applied for g, e in zip(got, live) if e is None)
    assert flagged > 100  # the look-ahead overlapped (the popular rows 0..49)
    in_flight = (depth + 1) * 300
    assert book.keys.shape[0] <= 8 * in_flight  # sized by the rows in flight, not the 100,000 rows
    with pytest.raises(ValueError, match="step must be in"):
        book.claim(np.array([1]), 1 << 31, 3)


def test_the_claim_book_bounds_the_step_on_both_paths():
    """The claim book's repeated-rows path (``distinct=False``, the sharded store) packs the step as the
    distinct path does and refuses the same steps, before it records anything."""
    from hotline.tiers.cold_store import ClaimBook

    book = ClaimBook(10)
    book.start_claims()
    rows = np.array([1, 4, 4, 7])
    assert book.claim(rows, 3, distinct=False).tolist() == []
    assert [int(h) >> 32 for h in book.held(np.array([1, 4, 7]))] == [3, 3, 3]
    assert book.claim(np.array([4, 5]), 4, distinct=False).tolist() == [0]  # step 3 has not landed
    assert int(book.held(np.array([4]))[0]) & UNKNOWN_SLOT == UNKNOWN_SLOT
    before = book.held(np.arange(10))
    for step, distinct in [(1 << 31, False), (-1, False), (1 << 31, True)]:
        with pytest.raises(ValueError, match="step must be in"):
            book.claim(np.array([2, 2]) if not distinct else np.array([2]), step, distinct=distinct)
    assert np.array_equal(book.held(np.arange(10)), before)


def test_overlap_ratio():
    assert overlap_ratio({"gather": 2.0, "stall": 0.5}) == 0.75
    assert overlap_ratio({"gather": 1.0, "stall": 3.0}) == 0.0
    assert overlap_ratio({}) == 1.0
    with pytest.raises(ValueError):
        Executor.__init__(object.__new__(Executor), mode=None, compute_step=None, lookahead=-1)
