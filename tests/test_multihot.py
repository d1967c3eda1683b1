"""Variable-length multi-hot bags (per-table bag sizes, shorter bags padded with -1) end to end: kernels against
their twins, every training mode against device mode (as the exactness tests do for fixed bags) and against the
independent reference, evaluation, checkpoints, export; and the learning-rate schedule (golden values, and
applied to the dense and sparse rates as the reference applies it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference import ReferenceDLRM, max_rel_diff, noise_floor, random_params

import naive
from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.dispatch import Dispatcher
from hotline.kernels import profile as kp
from hotline.placement import Placement
from hotline.table_layout import PAD_ID, BagLayout, TableLayout
from hotline.tiers.base import bag_pool
from hotline.training.schedule import LRSchedule

TABLES = [30, 200, 12, 500, 60]
BAGS = [1, 3, 2, 5, 4]
BATCH, STEPS, LR, DIM = 64, 14, 0.05, 8
BOTTOM, TOP = [13, 16, 8], [16, 1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihot")
    ds = Dataset(generate(root / "var", 1400, seed=5, table_sizes=TABLES, bag_sizes=BAGS, variable_bags=True,
                          zipf=1.2, progress=False))  # fmt: skip
    init = root / "init.npz"
    np.savez(init, **random_params(TABLES, DIM, BOTTOM, TOP, "dot", seed=4))
    sp = ds.bags.flat(np.asarray(ds.train.sparse[: BATCH * 4]))
    hot = []
    for t, n in enumerate(TABLES):
        ids = sp[:, ds.bags.bag_start[t] : ds.bags.bag_start[t + 1]]
        counts = np.bincount(ids[ids >= 0], minlength=n)
        hot.append(np.argsort(-counts, kind="stable")[: max(1, n * 2 // 5)])
    places = {}
    for opt in ("sgd", "rowwise-adagrad"):
        p = Placement.from_hot_ids(TABLES, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=DIM,
                                   bytes_per_row=4 * DIM + (4 if opt != "sgd" else 0))  # fmt: skip
        places[opt] = root / f"placement-{opt}.npz"
        p.save(places[opt])
    return ds, init, places


def _config(setup, mode, opt, k=0, micro="auto", **kw) -> TrainConfig:
    ds, init, places = setup
    return TrainConfig(
        mode=mode, lookahead=k, micro_batches=micro, optimizer=opt, learning_rate=LR, mini_batch_size=BATCH,
        num_batches=kw.pop("num_batches", STEPS), progress=False, embedding_dim=DIM, bottom_mlp=BOTTOM, top_mlp=TOP,
        init_params_path=str(init), placement_path=str(places[opt]) if mode == "hotline" else None, **kw,
    )  # fmt: skip


_runs: dict = {}


def _run(setup, name, opt, **kw):
    """(losses, parameters, val metrics, summed counters) of one mode's run (cached)."""
    key = (name, opt, tuple(sorted(kw.items())))
    if key not in _runs:
        mode, k, micro = MODES[name]
        tr = Trainer(_config(setup, mode, opt, k, micro, **kw), setup[0])
        tr.mode.device_updates = name.endswith("torch-updates")
        try:
            stats = list(tr.progress(tr.batches()))
            counters = {c: sum(s.counters.get(c, 0) for s in stats) for c in ("lookups", "popular_samples")}
            _runs[key] = ([float(s.loss_sum) for s in stats], tr.named_arrays(), tr.evaluate("val"), counters)
        finally:
            tr.close()
    return _runs[key]


# name -> (mode, look-ahead, micro-batches); bit-identical to device except the split micro-batches
MODES = {
    "device": ("device", 0, "auto"),
    "hybrid": ("hybrid", 0, "auto"),
    "hotline-k0-split": ("hotline", 0, "split"),
    "hotline-k0-fused": ("hotline", 0, "fused"),
    "hotline-k2": ("hotline", 2, "auto"),
    "hotline-k2-torch-updates": ("hotline", 2, "auto"),
}
BIT_IDENTICAL = {"device", "hybrid", "hotline-k0-fused", "hotline-k2"}


def test_the_dataset_has_variable_bags(setup):
    ds = setup[0]
    sp = np.asarray(ds.train.sparse)
    assert ds.padded and sp.shape[1] == sum(BAGS) and (sp == PAD_ID).any()
    lengths = [(sp[:, s:e] != PAD_ID).sum(1) for s, e in zip(ds.bags.bag_start[:-1], ds.bags.bag_start[1:])]
    assert all(len(np.unique(n)) == b for n, b in zip(lengths, BAGS))  # every length 1..L_t occurs


def test_bag_pool_sums_the_real_ids_of_each_bag():
    bags = BagLayout(TableLayout([4, 5, 6]), [1, 3, 2], padded=True)
    rows = torch.arange(2 * 6 * 2, dtype=torch.float32).view(12, 2)
    rows[[2, 3, 11]] = 0.0  # padding slots hold zero rows
    pooled = bag_pool(rows, bags)
    expect = torch.stack([torch.stack([r[0], r[1:4].sum(0), r[4:6].sum(0)]) for r in rows.view(2, 6, 2)])
    assert torch.equal(pooled, expect)


def test_profile_kernels_skip_padding_as_their_twins(setup):
    ds = setup[0]
    sp = np.asarray(ds.train.sparse[:300])
    counts = kp.lookup_counts(sp, TABLES, bag_sizes=BAGS, padded=True)
    np.testing.assert_array_equal(counts, naive.profile_lookup_counts(sp, TABLES, BAGS))
    assert counts.sum() == np.count_nonzero(sp != PAD_ID)
    rank = np.random.default_rng(0).permutation(sum(TABLES))
    np.testing.assert_array_equal(
        kp.sample_max_rank(sp, TABLES, rank, bag_sizes=BAGS, padded=True),
        naive.profile_sample_max_rank(sp, TABLES, rank, BAGS),
    )
    with pytest.raises(kp.BadIdError, match="row id -1 is outside the table"):  # unpadded: -1 is a bad id
        kp.lookup_counts(sp, TABLES, bag_sizes=BAGS)


def test_dispatcher_on_padded_bags_matches_its_twin(setup):
    ds, _, places = setup
    placement = Placement.load(places["sgd"])
    sp = np.asarray(ds.train.sparse[:BATCH])
    for fused in (False, True):
        mb = Dispatcher(placement, ds.bags, BATCH).split(sp, fused=fused)
        if fused:
            assert mb.num_popular == 0 and mb.popular_count > 0
            continue
        expect = naive.split_batch(sp, TABLES, placement.hot_ids, bag_sizes=BAGS)
        assert mb.popular_samples.tolist() == expect["popular"] and len(expect["popular"]) > 0
        assert mb.non_popular_samples.tolist() == expect["non_popular"]
        for name in ("pop_ids", "pop_pos", "hot_pos", "hot_slot", "cold_pos", "cold_slot", "working_set"):
            assert getattr(mb, name).tolist() == expect[name], name
    bad = sp.copy()
    bad[3, 5] = -2
    with pytest.raises(IndexError, match="table 2: id -2 out of range"):
        Dispatcher(placement, ds.bags, BATCH).split(bad)


@pytest.mark.parametrize("opt", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("name", [m for m in MODES if m != "device"])
def test_every_mode_equals_device_on_variable_bags(setup, name, opt):
    dev_losses, dev, dev_eval, dev_counts = _run(setup, "device", opt)
    losses, params, ev, counts = _run(setup, name, opt)
    if name in BIT_IDENTICAL:
        for k, v in dev.items():
            assert np.array_equal(v, params[k]), f"{name}: {k} is not bit-identical to device mode"
        assert losses == dev_losses and ev == dev_eval
    else:  # two passes (popular, non-popular) sum the gradients in another order: equal up to reassociation
        err, where = max_rel_diff(dev, params)
        assert err <= 1e-5, f"{name}: {where} differs from device by {err:.2e}"
        assert abs(ev["auc"] - dev_eval["auc"]) < 1e-4
    assert counts["lookups"] == np.count_nonzero(np.asarray(setup[0].train.sparse[: BATCH * STEPS]) != PAD_ID)
    if MODES[name][0] == "hotline":
        assert 0 < counts["popular_samples"] < BATCH * STEPS  # both micro-batches occur


@pytest.mark.parametrize("opt", ["sgd", "rowwise-adagrad"])
def test_variable_bags_equal_the_reference(setup, opt):
    ds, init, _ = setup
    with np.load(init) as z:
        start = {k: z[k] for k in z.files}
    ref = noise_floor(start, "dot", opt, LR, ds.path, BATCH, num_batches=STEPS, bag_sizes=BAGS)
    for name in ("device", "hotline-k2"):
        ours, params, _, _ = _run(setup, name, opt)
        ref.check(ours, params, what=name)  # within the float32 noise floor of the float64 reference


def test_checkpoint_resume_on_variable_bags(setup, tmp_path):
    from hotline.training.checkpoint import load_checkpoint, save_checkpoint

    full = _run(setup, "hotline-k2", "rowwise-adagrad")[1]
    cfg = _config(setup, "hotline", "rowwise-adagrad", 2, num_batches=6)
    tr = Trainer(cfg, setup[0])
    try:
        list(tr.progress(tr.batches()))
        save_checkpoint(tr, tmp_path / "c.pt")
    finally:
        tr.close()
    tr = Trainer(_config(setup, "hotline", "rowwise-adagrad", 2), setup[0])
    try:
        assert load_checkpoint(tr, tmp_path / "c.pt") == 6
        list(tr.progress(tr.batches(tr.step_count)))
        for k, v in full.items():
            assert np.array_equal(v, tr.named_arrays()[k]), k
    finally:
        tr.close()


def test_export_predicts_what_hotline_predicts_on_variable_bags(setup, tmp_path):
    pytest.importorskip("torchrec")
    from hotline.training.checkpoint import save_checkpoint
    from hotline.training.export import export_torchrec_dlrm, keyed_jagged, load_torchrec_dlrm

    ds = setup[0]
    tr = Trainer(_config(setup, "hotline", "sgd", 2), ds)
    try:
        list(tr.progress(tr.batches()))
        ours, _ = tr.predict(ds.test)
        save_checkpoint(tr, tmp_path / "c.pt")
    finally:
        tr.close()
    export_torchrec_dlrm(tmp_path / "c.pt", tmp_path / "m.pt")
    module, config = load_torchrec_dlrm(tmp_path / "m.pt")
    with torch.no_grad():
        kjt = keyed_jagged(np.asarray(ds.test.sparse), config["feature_names"], ds.bag_sizes)
        theirs = torch.sigmoid(module(torch.from_numpy(np.array(ds.test.dense)), kjt)).squeeze(1).numpy()
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-6)


# -- the learning-rate schedule ----------------------------------------------------------------------------
def test_lr_schedule_golden_values():
    # warm-up 4, decay from step count 6 over 4: c = step + 1 as the reference's LRPolicyScheduler counts
    s = LRSchedule(2.0, warmup_steps=4, decay_start_step=6, decay_steps=4)
    got = [s.lr(k) for k in range(12)]
    expect = [0.5, 1.0, 1.5, 1.5, 1.5, 2.0, 1.125, 0.5, 0.125, 0.125, 0.125, 0.125]
    assert got == pytest.approx(expect, rel=1e-12)
    assert [LRSchedule(0.005).lr(k) for k in (0, 1, 10**6)] == [0.005] * 3  # MLPerf: 0 / 0 / 0, constant
    assert LRSchedule(1.0, decay_steps=100000).lr(99998) == pytest.approx(1e-7)  # the floor (min_lr)
    with pytest.raises(ValueError, match="warm-up must finish before the decay starts"):
        LRSchedule(1.0, warmup_steps=10, decay_start_step=5, decay_steps=3)


def test_lr_schedule_applies_to_dense_and_sparse_rates(setup):
    """Hotline with a warm-up and decay equals the reference stepped at the schedule's rate, step by step."""
    ds, init, _ = setup
    sched = dict(lr_warmup_steps=3, lr_decay_start_step=5, lr_decay_steps=6)
    schedule = LRSchedule(LR, 3, 5, 6)
    with np.load(init) as z:
        ref = ReferenceDLRM({k: z[k] for k in z.files}, "dot", "rowwise-adagrad", LR, bag_sizes=BAGS)
    dense, sparse, labels = (np.array(a) for a in (ds.train.dense, ds.train.sparse, ds.train.labels))
    for k in range(STEPS):
        ref.lr = schedule.lr(k)
        lo, hi = k * BATCH, (k + 1) * BATCH
        ref.step(dense[lo:hi], sparse[lo:hi], labels[lo:hi])
    _, params, _, _ = _run(setup, "hotline-k2", "rowwise-adagrad", **sched)
    err, where = max_rel_diff(ref.named_arrays(), params)
    assert err <= 1e-5, f"{where} differs from the scheduled reference by {err:.2e}"
    _, constant, _, _ = _run(setup, "hotline-k2", "rowwise-adagrad")
    assert max_rel_diff(constant, params)[0] > 1e-3  # the schedule changed the run


def test_replacement_on_variable_bags_equals_device(setup):
    """--replace-every re-chooses the hot rows from online counts of the real lookups (padding not counted)."""
    _, dev, _, _ = _run(setup, "device", "rowwise-adagrad")
    tr = Trainer(_config(setup, "hotline", "rowwise-adagrad", 2, replace_every=4), setup[0])
    try:
        list(tr.progress(tr.batches()))
        assert sum(r.get("kind") == "replace" for r in tr.history) >= 2
        params = tr.named_arrays()
    finally:
        tr.close()
    err, where = max_rel_diff(dev, params)
    assert err <= 1e-6, f"{where} differs from device by {err:.2e}"


def test_two_ranks_on_variable_bags_equal_device(setup, tmp_path):
    from ranks import spawn, train_and_dump

    _, dev, _, _ = _run(setup, "device", "sgd")
    jobs = [(_config(setup, mode, "sgd", k), str(setup[0].path), str(tmp_path / f"{mode}.npz"))
            for mode, k in (("device", 0), ("hotline", 2))]  # fmt: skip
    spawn(2, train_and_dump, jobs)
    for _, _, out in jobs:
        with np.load(out) as z:
            got = {k: z[k] for k in dev}
        err, where = max_rel_diff(dev, got)
        assert err <= 1e-6, f"{out}: {where} differs from one process by {err:.2e}"


def test_torchrec_plan_on_variable_bags(setup, tmp_path, capsys):
    """`hotline plan` takes padded bags: LRU traces per table of the real ids, pooling factors L_t measured."""
    pytest.importorskip("torchrec")
    from hotline.cli import main

    for algorithm in ("lru", "lfu"):
        out = tmp_path / f"plan-{algorithm}.json"
        rc = main(["plan", str(setup[0].path), "--algorithm", algorithm, "--compute-device", "cuda", "--no-progress",
                   "--out", str(out)])  # fmt: skip
        assert rc == 0, capsys.readouterr().err
        assert out.is_file()
