"""Pipeline benchmark: device / hybrid / hotline K=0 / hotline K=2 training side by side on the same data.

Every mode trains the same model on the same batches in one process (each from the same initial weights);
samples/s are measured over the steps after a warm-up. The hot tier's budget comes from what the run
touches: the whole training split (the run's batches) is profiled, and for each target of ``--coverages``
the smallest budget whose coverage of those lookups reaches it is swept (device and hybrid do not depend on
it: run once). Each tiered run prints what it measured: coverage (lookups that hit hot rows), popular share
and unique cold rows per step; a run at coverage >= 99.9% is marked saturated (device mode plus a dispatch,
never a hotline result). Two configs, as the project guide asks:

- ``emb-heavy`` (default): dim 64 and small MLPs, where moving embedding rows dominates (a GPU's balance);
- ``kaggle``: the Kaggle DLRM (dim 16, 13-512-256-64-16, 512-256-1), where the MLPs take most of a CPU step.

Run: ``python benchmarks/bench_pipeline.py --config emb-heavy --json pipeline.json`` (and ``--config kaggle``)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the checkout's hotline, installed or not

import common  # noqa: E402

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
    "hotline_k0": {"mode": "hotline", "lookahead": 0},
    "hotline_k2": {"mode": "hotline", "lookahead": 2},
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


def make_data(args, root: Path):
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    if args.data:
        return Dataset(args.data)
    rows = int(args.batch * (args.steps + args.warmup_steps) * 7 / 6) + 1000
    path = generate(
        root / "data",
        rows,
        seed=args.seed,
        max_rows_per_table=args.max_rows_per_table,
        zipf=args.zipf,
        progress=not args.smoke,
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
    for b in common.budgets_for_coverage(prof, args.coverages):
        path = root / f"placement-{b['hot_rows']}.npz"
        prof.placement(b["budget_bytes"]).save(path)
        out.append({**b, "path": str(path), "summary": prof.summary(b["budget_bytes"])})
    return out


def run_mode(name, dataset, args, cfg, placement_path, device: str = "cpu", probe=None) -> dict:
    """One timed run. On CUDA the device is synchronised once, after the timed steps (a sync per step would
    hide the overlap it measures), phases are timed with CUDA events on their streams, and peak memory is
    recorded. ``probe`` (a Batch): the run's pooled embeddings of it and its dense parameters are returned
    under ``_probe`` (to compare modes: same batches, same initial weights)."""
    import torch

    from hotline import TrainConfig, Trainer
    from hotline.pipeline.executor import overlap_ratio
    from hotline.pipeline.gpu_timing import StreamPhases

    config = TrainConfig(
        **{**cfg, "mini_batch_size": args.batch},
        **MODES[name],
        optimizer=args.optimizer,
        learning_rate=0.01,
        placement_path=placement_path,
        progress=False,
        threads=args.threads,
        worker_threads=args.worker_threads,
        num_batches=args.steps + args.warmup_steps,
        device=device,
    )
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the peaks below are this run's, not the cache of earlier runs
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config, dataset)
    times: dict[str, float] = {}
    phases = None
    try:
        if hasattr(trainer.mode, "phases"):  # from the start: look-ahead prepares steps during the warm-up
            trainer.mode.phases = phases = StreamPhases(device, from_step=args.warmup_steps)
        stats_iter = trainer.progress(trainer.batches())
        for _ in range(args.warmup_steps):
            next(stats_iter)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        samples = 0
        counters: dict[str, float] = {}
        for s in stats_iter:
            samples += s.samples
            for k, v in s.counters.items():
                counters[k] = counters.get(k, 0.0) + v
            for k, v in s.times.items():
                times[k] = times.get(k, 0.0) + v
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        probed = None
        if probe is not None:
            with torch.no_grad():
                pooled = trainer.mode.pooled_eval(probe.sparse).cpu()
            dense = {k: v.detach().cpu().clone() for k, v in trainer.model.named_parameters()}
            probed = {"pooled": pooled, "dense": dense}
    finally:
        trainer.close()
    steps = args.steps
    seen = common.measured(counters, samples, steps)
    rec = {
        "mode": name,
        "samples_per_s": samples / elapsed,
        "step_ms": 1e3 * elapsed / steps,
        "stall_share": times.get("stall", 0.0) / elapsed if "stall" in times else None,
        "overlap_ratio": overlap_ratio(times) if "stall" in times else None,
        **seen,
        "working_set_rows": seen["cold_rows_per_step"],
        "stale_rows_per_step": counters.get("stale_rows", 0.0) / steps,
        "stale_forwarded_per_step": counters.get("stale_forwarded", 0.0) / steps,
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
    return rec


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
    dataset, args, cfg, placements: list[dict], device: str = "cpu", log=None, probe=None
) -> list[dict]:
    """Runs device and hybrid once and the hotline modes once per placement; one record per run (a run
    that raised: its mode and error)."""
    rows = []
    for m in args.modes.split(","):
        for pl in placements if m.startswith("hotline") else [None]:  # device, hybrid: no hot tier to size
            path = pl["path"] if pl else None
            rec = recorded(m, run_mode, m, dataset, args, cfg, path, device=device, probe=probe)
            if pl is not None:
                rec.update(target=pl["target"], hot_rows=pl["hot_rows"], budget_bytes=pl["budget_bytes"])
                rec["budget_mib"] = pl["budget_bytes"] / 2**20
            rows.append(rec)
            if log:
                log(rec)
    return rows


SWEEP_COLUMNS = [
    ("mode", "mode", ""),
    ("budget_mib", "budget MiB", ".2f"),
    ("target", "target", ".2f"),
    ("coverage", "coverage", ".3f"),
    ("popular_share", "popular", ".3f"),
    ("cold_rows_per_step", "cold rows/step", ".0f"),
    ("samples_per_s", "samples/s", ".0f"),
    ("step_ms", "ms/step", ".1f"),
    ("stall_share", "stall", ".2f"),
    ("overlap_ratio", "overlap", ".2f"),
    ("gather_ms", "gather", ".2f"),
    ("dispatch_ms", "dispatch", ".2f"),
    ("write_back_ms", "wb", ".2f"),
    ("note", "", ""),
]


def headline(rows: list[dict]) -> tuple[dict, dict]:
    """Per mode the record of the middle unsaturated budget (the one the ratios compare), and the ratios."""
    by: dict[str, dict] = {}
    rows = [r for r in rows if "error" not in r]
    for m in dict.fromkeys(r["mode"] for r in rows):
        runs = [r for r in rows if r["mode"] == m]
        live = [r for r in runs if not r.get("saturated")] or runs
        by[m] = live[len(live) // 2]
    ratios = {}
    for a, b in (
        ("hotline_k2", "hotline_k0"),
        ("hotline_k2", "hybrid"),
        ("hotline_k0", "hybrid"),
        ("hotline_k2", "device"),
        ("hotline_k0", "device"),
    ):
        if a in by and b in by and not by[a].get("saturated"):
            ratios[f"{a}/{b}"] = by[a]["samples_per_s"] / by[b]["samples_per_s"]
    return by, ratios


def mark_saturated(rows: list[dict]) -> None:
    for r in rows:
        if "error" in r:
            r["note"] = "FAILED"
        else:
            r["note"] = "SATURATED (not a hotline result)" if r.get("saturated") else ""


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--config", choices=sorted(CONFIGS), default="emb-heavy")
    p.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    p.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=0, help="mini-batch size (default: the config's)")
    p.add_argument("--max-rows-per-table", type=int, default=1_000_000)
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
    args = p.parse_args(argv)
    cfg = dict(CONFIGS[args.config])
    if args.smoke:
        args.steps, args.warmup_steps, args.max_rows_per_table = 4, 1, 2000
        args.batch = args.batch or 128
    args.batch = args.batch or cfg["mini_batch_size"]
    common.setup_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        root = Path(tmp)
        dataset = make_data(args, root)
        placements = make_placements(dataset, args, cfg, root)
        rows = sweep(dataset, args, cfg, placements)
    mark_saturated(rows)
    by, ratios = headline(rows)
    common.print_table(
        rows,
        SWEEP_COLUMNS,
        title=f"config {args.config}, batch {args.batch}, {dataset.num_tables} tables, "
        f"{dataset.total_rows:,} rows; budgets for coverage targets {args.coverages} of the run's lookups "
        f"(coverage, popular, cold rows: measured by the run)",
    )
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x (at the middle budget)")
    payload = {
        "config": args.config,
        "batch": args.batch,
        "ratios": ratios,
        "sweep": rows,
        "placements": [
            {k: v for k, v in pl.items() if k not in ("path", "summary")}
            | {"heldout": pl["summary"]["heldout"]}
            for pl in placements
        ],
        **by,
        "machine": common.machine_info(args.threads),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
