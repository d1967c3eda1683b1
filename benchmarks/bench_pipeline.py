"""Pipeline benchmark: device / hybrid / hotline K=0 / hotline K=2 training side by side on the same data.

Every mode trains the same model on the same batches in one process (each from the same initial weights);
samples/s are measured over the steps after a warm-up, and every run is made ``--rounds`` times (default 10),
one whole round after another, its fastest round counting (all rounds are in the JSON). Ten, because on a
2-core virtual machine one round of a run moves by 10-40% against another (device on emb-heavy: 32,413 to 59,967
samples/s in one run) while the configurations compared lie within 5-10% of each other: with 3 rounds which row
came out fastest was whichever a fast spell landed on. The hot tier's budget
comes from what the run touches: the whole training split (the run's batches) is profiled, and for each target
of ``--coverages`` the smallest budget whose coverage of those lookups reaches it is swept (device and hybrid
do not depend on it: run once). Each tiered run prints what it measured: coverage (lookups that hit hot rows), popular share
and unique cold rows per step; a run at coverage >= 99.9% is marked saturated (device mode plus a dispatch,
never a hotline result). Two configs, as the project guide asks:

- ``emb-heavy`` (default): dim 64 and small MLPs, where moving embedding rows dominates (a GPU's balance);
- ``kaggle``: the Kaggle DLRM (dim 16, 13-512-256-64-16, 512-256-1), where the MLPs take most of a CPU step;
- ``mlperf-dcnv2``: MLPerf DLRM-DCNv2 (benchmarks/mlperf.py) on its 26 tables (capped) with its multi-hot bags,
  plus the measured fall of the popular share against the same tables one-hot.

Targets (issue 25), printed per budget with the coverage each run measured: hotline K=2 >= 1.05x hotline
K=0 at every budget, and >= 1.0x hybrid. ``--mode auto``'s choice for this data and machine (the chooser of
``hotline train``, given the sweep's budgets and the profile the budgets come from) is mapped to its measured
run, and its margin to the fastest measured run printed (target: within 5%). The load average is printed
beside the figures: on a loaded machine they mean little. Each run also prints its page faults and system
CPU time per step (``faults``, ``sys ms``: memory the allocator handed back and the kernel zeroed again;
counts a busy machine does not change).

Run: ``python benchmarks/bench_pipeline.py --config emb-heavy --json pipeline.json`` (and ``--config kaggle``)
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import mlperf  # noqa: E402
import pipeline_results as results  # noqa: E402

CONFIGS = {
    "emb-heavy": {
        "embedding_dim": 64,
        "bottom_mlp": [13, 64, 64],
        "top_mlp": [64, 1],
        "mini_batch_size": 4096,
    },
    "kaggle": {
        "embedding_dim": 16,
        "bottom_mlp": [13, 512, 256, 64, 16],
        "top_mlp": [512, 256, 1],
        "mini_batch_size": 2048,
    },
}
MODES = {
    "device": {"mode": "device"},
    "hybrid": {"mode": "hybrid"},
    # hybrid's all-cold tables under the look-ahead executor: hotline's gain over hybrid, less that of pipelining
    "hybrid_k2": {"mode": "hotline", "lookahead": 2, "share_cores": True},
    "hotline_k0": {"mode": "hotline", "lookahead": 0},
    "hotline_k2": {"mode": "hotline", "lookahead": 2, "share_cores": True},  # the core-share rule on
}
PHASES = (
    "dispatch",
    "gather",
    "h2d",
    "popular_compute",
    "non_popular_compute",
    "compute",
    "sparse_update",
    "dense_update",
    "write_back",
    "stall",
)


def config(name: str) -> dict:
    """The TrainConfig fields of config ``name`` (one of :data:`CONFIGS` or ``mlperf-dcnv2``)."""
    return mlperf.config() if name == mlperf.NAME else dict(CONFIGS[name])


def make_data(args, root: Path):
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    if args.data:
        return Dataset(args.data)
    rows = int(args.batch * (args.steps + args.warmup_steps) * 7 / 6) + 1000
    shape = mlperf.data_options() if getattr(args, "config", None) == mlperf.NAME else {}
    path = generate(
        root / "data",
        rows,
        seed=args.seed,
        max_rows_per_table=args.max_rows_per_table,
        zipf=args.zipf,
        progress=not args.smoke,
        **shape,
    )
    return Dataset(path)


def profile_run(dataset, args, cfg):
    """The profile budgets are chosen from (the whole train split by default: what the run touches)."""
    from hotline.profiling.profiler import profile

    return profile(
        dataset,
        embedding_dim=cfg["embedding_dim"],
        optimizer=args.optimizer,
        mini_batch_size=args.batch,
        seed=args.seed,
        progress=False,
        sample_fraction=args.sample_fraction,
    )


def make_placements(dataset, args, cfg, root: Path, prof=None) -> list[dict]:
    """One placement per target of ``args.coverages``: dicts of target, hot_rows, budget_bytes,
    profiled_coverage, path, and the profile's summary at that budget (``summary``, with its held-out object)."""
    prof = prof or profile_run(dataset, args, cfg)
    out = []
    budgets = common.budgets_for_coverage(prof, args.coverages)
    for share in getattr(args, "table_shares", None) or []:  # gpu_bench: budgets as shares of the table bytes
        nbytes = int(share * dataset.total_rows) * prof.bytes_per_row
        budgets.append({"target": None, "table_share": share, "hot_rows": prof.hot_rows_for(nbytes),
                        "budget_bytes": nbytes})  # fmt: skip
    for b in sorted(budgets, key=lambda b: b["budget_bytes"]):
        path = root / f"placement-{b['budget_bytes']}.npz"
        prof.placement(b["budget_bytes"]).save(path, force=True)  # the run's own scratch
        out.append({**b, "path": str(path), "summary": prof.summary(b["budget_bytes"])})
    return out


def all_cold_placement(dataset, cfg, args) -> str:
    """A placement file with no hot rows for ``dataset`` (hybrid's), in a directory removed at exit."""
    import atexit
    import shutil

    from hotline.placement import Placement, bytes_per_row_for

    root = tempfile.mkdtemp(prefix="bench_all_cold_")
    atexit.register(shutil.rmtree, root, True)
    path = Path(root) / "all-cold.npz"
    dim = cfg["embedding_dim"]
    Placement.all_cold(dataset.table_sizes, dataset_fingerprint=dataset.fingerprint, embedding_dim=dim,
                       bytes_per_row=bytes_per_row_for(dim, args.optimizer)).save(path)  # fmt: skip
    return str(path)


def run_mode(
    name, dataset, args, cfg, placement_path, device: str = "cpu", probe=None, speed_probe=None
) -> dict:
    """One timed run. On CUDA the device is synchronised once, after the timed steps (a sync per step would
    hide the overlap it measures), phases are timed with CUDA events on their streams, and peak memory is
    recorded. ``probe`` (a Batch): the run's pooled embeddings of it and its dense parameters are returned
    under ``_probe`` (to compare modes: same batches, same initial weights). ``speed_probe``
    (:func:`hotline.costmodel.dense_timing.speed_probe`): timed right before the run's trainer is made and right
    after it is closed (``cpu_probe``: before and after, microseconds; not beside the timed steps, where a
    look-ahead run's threads would slow it)."""
    import torch

    from hotline import TrainConfig, Trainer
    from hotline.pipeline.executor import overlap_ratio
    from hotline.pipeline.gpu_timing import StreamPhases

    if name == "hybrid_k2":  # every row cold, as hybrid has it
        placement_path = all_cold_placement(dataset, cfg, args)
    config = TrainConfig(
        **{**cfg, "mini_batch_size": args.batch},
        **MODES[name],
        optimizer=args.optimizer,
        learning_rate=0.01,
        placement_path=placement_path,
        progress=False,
        threads=args.threads,
        worker_threads=args.worker_threads,
        num_batches=args.warmup_steps + max_steps(args),
        nepochs=10**6,  # a timed window longer than the data goes round it again (num_batches ends it)
        device=device,
    )
    cuda = device == "cuda"
    before = speed_probe() if speed_probe is not None else None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the peaks below are this run's, not the cache of earlier runs
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config, dataset)
    if getattr(args, "torch_updates", False) and hasattr(trainer.mode, "device_updates"):
        trainer.mode.device_updates = (
            True  # CUDA's update path (torch ops), its host work measured on the CPU
        )
    times: dict[str, float] = {}
    phases = None
    try:
        if hasattr(trainer.mode, "phases"):  # from the start: look-ahead prepares steps during the warm-up
            trainer.mode.phases = phases = StreamPhases(device, from_step=args.warmup_steps)
        stats_iter = trainer.progress(trainer.batches())
        for _ in range(args.warmup_steps):
            next(stats_iter)
        if getattr(trainer.mode, "_staging", None) and config.lookahead:
            warm_stale_kernels(len(trainer.mode._staging))  # no compile inside the timed window
        if cuda:
            torch.cuda.synchronize()
        ru0, ticks0 = resource.getrusage(resource.RUSAGE_SELF), common.cpu_ticks()
        t0 = time.perf_counter()
        samples = 0
        counters: dict[str, float] = {}
        steps = 0
        for s in stats_iter:
            steps += 1
            samples += s.samples
            for k, v in s.counters.items():
                counters[k] = counters.get(k, 0.0) + v
            for k, v in s.times.items():
                times[k] = times.get(k, 0.0) + v
            if steps >= args.steps and time.perf_counter() - t0 >= getattr(args, "min_seconds", 0.0):
                break
        stats_iter.close()  # a window that ended early: the look-ahead's threads stop and write back now
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        ru1, ticks1 = resource.getrusage(resource.RUSAGE_SELF), common.cpu_ticks()
        probed = None
        if probe is not None:
            with torch.no_grad():
                pooled = trainer.mode.pooled_eval(probe.sparse).cpu()
            dense = {k: v.detach().cpu().clone() for k, v in trainer.model.named_parameters()}
            probed = {"pooled": pooled, "dense": dense}
    finally:
        trainer.close()
    after = speed_probe() if speed_probe is not None else None
    seen = common.measured(counters, samples, steps)
    rec = {
        "mode": name,
        "steps": steps,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "step_ms": 1e3 * elapsed / steps,
        "stall_share": times.get("stall", 0.0) / elapsed if "stall" in times else None,
        "overlap_ratio": overlap_ratio(times) if "stall" in times else None,
        **seen,
        "working_set_rows": seen["cold_rows_per_step"],
        # what the kernel did for the process (page faults: memory handed back and faulted in again)
        "page_faults_per_step": (ru1.ru_minflt - ru0.ru_minflt) / steps,
        "sys_ms_per_step": 1e3 * (ru1.ru_stime - ru0.ru_stime) / steps,
        # a virtual machine's cores taken away by its host during the timed steps (/proc/stat's steal)
        "steal_share": common.steal_share(ticks0, ticks1),
        "stale_rows_per_step": counters.get("stale_rows", 0.0) / steps,
        "stale_forwarded_per_step": counters.get("stale_forwarded", 0.0) / steps,
        # look-ahead only: the refresh of stale rows (part of the stall)
        "refresh_ms": 1e3 * counters["refresh_s"] / steps if "refresh_s" in counters else None,
        # look-ahead only: torch's threads by the core-share rule, and the producer's measured busy share
        "compute_threads": counters["compute_threads"] / steps if "compute_threads" in counters else None,
        "producer_busy_share": counters["producer_busy_share"] / steps
        if "producer_busy_share" in counters
        else None,
    }
    rec.update({f"{k}_ms": 1e3 * times[k] / steps for k in PHASES if k in times})
    if phases is not None:
        g = phases.summary()
        rec.update({f"dev_{k}_ms": 1e3 * v / steps for k, v in g["phase_s"].items()})
        rec.update(device_busy_share=g["busy_share"], copy_overlap_share=g["copy_overlap_share"])
    if cuda:
        rec.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30)  # fmt: skip
    if probed is not None:
        rec["_probe"] = probed
    if before is not None:
        rec["cpu_probe"] = {"before": before, "after": after}
    return rec


def max_steps(args) -> int:
    """The most timed steps a run takes: ``--steps``, or with ``min_seconds`` (gpu_bench: at least that long
    and ``--steps``) up to ``max_steps`` of them."""
    return max(args.steps, getattr(args, "max_steps", 0)) if getattr(args, "min_seconds", 0) else args.steps


def warm_stale_kernels(max_live: int) -> int:
    """Compiles (or loads from Numba's cache) the look-ahead's stale-row kernel for every number of live steps
    up to ``max_live``, from each signature the warm-up compiled: one of its arguments is a tuple per live step,
    so each count is a compile of its own, which would otherwise land inside the timed steps the first time
    that many steps are live. Returns how many it compiled."""
    import numpy as np
    from numba import types

    from hotline.kernels import gather

    kernel = gather._stale_holders
    before = len(kernel.signatures)
    one = np.zeros(1, np.int64)  # a working set of one row, stale, last held by every live step at slot 0
    for n in range(1, max_live + 1):  # the types the tiers pass: int64 indices, float32 rows (state as rows)
        steps = np.arange(n, dtype=np.int64)
        gather.partition_stale(one, one, one, one, steps, [one] * n)
        buffers = [(i, np.zeros((1, 1), np.float32), np.zeros(0, np.float32), one) for i in range(n)]
        gather.forward_stale(
            np.zeros((1, 1), np.float32), np.zeros(0, np.float32), one, one, one, one, buffers
        )
    done = len(kernel.signatures) - before
    for sig in list(kernel.signatures):  # and any other layout the warm-up met, at every count
        for n in range(1, max_live + 1):
            new = tuple(types.UniTuple(a.dtype, n) if isinstance(a, types.UniTuple) else a for a in sig)
            if new not in kernel.signatures:
                kernel.compile(new)
                done += 1
    return done


def recorded(name: str, run, *args, **kwargs) -> dict:
    """``run(*args, **kwargs)``'s record, or, if it raises, ``{"mode": name, "error": ...}``: one failing mode
    (look-ahead refusing a threading layer, a GPU out of memory) is recorded and the others still run."""
    import gc

    try:
        return run(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - recorded in the results, and printed
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print(f"{name}: FAILED, {error} (the other modes still run)", file=sys.stderr, flush=True)
        return {"mode": name, "error": error, "note": "FAILED"}
    finally:
        gc.collect()  # what a failed run left behind goes before the next one starts


def sweep(
    dataset,
    args,
    cfg,
    placements: list[dict],
    device: str = "cpu",
    log=None,
    probe=None,
    keep: str = "fastest",
    speed_probe=None,
) -> list[dict]:
    """Runs device and hybrid once and the hotline modes once per placement, all of them ``args.rounds``
    times (1 where ``args`` has no ``rounds``: gpu_bench) one round after another. One record per run (a run
    that raised: its mode and error), with every round's samples/s under ``rounds_samples_per_s``.

    ``keep``: which round's record stands for the run. ``fastest`` (the speed comparisons of this benchmark):
    a run that another process interrupted loses to its own other round, not to the other modes. ``median``
    (the cost-model check): the typical round, the figure a prediction of a typical step is compared with.
    ``speed_probe``: timed beside each run (:func:`run_mode`)."""
    if keep not in ("fastest", "median"):
        raise ValueError(f"keep must be 'fastest' or 'median', got {keep!r}")
    runs = [
        (m, pl)
        for m in args.modes.split(",")
        for pl in (placements if m.startswith("hotline") else [None])  # device, hybrid: no hot tier to size
    ]
    records: list[list[dict]] = [[] for _ in runs]
    for _ in range(max(1, int(getattr(args, "rounds", 1)))):
        for i, (m, pl) in enumerate(runs):
            path = pl["path"] if pl else None
            rec = recorded(m, run_mode, m, dataset, args, cfg, path, device=device, probe=probe,
                           speed_probe=speed_probe)  # fmt: skip
            if pl is not None:
                rec.update(target=pl["target"], hot_rows=pl["hot_rows"], budget_bytes=pl["budget_bytes"])
                if "table_share" in pl:
                    rec["table_share"] = pl["table_share"]
                rec["budget_mib"] = pl["budget_bytes"] / 2**20
            records[i].append(rec)
            if log:
                log(rec)
    return [common.kept_round(recs, keep) for recs in records]


def auto_choice(dataset, args, cfg, prof, placements: list[dict]):
    """What ``hotline train --mode auto`` chooses for this data on this machine, among the sweep's budgets."""
    from hotline.costmodel import Stats, arch_of, workload_for
    from hotline.costmodel.auto import table_bytes
    from hotline.costmodel.choose import choose
    from hotline.costmodel.machine import device_memory, hardware_for, with_timed_pass

    # what `hotline train` prices with: this CPU's cached calibration and the model's pass timed now, or --hardware
    hw = hardware_for("cpu", args.hardware, args.threads)
    w = workload_for(prof, worker_threads=args.worker_threads, **arch_of(cfg))  # the model the sweep trains
    if not args.hardware:
        hw = with_timed_pass(hw, w, args.threads, recalibrate=True)
    return choose(
        table_bytes(dataset.table_sizes, cfg["embedding_dim"], args.optimizer),
        device_memory("cpu"),
        hw,
        w,
        lambda b: Stats.from_profile(prof, int(b), batch_size=args.batch),
        [pl["budget_bytes"] for pl in placements],
    )


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--config", choices=sorted([*CONFIGS, mlperf.NAME]), default="emb-heavy")
    p.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    p.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="runs of every mode, one round after another; the fastest counts",
    )
    p.add_argument("--batch", type=int, default=0, help="mini-batch size (default: the config's)")
    p.add_argument("--max-rows-per-table", type=int, default=0, help="(default: 1M; 100k for mlperf-dcnv2)")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument(
        "--coverages",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[0.70, 0.85, 0.95],
        help="target coverages of the run's lookups; one hot-tier budget each",
    )
    p.add_argument(
        "--sample-fraction",
        type=float,
        default=1.0,
        help="share of train rows profiled for the budgets (1.0: the run's own batches)",
    )
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "rowwise-adagrad"])
    p.add_argument("--worker-threads", type=int, default=1, help="numba threads of the look-ahead worker")
    p.add_argument("--data", help="an existing dataset directory instead of generating one")
    p.add_argument(
        "--torch-updates",
        action="store_true",
        help="run the sparse updates as on CUDA (torch ops; device mode finds its distinct rows by a sort)",
    )
    p.add_argument(
        "--hardware",
        help="--mode auto's pricing: a `hotline calibrate` JSON (default: this CPU's cached calibration)",
    )
    p.add_argument(
        "--pool",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="runs nothing: pools earlier runs' JSON of one config (auto's choice against each configuration, "
        "by median rounds, over the runs)",
    )
    args = p.parse_args(argv)
    if args.pool:
        try:
            return results.pool_main(args.pool, args.json)
        except ValueError as e:
            p.error(str(e))
    cfg = config(args.config)
    args.max_rows_per_table = args.max_rows_per_table or (
        100_000 if args.config == mlperf.NAME else 1_000_000
    )
    if args.smoke:
        args.steps, args.warmup_steps, args.max_rows_per_table, args.rounds = 4, 1, 2000, 1
        args.batch = args.batch or 128
    args.batch = args.batch or cfg["mini_batch_size"]
    common.setup_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        root = Path(tmp)
        dataset = make_data(args, root)
        prof = profile_run(dataset, args, cfg)
        placements = make_placements(dataset, args, cfg, root, prof=prof)
        choice = auto_choice(dataset, args, cfg, prof, placements)
        rows = sweep(dataset, args, cfg, placements)
        shares = None
        if args.config == mlperf.NAME:
            shares = mlperf.popular_share_by_bags(dataset, lambda ds: profile_run(ds, args, cfg), args.coverages,
                                                  root, args.seed, args.zipf, args.max_rows_per_table)  # fmt: skip
    results.mark_saturated(rows)
    by, ratios = results.headline(rows)
    per_budget = results.budget_ratios(rows)
    met = results.targets_met(per_budget)
    auto = results.auto_margin(choice, rows)
    load = common.load_average()
    results.print_report(args, dataset, rows, ratios, per_budget, met, auto, load)
    payload = {
        "config": args.config,
        "batch": args.batch,
        "ratios": ratios,
        "budget_ratios": per_budget,
        "targets": met,
        "auto": auto,
        "load_average": load,
        "sweep": rows,
        "placements": [
            {k: v for k, v in pl.items() if k not in ("path", "summary")}
            | {"heldout": pl["summary"]["heldout"]}
            for pl in placements
        ],
        **by,
        **({"popular_share_by_bags": shares} if shares else {}),
        "machine": common.machine_info(args.threads),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
