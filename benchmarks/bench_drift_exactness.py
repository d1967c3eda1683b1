"""Benchmark: how far the split hotline path drifts from device mode, next to device mode's own drift when only
the thread count changes.

Every run trains the default model (dim 16, bottom 13-512-256-64-16, top 512-256-1, batches of ``--batch``)
on the built-in synthetic dataset (or ``--data``) from the same initial parameters, on the same batches in the
same order, in lockstep; every ``--every`` steps each run's parameters are compared with the reference run,
``device`` at ``--threads 1``: the figure is max over tensors of max|p - p_ref| / max|p_ref|. Runs:

- ``device_t2``: device mode at 2 torch/numba threads (only the thread count differs from the reference);
- ``split_t1``: hotline, look-ahead 0, split micro-batches (popular, then non-popular pass), 1 thread;
- ``split_t2``: the same at 2 threads;
- ``fused_k2_t1``: hotline, look-ahead 2, one fused pass, 1 thread (expected: 0, bit-identical);
- ``independent_t1``: tests/reference.py, the plain-PyTorch DLRM the tests use (no Hotline code), 1 thread: the
  spread between two correct float32 implementations of the same training (``--no-independent``: skipped).

Placement: per table, the rows most accessed in the last ``--profile-batches`` batches of the training split
(not the batches measured, so the popular share is steady from the first step), at most
``--hot-share`` of the table's rows (by default every row seen there: with 26 tables a sample is popular only
when all 26 lookups are hot, and the split path equals one pass when either micro-batch is empty; the share of
popular samples is printed). Per optimizer in ``--optimizers``. If ``split_t1`` and ``device_t2`` are
of one size, the split path is no less exact than rerunning device mode with another thread count.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import common
import numpy as np

from hotline import _io
from hotline.datasets.format import Dataset
from hotline.placement import Placement
from hotline.training.config import TrainConfig
from hotline.training.trainer import Trainer

RUNS = {  # name -> (TrainConfig fields, threads)
    "device_t1": ({"mode": "device"}, 1),
    "device_t2": ({"mode": "device"}, 2),
    "split_t1": ({"mode": "hotline", "lookahead": 0, "micro_batches": "split"}, 1),
    "split_t2": ({"mode": "hotline", "lookahead": 0, "micro_batches": "split"}, 2),
    "fused_k2_t1": ({"mode": "hotline", "lookahead": 2, "micro_batches": "fused"}, 1),
}
REFERENCE = "device_t1"


def max_rel_diff(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[float, str]:
    worst, name = 0.0, ""
    for k, a in ref.items():
        d = float(np.abs(got[k].astype(np.float64) - a).max()) / max(float(np.abs(a).max()), 1e-30)
        if d > worst:
            worst, name = d, k
    return worst, name


def placement(
    ds: Dataset, batch: int, batches: int, share: float, dim: int, optimizer: str, path: Path
) -> str:
    sp = ds.train.sparse[-batch * batches :]  # the end of the split: not the steps measured
    hot = []
    for t, n in enumerate(ds.table_sizes):
        counts = np.bincount(sp[:, t].reshape(-1), minlength=n)
        order = np.argsort(-counts, kind="stable")[: max(1, int(n * share))]
        hot.append(order[counts[order] > 0])
    bpr = 4 * dim + (4 if optimizer == "rowwise-adagrad" else 0)
    Placement.from_hot_ids(
        ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=dim, bytes_per_row=bpr
    ).save(path)
    return str(path)


def arch_interaction(trainers: dict) -> str:
    return next(iter(trainers.values())).config.interaction


def drift(ds: Dataset, optimizer: str, args, arch: dict, workdir: Path) -> dict:
    """Trains every run in lockstep; returns {run: [{"step", "max_rel_diff", "tensor"}, ...]}."""
    place = placement(ds, args.batch, args.profile_batches, args.hot_share, arch["embedding_dim"], optimizer,
                      workdir / f"placement-{optimizer}.npz")  # fmt: skip
    init = workdir / "init.npz"
    trainers, streams = {}, {}
    for name, (fields, threads) in RUNS.items():
        common.setup_threads(threads)
        cfg = TrainConfig(
            optimizer=optimizer, learning_rate=args.lr, mini_batch_size=args.batch, num_batches=args.steps,
            progress=False, placement_path=place if fields["mode"] == "hotline" else None, seed=args.seed,
            init_params_path=str(init) if init.exists() else None, **arch, **fields,
        )  # fmt: skip
        tr = Trainer(cfg, ds)
        if not init.exists():  # every run starts from the reference's initial parameters
            tr.dump_params(init)
        trainers[name] = tr
        streams[name] = tr.progress(tr.batches())
    curves: dict[str, list] = {name: [] for name in RUNS if name != REFERENCE}
    independent = None
    if args.independent:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from reference import ReferenceDLRM, read_params, read_split

        independent = ReferenceDLRM(read_params(init), arch_interaction(trainers), optimizer, args.lr)
        dense, sparse, labels = read_split(ds.path, "train")
        curves["independent_t1"] = []
    popular = samples = 0
    try:
        for step in range(1, args.steps + 1):
            for name, (_, threads) in RUNS.items():
                common.setup_threads(threads)
                stats = next(streams[name])
                if (
                    name == "split_t1"
                ):  # the split path differs from one pass only when both micro-batches occur
                    popular += stats.counters["popular_samples"]
                    samples += stats.samples
            if independent is not None:
                common.setup_threads(1)
                lo, hi = (step - 1) * args.batch, step * args.batch
                independent.step(dense[lo:hi], sparse[lo:hi], labels[lo:hi])
            if step % args.every == 0 or step == args.steps:
                for tr in trainers.values():
                    tr.quiesce()
                ref = trainers[REFERENCE].named_arrays()
                for name in trainers.keys() - {REFERENCE}:
                    d, where = max_rel_diff(ref, trainers[name].named_arrays())
                    curves[name].append({"step": step, "max_rel_diff": d, "tensor": where})
                if independent is not None:
                    d, where = max_rel_diff(ref, independent.named_arrays())
                    curves["independent_t1"].append({"step": step, "max_rel_diff": d, "tensor": where})
        for s in streams.values():
            s.close()
    finally:
        for tr in trainers.values():
            tr.close()
        init.unlink(missing_ok=True)
    return {"popular_share": popular / max(samples, 1), "curves": curves}


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--data", type=Path, default=None, help="dataset directory (default: the built-in one)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=25, help="steps between comparisons")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--optimizers", nargs="+", default=["sgd", "rowwise-adagrad"])
    p.add_argument(
        "--no-independent", dest="independent", action="store_false", help="skip the tests/reference.py run"
    )
    p.add_argument(
        "--profile-batches", type=int, default=128, help="hot rows: those seen in the last N batches"
    )
    p.add_argument("--hot-share", type=float, default=1.0, help="at most this share of each table's rows hot")
    args = p.parse_args(argv)
    arch = {"embedding_dim": 16, "bottom_mlp": [13, 512, 256, 64, 16], "top_mlp": [512, 256, 1]}
    with tempfile.TemporaryDirectory(prefix="hotline-drift-") as tmp:
        tmp = Path(tmp)
        if args.smoke:
            from hotline.datasets.synthetic import generate

            args.steps, args.every, args.profile_batches = 6, 3, 2
            arch = {"embedding_dim": 8, "bottom_mlp": [13, 16, 8], "top_mlp": [16, 1]}
            data = generate(
                tmp / "ds", 2000, seed=1, table_sizes=[50, 400, 20, 300], zipf=1.2, progress=False
            )
        elif args.data is None:
            from hotline.datasets.synthetic import default_dataset

            data = default_dataset(progress=True)
        else:
            data = args.data
        ds = Dataset(data)
        results = {opt: drift(ds, opt, args, arch, tmp) for opt in args.optimizers}
    for opt, result in results.items():
        curves = result["curves"]
        rows = [{"step": c["step"], **{n: curves[n][i]["max_rel_diff"] for n in curves}}
                for i, c in enumerate(next(iter(curves.values())))]  # fmt: skip
        common.print_table(
            rows,
            [("step", "step", "d"), *((n, n, ".2e") for n in curves)],
            title=f"{opt}: max rel diff of the parameters vs {REFERENCE} "
            f"({result['popular_share']:.0%} of the samples popular)",
        )
    report = {
        "benchmark": "drift_exactness",
        "reference": REFERENCE,
        "runs": {n: {**fields, "threads": t} for n, (fields, t) in RUNS.items()},
        "config": {"steps": args.steps, "every": args.every, "batch": args.batch, "lr": args.lr, **arch},
        "dataset": str(ds.path),
        "results": results,
        "machine": common.machine_info(args.threads),
    }
    if args.json:
        _io.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
