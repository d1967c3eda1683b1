"""Device phase timing: the interval arithmetic (busy share, copy/compute overlap) and the host twin."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotline.pipeline.gpu_timing import StreamPhases, intersection_length, union_length


def _naive_cover(intervals, step=0.25):
    """Length covered, by counting grid cells (intervals on a 0.25 grid)."""
    cells = set()
    for a, b in intervals:
        cells.update(range(round(a / step), round(b / step)))
    return len(cells) * step


grid = st.integers(0, 40).map(lambda x: x * 0.25)
interval = st.tuples(grid, grid).map(lambda p: (min(p), max(p)))


@given(st.lists(interval, max_size=12))
def test_union_length_matches_a_grid_count(intervals):
    assert union_length(intervals) == pytest.approx(_naive_cover(intervals))


@given(st.lists(interval, max_size=8), st.lists(interval, max_size=8))
def test_intersection_length_matches_a_grid_count(xs, ys):
    def cells(ivs):
        return {c for a, b in ivs for c in range(round(a * 4), round(b * 4))}

    assert intersection_length(xs, ys) == pytest.approx(len(cells(xs) & cells(ys)) * 0.25)


def test_golden_summary():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert intersection_length([(0, 2)], [(1, 4)]) == 1


def test_host_twin_records_phases_in_order():
    phases = StreamPhases("cpu")
    with phases.phase("h2d"):
        time.sleep(0.02)
    with phases.phase("compute"):
        time.sleep(0.03)
    s = phases.summary()
    assert set(s["phase_s"]) == {"h2d", "compute"}
    assert s["phase_s"]["compute"] >= 0.03 and s["phase_s"]["h2d"] >= 0.02
    assert s["copy_overlap_share"] == 0.0  # one after the other on the host
    assert 0.9 <= s["busy_share"] <= 1.0


def test_tiered_mode_reports_phases_on_the_host_twin(tmp_path):
    """A hotline run with phase recording on: every compute-stream phase and the copy-in are recorded."""
    from hotline import TrainConfig, Trainer
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from tests.test_equivalence import ARCH, BATCH, TABLES, _placement

    ds = Dataset(generate(tmp_path / "ds", 2000, seed=1, table_sizes=TABLES, zipf=1.3, progress=False))
    cfg = TrainConfig(mode="hotline", placement_path=_placement(ds, "profiled", "sgd", tmp_path / "p.npz"),
                      mini_batch_size=BATCH, num_batches=6, progress=False, lookahead=0, **ARCH)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        tr.mode.phases = StreamPhases("cpu")
        list(tr.progress(tr.batches()))
        s = tr.mode.phases.summary()
    finally:
        tr.close()
    assert {"h2d", "popular_compute", "non_popular_compute", "sparse_update", "dense_update"} <= set(
        s["phase_s"]
    )
    assert all(v >= 0 for v in s["phase_s"].values()) and 0 < s["busy_share"] <= 1
