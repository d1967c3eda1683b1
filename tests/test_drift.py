"""Popularity drift: drifting synthetic data, online access counts, and exact re-placement of hot rows."""

import json

import numpy as np
import pytest

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.kernels.dispatch import add_counts
from hotline.placement import Placement
from hotline.profiling.online import OnlineCounts
from tests import naive

TABLES = [400, 2000, 50, 3000]
ARCH = {"embedding_dim": 8, "bottom_mlp": [13, 16, 8], "top_mlp": [16, 1]}
BATCH, STEPS = 64, 60


@pytest.fixture(scope="module")
def drifting(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    ds = Dataset(generate(root / "ds", 6000, seed=7, table_sizes=TABLES, zipf=1.2, drift_days=6,
                          drift_rate=0.6, progress=False))  # fmt: skip
    # A static placement from the first day's rows: a quarter of each table.
    sp = ds.train.sparse[:800]
    hot = [
        np.argsort(-np.bincount(sp[:, t, 0], minlength=n), kind="stable")[: n // 10]
        for t, n in enumerate(TABLES)
    ]
    p = Placement.from_hot_ids(
        ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8, bytes_per_row=36
    )
    p.save(root / "p.npz")
    return ds, str(root / "p.npz")


def test_drifting_data_is_deterministic_and_moves_popular_rows(tmp_path):
    kw = dict(seed=3, table_sizes=[500, 800], zipf=1.2, drift_days=4, drift_rate=0.5, progress=False)
    a, b = Dataset(generate(tmp_path / "a", 4000, **kw)), Dataset(generate(tmp_path / "b", 4000, **kw))
    assert np.array_equal(a.train.sparse, b.train.sparse) and a.fingerprint == b.fingerprint
    assert a.meta["drift"]["days"] == 4 and a.meta["drift"]["day_start_rows"] == [0, 1000, 2000, 3000]
    sp = a.train.sparse[:, 1, 0]
    first, last = np.bincount(sp[:800], minlength=800), np.bincount(sp[2600:3400], minlength=800)
    top_first, top_last = set(np.argsort(-first)[:8]), set(np.argsort(-last)[:8])
    assert len(top_first & top_last) < 8  # some of the most popular rows of day 0 are no longer so
    # and without drift the stream is the one it always was (fingerprints of existing datasets unchanged)
    plain = Dataset(generate(tmp_path / "c", 4000, seed=3, table_sizes=[500, 800], zipf=1.2, progress=False))
    off = Dataset(
        generate(tmp_path / "d", 4000, seed=3, table_sizes=[500, 800], zipf=1.2, drift_days=1, progress=False)
    )
    assert plain.fingerprint == off.fingerprint and np.array_equal(plain.train.sparse, off.train.sparse)
    assert not np.array_equal(plain.train.sparse, a.train.sparse)


def test_add_counts_matches_twin():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, (7, 6)).astype(np.int32)
    offsets = np.repeat(np.array([0, 5, 10], np.int64), 2)
    counts = rng.random(15)
    want = naive.add_counts(ids, offsets, counts, 2.5)
    add_counts(ids, offsets, counts, 2.5)
    np.testing.assert_allclose(counts, want, rtol=1e-15)
    with pytest.raises(ValueError, match="float64"):
        add_counts(ids, offsets, counts.astype(np.float32), 1.0)


def test_online_counts_decay_recent_steps_weigh_more():
    c = OnlineCounts(4, decay=0.5)
    offsets = np.zeros(1, np.int64)
    for row in (0, 0, 1, 2):  # one lookup per step
        c.add(np.array([[row]], np.int32), offsets)
    # step weights, newest first: 1, 0.5, 0.25, 0.125
    np.testing.assert_allclose(c.values(), [0.25 + 0.125, 0.5, 1.0, 0.0])
    assert c.top(2).tolist() == [1, 2]


def _run(ds, placement, **kw):
    kw.setdefault("num_batches", STEPS)
    cfg = TrainConfig(mode=kw.pop("mode", "hotline"), placement_path=placement, mini_batch_size=BATCH,
                      progress=False, learning_rate=0.05, print_freq=1, **ARCH, **kw)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        stats = list(tr.progress(tr.batches()))
        replaced = [r for r in tr.history if r.get("kind") == "replace"]
        return (np.array([s.loss_sum for s in stats]), tr.named_arrays(), stats), replaced
    finally:
        tr.close()


def assert_equivalent(ref, got, rtol=1e-5):
    """Every step's loss and every parameter within ``rtol`` of each tensor's scale (summation order)."""
    np.testing.assert_allclose(got[0], ref[0], rtol=rtol)
    assert ref[1].keys() == got[1].keys()
    for name, a in ref[1].items():
        scale = max(float(np.abs(a).max()), 1e-12)
        assert float(np.abs(got[1][name] - a).max()) <= rtol * scale, name


def _share(stats):
    return sum(s.counters["hot_lookups"] for s in stats) / sum(s.counters["lookups"] for s in stats)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("lookahead", [0, 2])
def test_replacement_is_exact_and_follows_the_data(drifting, optimizer, lookahead):
    ds, placement = drifting
    device, _ = _run(ds, None, mode="device", optimizer=optimizer)
    static, none = _run(ds, placement, optimizer=optimizer, lookahead=lookahead)
    adaptive, replaced = _run(ds, placement, optimizer=optimizer, lookahead=lookahead, replace_every=10)
    assert none == [] and len(replaced) == STEPS // 10 - 1
    assert sum(r["promoted"] for r in replaced) > 0 and all(r["promoted"] == r["demoted"] for r in replaced)
    assert_equivalent(device, adaptive)
    if lookahead:  # the fused path moves values only: bit-identical to device mode, re-placements or not
        for name, a in device[1].items():
            assert np.array_equal(a, adaptive[1][name]), name
    assert _share(adaptive[2][10:]) > _share(static[2][10:]) + 0.02


def test_replace_auto_triggers_on_drift(drifting):
    ds, placement = drifting
    device, _ = _run(ds, None, mode="device", optimizer="sgd")
    got, replaced = _run(ds, placement, optimizer="sgd", lookahead=2, replace="auto", replace_threshold=0.02)
    assert replaced and all(r["hot_share_before"] < r["promised"] - 0.02 for r in replaced)
    assert_equivalent(device, got)
    # Where a re-placement falls depends on the data only, never on how far the look-ahead thread had run.
    _, again = _run(ds, placement, optimizer="sgd", lookahead=2, replace="auto", replace_threshold=0.02)
    assert [r["step"] for r in again] == [r["step"] for r in replaced]
    # Beside a --replace-every schedule whose boundary is further off, auto still re-places when it decides.
    _, both = _run(ds, placement, optimizer="sgd", lookahead=2, replace="auto", replace_threshold=0.02,
                   replace_every=10 * STEPS)  # fmt: skip
    assert [r["step"] for r in both] == [r["step"] for r in replaced]


def test_cli_flags_and_refusals(drifting, tmp_path, capsys):
    ds, placement = drifting
    common = ["train", str(ds.path), "--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8",
              "--arch-mlp-top", "16-1", "--no-progress", "--num-batches", "30", "--eval-max-samples", "100"]  # fmt: skip
    metrics = tmp_path / "m.jsonl"
    out = tmp_path / "in-force.npz"
    assert main([*common, "--mode", "hotline", "--placement", placement, "--replace-every", "10",
                 "--metrics", str(metrics), "--save-placement", str(out)]) == 0  # fmt: skip
    kinds = [json.loads(line)["kind"] for line in metrics.read_text().splitlines()]
    assert kinds.count("replace") == 2
    saved, initial = Placement.load(out, dataset=ds), Placement.load(placement)
    assert saved.num_hot == initial.num_hot  # the same budget
    assert any(not np.array_equal(a, b) for a, b in zip(saved.hot_ids, initial.hot_ids))  # other rows
    assert main([*common, "--replace-every", "10"]) == 2  # device mode has no hot rows to move
    assert "--mode hotline only" in capsys.readouterr().err


def test_bench_drift_smoke(tmp_path):
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import bench_drift

        out = tmp_path / "d.json"
        assert bench_drift.main(["--smoke", "--threads", "1", "--json", str(out)]) == 0
    finally:
        sys.path.remove(str(bench))
        sys.modules.pop("bench_drift", None)
    rows = {r["placement"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["adaptive"]["replacements"] > 0 and rows["static"]["replacements"] == 0
    assert rows["adaptive"]["hot_lookup_share"] > rows["static"]["hot_lookup_share"]
    assert rows["counting only"]["hot_lookup_share"] == rows["static"]["hot_lookup_share"]


def _assert_dump_equals_device(ds, got, optimizer):
    """A rank-0 dump (``train_and_dump``) equals one process in device mode: every step's loss and every
    parameter within 1e-5 of its tensor's scale."""
    device, _ = _run(ds, None, mode="device", optimizer=optimizer)
    np.testing.assert_allclose(got["losses"], device[0], rtol=1e-5)
    for name, a in device[1].items():
        scale = max(float(np.abs(a).max()), 1e-12)
        assert float(np.abs(got[name] - a).max()) <= 1e-5 * scale, (optimizer, name)


def test_two_ranks_replace_the_same_rows_and_stay_exact(drifting, tmp_path):
    """--replace-every on 2 gloo ranks: global counts, the same re-placement on every rank (hot replicas
    identical, cold shards consistent), parameters equal one process in device mode (SGD at K=0, row-wise
    Adagrad at K=2)."""
    from ranks import spawn, train_and_dump

    ds, placement = drifting
    cases = {"sgd": 0, "rowwise-adagrad": 2}
    jobs = []
    for opt, k in cases.items():
        cfg = TrainConfig(mode="hotline", placement_path=placement, mini_batch_size=BATCH, num_batches=STEPS,
                          progress=False, learning_rate=0.05, optimizer=opt, replace_every=10, lookahead=k,
                          **ARCH)  # fmt: skip
        jobs.append((cfg, str(ds.path), str(tmp_path / f"{opt}.npz")))
    spawn(2, train_and_dump, jobs)
    for opt in cases:
        got = np.load(tmp_path / f"{opt}.npz")
        kinds = list(got["bytes_kinds"])
        for kind in ("bytes_sent_replace_counts", "bytes_sent_replace_rows"):  # the re-placements ran
            assert kind in kinds and got["bytes_sent"][:, kinds.index(kind)].sum() > 0, kind
        _assert_dump_equals_device(ds, got, opt)


def test_two_ranks_replace_auto_on_the_steps_one_process_does(drifting, tmp_path):
    """--replace auto on 2 gloo ranks decides from the hot-lookup share of both ranks' lookups: it re-places
    at the very steps one process does on the global batch (K=0 and K=2, where the look-ahead producers must
    stop the segment at the same step and give back a batch taken too many), and stays equal to device mode."""
    from ranks import spawn, train_and_dump

    ds, placement = drifting
    cases = {"sgd": 0, "rowwise-adagrad": 2}
    jobs = []
    for opt, k in cases.items():
        cfg = TrainConfig(mode="hotline", placement_path=placement, mini_batch_size=BATCH, num_batches=STEPS,
                                progress=False, learning_rate=0.05, optimizer=opt, replace="auto",
                                replace_threshold=0.02, lookahead=k, **ARCH)  # fmt: skip
        jobs.append((cfg, str(ds.path), str(tmp_path / f"{opt}.npz")))
    spawn(2, train_and_dump, jobs)
    for opt, k in cases.items():
        got = np.load(tmp_path / f"{opt}.npz")
        _, replaced = _run(ds, placement, optimizer=opt, lookahead=k, replace="auto", replace_threshold=0.02)
        assert replaced, opt  # the drift triggers it
        assert list(got["replace_steps"]) == [r["step"] for r in replaced], opt
        assert len(got["losses"]) == STEPS  # no batch lost at a boundary
        _assert_dump_equals_device(ds, got, opt)


@pytest.mark.parametrize("lookahead", [0, 2])
def test_resume_across_a_replacement_is_bit_exact(drifting, tmp_path, lookahead):
    """A checkpoint holds the placement in force and the online counts: a run stopped after a re-placement
    and resumed ends bit for bit where a straight run does (same schedule, same counts, same placements)."""
    ds, placement = drifting

    def fit(**kw):
        cfg = TrainConfig(mode="hotline", placement_path=placement, mini_batch_size=BATCH, progress=False,
                          learning_rate=0.05, optimizer="rowwise-adagrad", lookahead=lookahead, replace_every=10,
                          eval_max_samples=64, **ARCH, **kw)  # fmt: skip
        tr = Trainer(cfg, ds)
        try:
            tr.fit()
            return tr.named_arrays(), [r["step"] for r in tr.history if r.get("kind") == "replace"]
        finally:
            tr.close()

    straight, steps = fit(num_batches=STEPS)
    assert steps == [10, 20, 30, 40, 50]
    ck = tmp_path / "ck"
    _, first = fit(num_batches=35, checkpoint_dir=str(ck), checkpoint_every=35)
    resumed, second = fit(num_batches=STEPS, checkpoint_dir=str(ck), resume=True)
    assert first == [10, 20, 30] and second == [40, 50]  # on the schedule of step 0, not of the resume
    for name, a in straight.items():
        assert np.array_equal(a, resumed[name]), name


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
def test_replacement_equals_the_independent_reference(drifting, optimizer):
    """Re-placing every 10 steps (K=2, drifting data) ends where tests/reference.py (a plain DLRM sharing no
    code with Hotline) does from the same initial parameters."""
    from tests.reference import ReferenceDLRM, max_rel_diff

    ds, placement = drifting
    cfg = TrainConfig(mode="hotline", placement_path=placement, mini_batch_size=BATCH, num_batches=STEPS,
                      progress=False, learning_rate=0.05, optimizer=optimizer, replace_every=10, lookahead=2,
                      **ARCH)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        start = {k: v.copy() for k, v in tr.named_arrays().items()}  # (model arrays are views)
        list(tr.progress(tr.batches()))
        assert [r for r in tr.history if r.get("kind") == "replace"]
        got = tr.named_arrays()
    finally:
        tr.close()
    ref = ReferenceDLRM(start, "dot", optimizer, 0.05)
    ref.train(ds.path, BATCH, num_batches=STEPS)
    worst, name = max_rel_diff(ref.named_arrays(), got)
    assert worst <= (1e-6 if optimizer == "sgd" else 1e-5), (worst, name)


def test_a_segment_stopped_by_another_rank_gives_its_batch_back(drifting, monkeypatch):
    """Look-ahead on N ranks: when another rank's producer stops at step j (its gate closed), this rank's
    producer may have taken batch j already; it goes back to the source, and the next segment starts with it.
    Simulated on one process: the look-ahead channel says "stop" at step 5 although this rank has a batch."""
    import contextlib

    from hotline.pipeline.replacement import _Gate, _Source

    ds, placement = drifting
    cfg = TrainConfig(mode="hotline", placement_path=placement, mini_batch_size=BATCH, num_batches=12,
                      progress=False, learning_rate=0.05, lookahead=2, **ARCH)  # fmt: skip
    straight = Trainer(cfg, ds)
    try:
        want = [s.loss_sum for s in straight.progress(straight.batches())]
    finally:
        straight.close()
    tr = Trainer(cfg, ds)
    try:
        cold = tr.mode.cold
        real = cold.lookahead

        class OtherRankStopsAt5:
            def __init__(self, comm):
                self.comm, self.calls = comm, 0

            def all_ok(self, ok):
                self.calls += 1
                return ok and self.calls <= 5 and self.comm.all_ok(ok)

        @contextlib.contextmanager
        def lookahead():
            with real() as comm:
                yield OtherRankStopsAt5(comm)

        monkeypatch.setattr(cold, "lookahead", lookahead)
        batches = list(tr.batches())
        source = _Source(batches)
        gate = _Gate(source, None)
        first = [s.loss_sum for s in tr.progress(gate)]
        assert len(first) == 5 and gate.taken == 5  # batch 5 was taken by the producer, then given back
        monkeypatch.setattr(cold, "lookahead", real)
        rest = [s.loss_sum for s in tr.progress(_Gate(source, None))]
    finally:
        tr.close()
    assert len(first) + len(rest) == len(batches) == 12
    np.testing.assert_array_equal(np.array(first + rest), np.array(want))  # nothing lost, nothing repeated
