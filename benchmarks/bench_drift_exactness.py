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

``--ranks N`` (N > 1) adds ``device_rN``: device mode on N gloo ranks (one thread each, the global batch
split over them, dense gradients summed by an all-reduce) against one process (``device`` at 1 thread, run
beside it on every rank from the same initial parameters): its max rel diff of the parameters at EVERY step,
and the steps where a ReLU input (the pre-activation of a hidden unit, for one sample) has another sign on the
ranks than in one process, with the first such flip's layer, unit, sample and both values.

Placement: per table, the rows most accessed in the last ``--profile-batches`` batches of the training split
(not the batches measured, so the popular share is steady from the first step), at most
``--hot-share`` of the table's rows (by default every row seen there: with 26 tables a sample is popular only
when all 26 lookups are hot, and the split path equals one pass when either micro-batch is empty; the share of
popular samples is printed). Per optimizer in ``--optimizers``. If ``split_t1`` and ``device_t2`` are
of one size, the split path is no less exact than rerunning device mode with another thread count.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import common
import numpy as np
import torch
from ranks import spawn

from hotline import _io
from hotline.datasets.format import Dataset
from hotline.distributed.comm import shard_bounds
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


def relu_inputs(model) -> dict:
    """Records the input of every ReLU of ``model`` at each forward: {module name: last input [B, units]}."""
    seen: dict = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ReLU):
            module.register_forward_hook(
                lambda m, inp, out, name=name: seen.__setitem__(name, inp[0].detach().clone())
            )
    return seen


def sign_flips(ref: dict, got: dict, lo: int) -> tuple[int, dict | None]:
    """ReLU inputs ``got`` (samples ``lo..`` of the batch) whose sign (> 0: the unit passes a gradient) differs
    from the same samples' in ``ref`` (the whole batch): their number and the first one (layer, global sample,
    unit, both values, the unit's scale max|ref| over the batch), or None."""
    count, first = 0, None
    for name, z_ref in ref.items():
        a, b = z_ref[lo : lo + got[name].shape[0]], got[name]
        flips = torch.nonzero((a > 0) != (b > 0))
        count += int(flips.shape[0])
        if first is None and flips.shape[0]:
            i, u = (int(x) for x in flips[0])
            first = {"layer": name, "sample": lo + i, "unit": u, "one_process": float(a[i, u]),
                     "ranks": float(b[i, u]), "unit_scale": float(z_ref[:, u].abs().max())}  # fmt: skip
    return count, first


def _ranks_worker(comm, config: TrainConfig, dataset: str, out: str) -> None:
    """Spawn target of ``--ranks``: trains ``config`` on the ranks and, beside it, in one process (every rank
    runs its own: the same run), step by step; writes this rank's ReLU sign flips per step (and on rank 0 the
    max rel diff of the parameters per step) to ``out`` with the rank's number in it."""
    ds = Dataset(dataset)
    ranks, one = Trainer(config, ds, comm), Trainer(config, ds)
    z_ranks, z_one = relu_inputs(ranks.model), relu_inputs(one.model)
    record: dict = {"flips": [], "first_flip": None, "max_rel_diff": [], "tensor": []}
    try:
        streams = ranks.progress(ranks.batches()), one.progress(one.batches())
        for step, (_, whole) in enumerate(zip(*streams), start=1):
            lo, _ = shard_bounds(whole.samples, comm.rank, comm.world_size)
            n, first = sign_flips(z_one, z_ranks, lo)
            record["flips"].append(n)
            if first is not None and record["first_flip"] is None:
                record["first_flip"] = {"step": step, **first}
            got = ranks.named_arrays()  # on every rank (in another mode it could be a collective)
            if comm.rank == 0:
                d, where = max_rel_diff(one.named_arrays(), got)
                record["max_rel_diff"].append(d)
                record["tensor"].append(where)
    finally:
        ranks.close()
        one.close()
    Path(out.format(rank=comm.rank)).write_text(json.dumps(record))


def ranks_drift(ds: Dataset, optimizer: str, args, arch: dict, init: Path, workdir: Path) -> dict:
    """``--ranks``: device mode on ``args.ranks`` gloo ranks against one process, step by step (see above)."""
    cfg = TrainConfig(
        mode="device", optimizer=optimizer, learning_rate=args.lr, mini_batch_size=args.batch,
        num_batches=args.steps, progress=False, seed=args.seed, init_params_path=str(init), threads=1, **arch,
    )  # fmt: skip
    out = str(workdir / f"ranks-{optimizer}-{{rank}}.json")
    spawn(args.ranks, _ranks_worker, cfg, str(ds.path), out, threads=1)
    parts = [json.loads(Path(out.format(rank=r)).read_text()) for r in range(args.ranks)]
    flips = [sum(p["flips"][i] for p in parts) for i in range(len(parts[0]["flips"]))]
    firsts = [p["first_flip"] for p in parts if p["first_flip"] is not None]
    return {
        "ranks": args.ranks,
        "max_rel_diff": parts[0]["max_rel_diff"],
        "tensor": parts[0]["tensor"],
        "relu_flips": flips,
        "first_flip": min(firsts, key=lambda f: (f["step"], f["sample"])) if firsts else None,
    }


def ranks_summary(r: dict) -> str:
    """The lines ``--ranks`` prints: the first ReLU sign flip and the drift before it, at it and at the end."""
    d, n = r["max_rel_diff"], r["ranks"]
    lines = [f"device mode on {n} ranks vs one process, {len(d)} steps: {sum(x > 0 for x in r['relu_flips'])} "
             f"steps with a ReLU input of another sign; final max rel diff {d[-1]:.2e} ({r['tensor'][-1]})"]  # fmt: skip
    f = r["first_flip"]
    if f is None:
        lines.append(f"  no ReLU input changed sign; max rel diff at most {max(d):.2e}")
        return "\n".join(lines)
    s = f["step"]
    before = max(d[: s - 1], default=0.0)
    lines.append(
        f"  first flip at step {s}: {f['layer']} unit {f['unit']}, sample {f['sample']}: "
        f"{f['one_process']:.3e} in one process, {f['ranks']:.3e} on the ranks (the unit's scale "
        f"{f['unit_scale']:.3e}); max rel diff up to step {s - 1}: {before:.2e}, at step {s}: {d[s - 1]:.2e}"
    )
    return "\n".join(lines)


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
        ranks = ranks_drift(ds, optimizer, args, arch, init, workdir) if args.ranks > 1 else None
    finally:
        for tr in trainers.values():
            tr.close()
        init.unlink(missing_ok=True)
    result = {"popular_share": popular / max(samples, 1), "curves": curves}
    if ranks is not None:  # its curve beside the others, at the same steps; every step in "ranks"
        steps = [c["step"] for c in next(iter(curves.values()))]
        curves[f"device_r{args.ranks}"] = [
            {"step": s, "max_rel_diff": ranks["max_rel_diff"][s - 1], "tensor": ranks["tensor"][s - 1]}
            for s in steps
        ]
        result["ranks"] = ranks
    return result


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
    p.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="N > 1: also device mode on N gloo ranks vs one process (device_rN)",
    )
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error(f"--ranks must be >= 1, got {args.ranks}")
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
            from hotline.datasets.default import default_dataset

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
        if "ranks" in result:
            print(ranks_summary(result["ranks"]))
    run = {"steps": args.steps, "every": args.every, "batch": args.batch, "lr": args.lr, "ranks": args.ranks}
    report = {
        "benchmark": "drift_exactness",
        "reference": REFERENCE,
        "runs": {n: {**fields, "threads": t} for n, (fields, t) in RUNS.items()},
        "config": {**run, **arch},
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
