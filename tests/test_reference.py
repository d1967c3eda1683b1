"""Every training mode against an independent plain-PyTorch DLRM (tests/reference.py: no Hotline code).

Every run starts from the same parameters, drawn by the reference (not by Hotline) and loaded through
``--init-params`` (``TrainConfig.init_params_path``), and trains two epochs over 480 samples in batches of 64:
7 full batches and a short last one of 32 per epoch, 16 steps.

- Against the reference: Hotline's float32 run stands within ``reference.NOISE_FACTOR`` (4) times the float32
  noise floor of the float64 reference run: its parameters (max over tensors of max|diff| / max|tensor|), its
  per-step losses and its predictions. The floor is measured in each case, on this CPU: the float32 reference's
  distance from the float64 one in file order and with each mini-batch's samples in 4 other orders (the same
  maths rounded in other orders, as another BLAS code path or another CPU rounds it). A round-number bound
  held on one CPU and not on another (row-wise Adagrad with DCN measured 1.27e-5 against a bound of 1e-5 on an
  Intel Xeon; the floor there is up to 1.9e-5).
- ``hybrid`` and ``hotline`` with one fused pass (look-ahead K > 0, or ``--micro-batches fused``) are
  BIT-IDENTICAL to ``device`` (parameters, per-step losses, predictions): asserted with np.array_equal (the same
  code path on one machine).
- ``hotline`` with split micro-batches (K = 0 auto, or ``--micro-batches split``) sums the popular and the
  non-popular micro-batches' dense gradients in another order: within the noise floor, not bit-identical.
"""

import math

import numpy as np
import pytest
import torch
from ranks import spawn, train_and_dump
from reference import NOISE_FACTOR, ReferenceDLRM, max_rel_diff, noise_floor, random_params
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
BATCH, EPOCHS, LR, DIM = 64, 2, 0.05, 8
BOTTOM, TOP = [13, 32, 8], [32, 1]
DCN = {"dcn_num_layers": 2, "dcn_low_rank_dim": 6}  # the cross net of the dcn cases (random_params' shape)
# name -> (mode, look-ahead, micro-batches, bit-identical to device)
MODES = {
    "device": ("device", 0, "auto", True),
    "hybrid": ("hybrid", 0, "auto", True),
    "hotline-k0-split": ("hotline", 0, "auto", False),
    "hotline-k0-fused": ("hotline", 0, "fused", True),
    "hotline-k1": ("hotline", 1, "auto", True),
    "hotline-k2": ("hotline", 2, "auto", True),
    "hotline-k4": ("hotline", 4, "auto", True),
    "hotline-k2-split": ("hotline", 2, "split", False),
    # the CUDA update path (torch ops fed with distinct rows found on the host), run on the CPU
    "hotline-k2-torch-updates": ("hotline", 2, "auto", False),
}
OPTIMIZERS = ["sgd", "rowwise-adagrad"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Datasets (one-hot, multi-hot with bags of 3), initial parameters per (pooling, interaction), placements."""
    root = tmp_path_factory.mktemp("reference")
    sets, inits, places = {}, {}, {}
    for L in (1, 3):
        ds = zipf_dataset(root / f"L{L}", 560, 3 + L, TABLES, pooling_factor=L)
        assert len(ds.train) == 480 and len(ds.train) % BATCH == 32  # a short last batch in each epoch
        sets[L] = ds
        for op in ("dot", "cat", "dcn"):
            inits[L, op] = root / f"init-{L}-{op}.npz"
            np.savez(inits[L, op], **random_params(TABLES, DIM, BOTTOM, TOP, op, seed=10 + L, dcn_layers=2,
                                                   dcn_rank=6))  # fmt: skip
        for opt in OPTIMIZERS:  # the most accessed 40% of rows of the first batches: both micro-batches occur
            bpr, path = 4 * DIM + (4 if opt != "sgd" else 0), root / f"placement-{L}-{opt}.npz"
            places[L, opt] = hot_placement(ds, path, 0.4, BATCH * 4, embedding_dim=DIM, bytes_per_row=bpr)
    return root, sets, inits, places


def config(setup, name, opt, L, op, **kw) -> TrainConfig:
    _, _, inits, places = setup
    mode, k, micro, _ = MODES[name]
    return TrainConfig(
        mode=mode, lookahead=k, micro_batches=micro, optimizer=opt, learning_rate=LR, mini_batch_size=BATCH,
        nepochs=EPOCHS, progress=False, embedding_dim=DIM, bottom_mlp=BOTTOM, top_mlp=TOP, interaction=op,
        init_params_path=str(inits[L, op]), placement_path=str(places[L, opt]) if mode == "hotline" else None,
        **DCN, **kw,
    )  # fmt: skip


_cache: dict = {}


def reference(setup, opt, L, op):
    """The float64 reference run and the float32 noise floor around it (cached)."""
    key = ("ref", opt, L, op)
    if key not in _cache:
        _, sets, inits, _ = setup
        with np.load(inits[L, op]) as z:
            params = {k: z[k] for k in z.files}
        _cache[key] = noise_floor(params, op, opt, LR, sets[L].path, BATCH, nepochs=EPOCHS)
    return _cache[key]


def hotline_run(setup, name, opt, L, op):
    """losses, parameters, val predictions, val and test metrics, stale rows of one mode's run (cached)."""
    key = (name, opt, L, op)
    if key not in _cache:
        tr = Trainer(config(setup, name, opt, L, op), setup[1][L])
        tr.mode.device_updates = name.endswith("torch-updates")
        try:
            stats = list(tr.progress(tr.batches()))
            probs, _ = tr.predict(tr.dataset.val)
            metrics = {s: tr.evaluate(s) for s in ("val", "test")}
            _cache[key] = (
                np.array([s.loss_sum for s in stats]),
                tr.named_arrays(),
                probs,
                metrics,
                sum(s.counters.get("stale_rows", 0) for s in stats),
            )
        finally:
            tr.close()
    return _cache[key]


@pytest.mark.parametrize("op", ["dot", "cat", "dcn"])
@pytest.mark.parametrize("L", [1, 3], ids=["onehot", "multihot"])
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("name", list(MODES))
def test_mode_equals_reference(setup, name, opt, L, op):
    ref = reference(setup, opt, L, op)
    losses, params, probs, metrics, stale = hotline_run(setup, name, opt, L, op)
    assert len(losses) == len(ref.losses) == 2 * math.ceil(480 / BATCH)
    ref.check(losses, params, probs, what=name)
    moved, _ = max_rel_diff(ref.params, _initial(setup, L, op))
    assert moved > 100 * NOISE_FACTOR * ref.param_floor  # training moved the parameters far past the bound
    if (
        MODES[name][1] > 0 and L == 1
    ):  # rows shared with in-flight steps were refreshed: the case that matters
        assert stale > 0
    d_losses, d_params, d_probs, d_metrics, _ = hotline_run(setup, "device", opt, L, op)
    if MODES[name][3]:  # one fused pass: the same arithmetic as device mode, bit for bit
        assert np.array_equal(losses, d_losses)
        for k, v in d_params.items():
            assert np.array_equal(params[k], v), f"{name}: {k} is not bit-identical to device mode"
        assert np.array_equal(probs, d_probs)
        assert metrics == d_metrics  # val and test AUC, log-loss, accuracy: evaluation reads both tiers
    else:  # split micro-batches: equal up to reassociation of the dense gradient sums
        for s in ("val", "test"):
            for m in ("auc", "logloss", "accuracy"):
                assert abs(metrics[s][m] - d_metrics[s][m]) <= 1e-4, (s, m)


def _initial(setup, L, op) -> dict[str, np.ndarray]:
    with np.load(setup[2][L, op]) as z:
        return {k: z[k] for k in z.files}


def fresh_predictions(setup, name) -> dict[str, np.ndarray]:
    """val and test predictions of the loaded initial parameters (sgd, multi-hot, dot) in one mode (cached)."""
    key = ("fresh", name)
    if key not in _cache:
        tr = Trainer(config(setup, name, "sgd", 3, "dot"), setup[1][3])
        try:
            _cache[key] = {s: tr.predict(tr.dataset.split(s))[0] for s in ("val", "test")}
        finally:
            tr.close()
    return _cache[key]


@pytest.mark.parametrize("name", ["hybrid", "hotline-k2", "hotline-k0-split"])
def test_same_parameters_same_predictions(setup, name):
    """Evaluation of the same (loaded) parameters in every mode: the same predictions as device mode, bit for
    bit, and the reference's up to rounding; the hot tier's rows are read (placement: 40% of rows hot)."""
    sets, params = setup[1], _initial(setup, 3, "dot")
    exact = ReferenceDLRM(params, "dot", "sgd", LR, dtype=torch.float64)
    single = ReferenceDLRM(params, "dot", "sgd", LR)
    probs, device = fresh_predictions(setup, name), fresh_predictions(setup, "device")
    for s in ("val", "test"):
        want = exact.predict(sets[3].path, s)[0]
        floor = max(
            float(np.abs(single.predict(sets[3].path, s)[0] - want).max()), float(np.finfo(np.float32).eps)
        )
        assert float(np.abs(probs[s] - want).max()) <= NOISE_FACTOR * floor, s
        assert np.array_equal(probs[s], device[s])


def test_quiesce_waits_for_every_write_back(setup):
    """With slow write-backs, ``quiesce`` after a step returns only when that step's rows are in the cold
    store: the exported tables then equal device mode's after the same number of steps, bit for bit (what a
    checkpoint taken mid-run relies on)."""
    import time

    opt, L, op = "rowwise-adagrad", 1, "dot"
    tr = Trainer(config(setup, "hotline-k2", opt, L, op, num_batches=6), setup[1][L])
    dev = Trainer(config(setup, "device", opt, L, op, num_batches=6), setup[1][L])
    finish = tr.mode.finish_write_back

    def slow(prep, copied=None):
        time.sleep(0.05)
        finish(prep, copied)

    tr.mode.finish_write_back = slow
    try:
        for n, (_, _) in enumerate(zip(tr.progress(tr.batches()), dev.progress(dev.batches())), start=1):
            tr.quiesce()
            got, want = tr.named_arrays(), dev.named_arrays()
            for k, v in want.items():
                assert np.array_equal(got[k], v), f"after step {n}: {k}"
    finally:
        tr.close()
        dev.close()


# 2 ranks (one spawn, few cases: spawning is slow): the sharded cold store and the replicated hot tier
TWO_RANKS = [
    ("hotline-k2", "rowwise-adagrad", 3, "dot"),
    ("hotline-k0-split", "sgd", 1, "cat"),
    ("hybrid", "rowwise-adagrad", 1, "dot"),
    ("device", "sgd", 3, "cat"),
    ("hotline-k2", "rowwise-adagrad", 3, "dcn"),
]


RESUME_CASE = ("hotline-k2", "rowwise-adagrad", 1, "dot")  # both tiers hold Adagrad state that must survive


def rank_jobs(comm, dump_jobs, fit_configs) -> None:
    """A spawn target: ``train_and_dump`` of ``dump_jobs``, then ``fit()`` of each of ``fit_configs`` in turn."""
    train_and_dump(comm, dump_jobs)
    for cfg, dataset in fit_configs:
        tr = Trainer(cfg, dataset, comm)
        try:
            tr.fit()
        finally:
            tr.close()


@pytest.fixture(scope="module")
def two_ranks(setup):
    root, sets = setup[0], setup[1]
    jobs = [
        (config(setup, *case), str(sets[case[2]].path), str(root / f"2r-{'-'.join(map(str, case))}.npz"))
        for case in TWO_RANKS
    ]
    # the resume case: straight (2 epochs), stopped at the epoch boundary with a checkpoint, resumed
    ck, ds = str(root / "2r-ck"), str(sets[RESUME_CASE[2]].path)
    fits = [
        (config(setup, *RESUME_CASE, eval_max_samples=16, dump_params_path=str(root / "2r-straight.npz"),
                dump_init_path=str(root / "2r-init.npz")), ds),
        (config(setup, *RESUME_CASE, eval_max_samples=16, num_batches=8, checkpoint_dir=ck, checkpoint_every=8), ds),
        (config(setup, *RESUME_CASE, eval_max_samples=16, checkpoint_dir=ck, resume=True,
                dump_params_path=str(root / "2r-resumed.npz")), ds),
    ]  # fmt: skip
    spawn(2, rank_jobs, jobs, fits)
    out = {}
    for case, (_, _, path) in zip(TWO_RANKS, jobs):
        with np.load(path) as z:
            out[case] = {k: z[k] for k in z.files}
    for name in ("straight", "resumed", "init"):
        with np.load(root / f"2r-{name}.npz") as z:
            out[name] = {k: z[k] for k in z.files}
    return out


def test_two_ranks_resume_is_bit_identical(setup, two_ranks):
    """2 ranks, look-ahead 2, row-wise Adagrad: stopped after epoch 1 (a checkpoint file per rank: the cold
    shard and, on rank 0, the hot tier, with their optimizer state), resumed to the end of epoch 2: bit for bit
    the straight run."""
    straight, resumed = two_ranks["straight"], two_ranks["resumed"]
    assert straight.keys() == resumed.keys()
    for k, v in straight.items():
        assert np.array_equal(resumed[k], v), k
    with np.load(
        setup[2][RESUME_CASE[2], RESUME_CASE[3]]
    ) as z:  # --init-params in, --dump-init out: the same
        assert z.files and all(np.array_equal(two_ranks["init"][k], z[k]) for k in z.files)
    reference(setup, *RESUME_CASE[1:]).check(None, straight, what="2 ranks, straight")


@pytest.mark.parametrize("case", TWO_RANKS, ids=["-".join(map(str, c)) for c in TWO_RANKS])
def test_two_ranks_equal_reference(setup, two_ranks, case):
    name, opt, L, op = case
    got = two_ranks[case]
    reference(setup, opt, L, op).check(got["losses"], got, what=f"2 ranks {case}")
    if MODES[name][1] > 0:
        assert got["stale_rows"].sum() > 0
