"""GPU benchmark: hotline vs hybrid (with and without look-ahead) vs device (all rows in HBM) vs plain PyTorch, one GPU.

One command, in parts (``gpu_parts.py``), each a process of its own under its own timeout, the whole within
``--budget-s`` (540 s: one 9-minute window on one H200, first compiles included), the JSON rewritten after every
mode and every part: ``layer`` (versions, the zero-copy probe, and whether Numba's threading layer can run
look-ahead: if not, named in one line and the look-ahead modes left out), ``smoke`` (small tables: every mode
against device mode, ``exact``), ``full`` (Kaggle-sized: 26 tables with the Criteo Kaggle cardinalities, ~34 M
rows, dim 64, mini-batch 4096), ``dcnv2`` (MLPerf DLRM-DCNv2 on its multi-hot tables, capped at
``--dcnv2-max-rows``), ``calibrate`` (this host, the link and the device's dense pass, written to
``--hardware-out``; skipped with ``--hardware``), ``torchrec`` (skipped without torchrec) and ``tests`` (a short
tests/test_cuda.py subset). A part that raises or overruns is recorded and the next part still runs; a mode
that raises is recorded and the other modes still run.

Budgets: one per target coverage of the run's lookups (``--coverages``) and one per share of the table bytes
(``--table-shares``, 1%, 2%, 5%). Modes: device, hybrid, ``hybrid_k2`` (hybrid's all-cold tables under the
look-ahead executor: hotline / hybrid_k2 is the gain of caching alone), hotline K=0 and K=2 (one run per budget)
and ``torch_embeddingbag`` (one ``nn.EmbeddingBag(sparse=True)`` per table in HBM, torch's SGD). Each mode is
timed for at least ``--min-seconds`` (3) and ``--steps`` (50) steps after ``--warmup-steps``, with every Numba
signature it needs compiled first. Per run: samples/s beside the measured coverage, popular share and cold rows
per step (>= 99.9% coverage is marked saturated), phase times on the device's clock, device-busy share and
copy/compute overlap, stale rows, peak memory, the difference from device mode, and the cost model's
prediction. Needs only torch, numba and numpy (and pandas for the profile); runs from a plain checkout without
installing. ``benchmarks/GPU.md`` gives the command and the fields.

``--smoke`` runs every part at small sizes on the CPU (the tests do; no calibration there);
``--simulate-failure PARTS`` makes those parts raise at their start (the tests check that each is recorded and
skipped).

Extending it: a workload is one entry of ``WORKLOADS``, a baseline beside the Hotline modes one entry of
``EXTRA_MODES`` (a function returning a run's record), a sweep part one of ``STAGES``.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # this checkout's hotline (and, through it, its kernels), installed or not


def _quiet_tqdm_if_missing() -> None:
    """The GPU machine's image has no tqdm and no network; the benchmark needs no progress bars, so a silent
    stand-in with tqdm's interface is registered there (only when tqdm cannot be imported)."""
    try:
        import tqdm  # noqa: F401
    except ModuleNotFoundError:
        import types

        class _Silent:
            def __init__(self, iterable=None, *args, **kwargs):
                self.iterable = iterable

            def __iter__(self):
                return iter(self.iterable or ())

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def __getattr__(self, name):  # update, set_postfix, close, ...
                return lambda *a, **k: None

        for name in ("tqdm", "tqdm.auto"):
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # torch probes find_spec("tqdm")
            module.tqdm = _Silent
            sys.modules[name] = module


_quiet_tqdm_if_missing()

import bench_pipeline  # noqa: E402
import common  # noqa: E402
import gpu_extras  # noqa: E402
import gpu_parts  # noqa: E402
import gpu_torchrec  # noqa: E402
import mlperf  # noqa: E402
import pipeline_results  # noqa: E402

GOALS = {"hotline/hybrid": 2.2, "hotline/device": 0.7, "hotline/hybrid_k2": 1.0}


SMOKE = {"steps": 6, "warmup_steps": 2, "batch": 256, "max_rows_per_table": 5000, "worker_threads": 1,
         "min_seconds": 0.0}  # fmt: skip
STAGES = {"smoke": {"workload": "kaggle"}, "full": {"workload": "kaggle"}, "dcnv2": {"workload": mlperf.NAME}}
"""Each sweep part: the flags it overrides (smoke: small tables, a check, and --smoke shrinks every part so)."""
EXACT_RTOL = 1e-4  # modes differ in summation order (and atomics on CUDA); a wrong step is far above this


def _kaggle(args) -> dict:
    """The Kaggle DLRM's MLPs around ``--dim`` (Kaggle cardinalities come from the synthetic generator)."""
    return {"embedding_dim": args.dim, "bottom_mlp": [13, 512, 256, args.dim], "top_mlp": [512, 256, 1]}


def _mlperf(args) -> dict:
    """MLPerf DLRM-DCNv2 on its multi-hot tables, capped at 10M rows unless --max-rows-per-table; no one-hot
    baseline (torch_embeddingbag) beside it."""
    args.config, args.dim = mlperf.NAME, 128
    args.max_rows_per_table = args.max_rows_per_table or 10_000_000
    args.modes = ",".join(m for m in args.modes.split(",") if m != "torch_embeddingbag")
    return {k: v for k, v in mlperf.config().items() if k != "mini_batch_size"}


WORKLOADS = {"kaggle": _kaggle, mlperf.NAME: _mlperf}
"""Each sweep part's model config by the workload ``STAGES`` names (a function of the flags)."""
EXTRA_MODES = {"torch_embeddingbag": gpu_extras.run_embedding_bag}
"""Baselines beside the Hotline modes: ``fn(dataset, args, cfg, device, probe) -> record`` (run after them)."""


def main(argv: list[str] | None = None) -> dict:
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=50, help="timed steps per mode (at least; see --min-seconds)")
    p.add_argument("--min-seconds", type=float, default=3.0, help="time each mode at least this long")
    p.add_argument("--max-steps", type=int, default=20_000, help="the most timed steps of a mode")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    floats = lambda v: [float(x) for x in v.split(",") if x]  # noqa: E731
    p.add_argument("--coverages", type=floats, default=[0.70, 0.85, 0.95],
                   help="target coverages of the run's lookups; one hot-tier budget each")  # fmt: skip
    p.add_argument("--table-shares", type=floats, default=[0.01, 0.02, 0.05],
                   help="hot-tier budgets as shares of the table bytes, beside the coverage targets")  # fmt: skip
    p.add_argument("--max-rows-per-table", type=int, default=0, help="cap table sizes (0: full Kaggle)")
    p.add_argument("--dcnv2-max-rows", type=int, default=1_000_000, help="the DLRM-DCNv2 part's table cap")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--sample-fraction", type=float, default=1.0, help="share of train rows profiled")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "rowwise-adagrad"])
    p.add_argument("--worker-threads", type=int, default=4)
    p.add_argument("--modes", default=",".join([*bench_pipeline.MODES, *EXTRA_MODES]))
    p.add_argument("--data", help="an existing dataset directory (the full part's)")
    p.add_argument(
        "--gpu", default=None, help="the shipped GPU table's entry to predict with (default: detected)"
    )
    p.add_argument(
        "--host", default=None, help="this host's `hotline calibrate` JSON (default: typical host)"
    )
    p.add_argument("--hardware", default=None, metavar="FILE",
                   help="a hardware description to predict with (from --hardware-out): no calibration part")  # fmt: skip
    p.add_argument("--hardware-out", default=None, metavar="FILE",
                   help="calibrate (this host, the link, the device's dense pass) and write the description")  # fmt: skip
    p.add_argument("--no-smoke", action="store_true", help="on CUDA: skip the small exactness part")
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole run's window, in seconds")
    p.add_argument("--simulate-failure", type=lambda v: v.split(","), default=[], metavar="PARTS",
                   help="make these parts raise at their start (to check that a failure is recorded and skipped)")  # fmt: skip
    p.add_argument("--part", choices=list(gpu_parts.PART_CAPS), help=argparse.SUPPRESS)
    p.add_argument("--combined", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--leave-out", default="", help=argparse.SUPPRESS)
    p.set_defaults(threads=8)
    args = p.parse_args(argv)
    if args.part is None and not args.smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_bench needs a CUDA device (use --smoke for a CPU check)")
    if args.part is None:
        return gpu_parts.orchestrate(args, [a for a in argv if a not in _OWN_OUTPUT(argv)], Path(__file__))
    return _part(args)


def _OWN_OUTPUT(argv: list[str]) -> set[str]:
    """``--json FILE`` of the command line (each part writes its own JSON; the run merges them)."""
    i = argv.index("--json") if "--json" in argv else -1
    return {"--json", argv[i + 1]} if i >= 0 else set()


def _part(args) -> dict:
    """One part in this process (the run's orchestrator starts it): its JSON under ``stages[part]``."""
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    t_start = time.perf_counter()
    payload: dict = {"stages": {}}
    common.setup_threads(args.threads)
    part = args.part
    try:
        if part in args.simulate_failure:
            raise RuntimeError(f"simulated failure of part {part} (--simulate-failure)")
        if part == "layer":
            payload.update(versions=_probed(gpu_extras.versions), zero_copy=_probed(gpu_extras.zero_copy_probe),
                           machine=common.machine_info(args.threads))  # fmt: skip
            print(f"versions: {payload['versions']}\nzero-copy probe: {payload['zero_copy']}", flush=True)
            payload["stages"][part] = _layer()
        elif part in STAGES:
            run_args = argparse.Namespace(**{**vars(args), **STAGES[part]})
            if args.smoke or part == "smoke":
                run_args = argparse.Namespace(**{**vars(run_args), **SMOKE})
                run_args.table_shares = args.table_shares[len(args.table_shares) // 2 :][:1]  # the middle one
                run_args.threads = min(args.threads, 2) if device == "cpu" else args.threads
            if part == "dcnv2":  # its window: the middle coverage target and the middle share (none on a CPU)
                run_args.coverages = run_args.coverages[len(run_args.coverages) // 2 :][:1]
                run_args.table_shares = (
                    [] if args.smoke else args.table_shares[len(args.table_shares) // 2 :][:1]
                )
                run_args.max_rows_per_table = min(run_args.max_rows_per_table or args.dcnv2_max_rows,
                                                  args.dcnv2_max_rows)  # fmt: skip
            payload["stages"][part] = _stage(part, run_args, device, payload, t_start)
        elif part == "calibrate":
            payload["stages"][part] = _calibrate(args, device)
        elif part == "torchrec":  # Hotline's torchrec collection vs torchrec's EBC (skipped without torchrec)
            tiny = {"steps": 3, "batch": 64, "dim": 8, "rows": 500, "tables": 3} if args.smoke else {}
            payload["stages"][part] = gpu_torchrec.torchrec_stage(device, **tiny)
        else:
            payload["stages"][part] = gpu_parts.run_tests(gpu_parts.PART_CAPS["tests"] - 10)
    except Exception as e:  # noqa: BLE001 - recorded; the run's next part still runs
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print(f"[{part}] FAILED: {error}", file=sys.stderr, flush=True)
        payload["stages"][part] = {**payload["stages"].get(part, {}), "error": error}
    print(f"[{part}] {json.dumps(payload['stages'][part], default=str)[:300]}", flush=True)
    common.write_json(args.json, payload)
    return payload


def _layer() -> dict:
    """Whether Numba's threading layer can run look-ahead (two threads in parallel kernels at once), checked
    before any sweep: ``ok``, the layer, and one line naming it when it cannot."""
    from hotline.kernels.probe import threading_layer
    from hotline.pipeline.threads import check_concurrent_kernels

    try:
        return {"ok": True, "layer": check_concurrent_kernels()}
    except RuntimeError as e:
        layer = threading_layer()
        return {"ok": False, "layer": layer, "line": f"Numba threading layer {layer!r} cannot run look-ahead "
                f"({str(e).split(': ', 1)[-1]})"}  # fmt: skip


def _probed(probe) -> dict:
    """What ``probe()`` found, or the error it raised (a probe never ends the run)."""
    try:
        return probe()
    except Exception as e:  # noqa: BLE001 - recorded
        return {"error": f"{type(e).__name__}: {e}"}


def _stage(stage: str, args, device: str, payload: dict, t_start: float) -> dict:
    """One sweep (smoke: small tables; full: Kaggle-sized; dcnv2): every mode on the same batches, JSON after
    each."""
    import torch

    from hotline import costmodel

    args.max_rows_per_table = args.max_rows_per_table or None
    cfg = {**WORKLOADS[args.workload](args), "mini_batch_size": args.batch}
    out: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("json", "combined")}}
    payload["stages"][stage] = out
    with tempfile.TemporaryDirectory(prefix="gpu_bench_") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        dataset = bench_pipeline.make_data(args, root)
        t_data = time.perf_counter() - t0
        prof = bench_pipeline.profile_run(dataset, args, cfg)
        placements = bench_pipeline.make_placements(dataset, args, cfg, root, prof=prof)
        out["placements"] = [
            {k: v for k, v in pl.items() if k not in ("path", "summary")}
            | {"heldout": pl["summary"]["heldout"]}
            for pl in placements
        ]
        print(
            f"[{stage}] data {dataset.total_rows:,} rows in {t_data:.0f} s; budgets: "
            + ", ".join(
                f"{pl['hot_rows']:,} hot rows for "
                + (
                    f"{pl['target']:.0%} coverage"
                    if pl["target"]
                    else f"{pl['table_share']:.0%} of the tables"
                )
                for pl in placements
            ),  # fmt: skip
            flush=True,
        )
        probe = dataset.val.batch(0, min(len(dataset.val), 512))
        reference = {}

        def log(r):
            probed = r.pop("_probe", None)
            if probed is not None:
                if r["mode"] == "device":
                    reference.update(probed, steps=r.get("steps"))
                elif reference and r.get("steps") == reference["steps"]:
                    r.update(gpu_extras.max_rel_diff(reference, probed))
                elif reference:  # timed for --min-seconds: another number of steps, other parameters
                    r["diff_note"] = (f"not compared: {r.get('steps')} steps against device mode's "
                                      f"{reference['steps']} (the smoke part and tests/test_cuda.py compare)")  # fmt: skip
            cov = "" if r.get("coverage") is None else f" at coverage {r['coverage']:.3f}"
            diff = (
                f", max diff from device {r['diff_probe_rows']:.1e} rows / {r['diff_dense']:.1e} dense"
                if "diff_dense" in r
                else ""
            )
            if "error" not in r:  # a failed one was printed with its error already
                print(f"[{stage}] {r['mode']}: {r['samples_per_s']:.0f} samples/s{cov}{diff}", flush=True)
            out.setdefault("sweep", []).append(r)
            payload["stages"][stage] = out
            common.write_json(args.json, payload)  # after every mode: a timeout still returns what finished

        modes = args.modes.split(",")
        left_out = [m for m in modes if m in args.leave_out.split(",")]  # the layer part found no look-ahead
        modes = [m for m in modes if m not in left_out]
        out["skipped_modes"] = left_out
        unknown = [m for m in modes if m not in bench_pipeline.MODES and m not in EXTRA_MODES]
        if unknown:
            raise ValueError(f"--modes: unknown {unknown}; known: {[*bench_pipeline.MODES, *EXTRA_MODES]}")
        # device first: the reference every other mode is compared with
        ordered = sorted((m for m in modes if m in bench_pipeline.MODES), key=lambda m: m != "device")
        args.modes = ",".join(ordered)
        from hotline.tiers.base import reusing_initial_tables

        with reusing_initial_tables():  # every mode from one computed set of initial tables
            bench_pipeline.sweep(dataset, args, cfg, placements, device=device, log=log, probe=probe)
            for m in (m for m in modes if m in EXTRA_MODES):
                log(bench_pipeline.recorded(m, EXTRA_MODES[m], dataset, args, cfg, device, probe))
        rows = out.get("sweep", [])
    pipeline_results.mark_saturated(rows)
    wrong = [r["mode"] for r in rows if max(r.get("diff_probe_rows", 0), r.get("diff_dense", 0)) > EXACT_RTOL]
    failed = list(dict.fromkeys(r["mode"] for r in rows if "error" in r))
    compared = reference and any("diff_dense" in r for r in rows)
    out["exact"] = (not wrong) if compared else None  # None: nothing was compared (device mode failed?)
    out["failed_modes"] = failed
    verdict = "all modes that ran agree" if not wrong else "DIFFER: " + ", ".join(wrong)
    print(
        f"[{stage}] exactness vs device (rtol {EXACT_RTOL}): {verdict if compared else 'not checked'}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    w = _workload(cfg, args, prof)
    flops, nbytes = costmodel.compute_features(w, w.batch_size)
    out["dense_pass"] = {"flops": flops, "bytes": nbytes}  # what the calibration part prices the pass with
    hw = _hardware(args, device)
    if hw is not None:
        _predict(rows, hw, prof, placements, cfg, args)
    out["hardware"] = hw
    by, _ = pipeline_results.headline([r for r in rows if r["mode"] in bench_pipeline.MODES])
    live = [by[m] for m in ("hotline_k0", "hotline_k2") if m in by and not by[m].get("saturated")]
    candidates = live or [by[m] for m in ("hotline_k0", "hotline_k2") if m in by]
    best = max(candidates, key=lambda r: r["samples_per_s"]) if candidates else None
    ratios = {}
    if live and "hybrid" in by:
        ratios["hotline/hybrid"] = best["samples_per_s"] / by["hybrid"]["samples_per_s"]
    if live and "device" in by:
        ratios["hotline/device"] = best["samples_per_s"] / by["device"]["samples_per_s"]
    if live and "hybrid_k2" in by:  # the gain of caching alone: hybrid pipelined as hotline K=2 is
        ratios["hotline/hybrid_k2"] = best["samples_per_s"] / by["hybrid_k2"]["samples_per_s"]
    common.print_table(
        rows,
        pipeline_results.SWEEP_COLUMNS[:9]
        + [("h2d_ms", "h2d", ".2f"), ("gather_ms", "gather", ".2f")]
        + [("device_busy_share", "dev busy", ".2f"), ("copy_overlap_share", "copy ovl", ".2f")]
        + [("stale_rows_per_step", "stale", ".0f"), ("peak_allocated_gib", "peak GiB", ".2f")]
        + [("diff_dense", "diff", ".1e")]
        + [
            ("predicted", "predicted/s", ".0f"),
            ("pred_ratio", "pred/meas", ".2f"),
            ("bottleneck", "bottleneck", ""),
        ]
        + [("note", "", "")],
        title=f"[{stage}] {device}: batch {args.batch}, dim {args.dim}, {dataset.total_rows:,} rows; budgets for "
        f"coverage targets {args.coverages} of the run's lookups (coverage, popular, cold rows: measured by the run)",
    )
    for k, v in ratios.items():
        print(f"[{stage}] {k}: {v:.2f}x (goal >= {GOALS[k]}x: {'met' if v >= GOALS[k] else 'NOT met'})")
    out.update(
        ratios=ratios,
        best_hotline=best["mode"] if best else None,
        sweep=rows,
        by_mode=by,
        seconds=time.perf_counter() - t_start,
        device_name=torch.cuda.get_device_name() if device == "cuda" else "cpu",
    )
    payload["stages"][stage] = out
    common.write_json(args.json, payload)
    return out


def _gpu_name(args, device: str) -> str | None:
    from hotline import costmodel

    if args.gpu:
        return args.gpu
    if device != "cuda":
        return "H200" if args.smoke else None  # smoke: exercise the prediction path (its ratios mean nothing)
    import torch

    name = torch.cuda.get_device_name()
    return next((g for g in costmodel.known_gpus() if g.lower() in name.lower()), None)


def _workload(cfg, args, prof):
    from hotline import costmodel

    return costmodel.workload_for(prof, worker_threads=args.worker_threads, **costmodel.arch_of(cfg))


def _link_gbps(device: str) -> dict:
    """Host-to-device and back, from pinned memory: 256 MiB, median of 5."""
    import statistics

    import torch

    if device != "cuda":
        return {}
    host = torch.empty(64 << 20, dtype=torch.float32).pin_memory()
    dev = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    out = {}
    for name, dst, src in (("h2d_gbps", dev, host), ("d2h_gbps", host, dev)):
        runs = []
        for i in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            if i:
                runs.append(time.perf_counter() - t0)
        out[name] = host.numel() * 4 / statistics.median(runs) / 1e9
    return out


def _hardware(args, device) -> dict | None:
    """The hardware description predictions use: ``--hardware``'s, else the shipped table's GPU with
    ``--host``'s figures (the calibration part, which runs after the sweeps, writes a calibrated one)."""
    from hotline import costmodel

    if args.hardware:
        return costmodel.load_hardware(args.hardware)
    name = _gpu_name(args, device)
    if name is None:
        print("no known GPU to predict with (pass --gpu H100 or H200)", flush=True)
        return None
    return costmodel.load_hardware(name, args.host)


def _calibrate(args, device: str) -> dict:
    """The calibration part: this host's timings, the link, and the device's fixed cost per dense pass from
    the full part's device mode (its compute on the device's clock less what FLOPs and bytes explain); written
    to ``--hardware-out`` (without it: nothing to do)."""
    from hotline import _io, costmodel
    from hotline.costmodel.calibrate import calibrate

    if not args.hardware_out:
        return {"skipped": "no --hardware-out"}
    name = _gpu_name(args, device) or "H200"
    hw = costmodel.load_hardware(name, args.host)
    host = calibrate(threads=args.threads)
    hw = {**hw, "host": host["host"], "name": f"{name} (calibrated by gpu_bench) + {host['name']}"}
    hw["link"] = {**hw["link"], **_link_gbps(device)}
    full = gpu_parts._read(args.combined).get("stages", {}).get("full", {}) if args.combined else {}
    dev_run = full.get("by_mode", {}).get("device", {})
    compute_ms = dev_run.get("dev_compute_ms") or dev_run.get("compute_ms")
    if compute_ms and "dense_pass" in full:
        d = dict(hw["device"])
        explained = full["dense_pass"]["flops"] / (d["dense_gflops"] * 1e9) + full["dense_pass"]["bytes"] / (
            d["mem_gbps"] * 1e9
        )
        d["pass_overhead_us"] = max(0.0, 1e-3 * compute_ms - explained) * 1e6
        hw["device"] = d
    hw["format"] = "hotline-hardware"
    _io.write_json(args.hardware_out, hw)
    print(f"hardware description written to {args.hardware_out}", flush=True)
    return {"hardware": hw, "pass_from_device_mode": bool(compute_ms)}


def _predict(rows, hw, prof, placements, cfg, args) -> None:
    """Adds the cost model's prediction (from the held-out figures at each run's budget) to each run."""
    from hotline import costmodel

    w = _workload(cfg, args, prof)
    as_mode = {
        "device": "device",
        "hybrid": "hybrid",
        "hotline_k0": "hotline_k0",
        "torch_embeddingbag": "device",
    }
    middle = placements[len(placements) // 2]["budget_bytes"] if placements else 0
    for r in (r for r in rows if "error" not in r and r["mode"] != "hybrid_k2"):  # no pipelined-hybrid price
        s = costmodel.Stats.from_profile(prof, r.get("budget_bytes", middle))
        pred = costmodel.predict(as_mode.get(r["mode"], "hotline_k1"), w, s, hw)
        r.update(predicted=pred.samples_per_s, pred_ratio=pred.samples_per_s / r["samples_per_s"],
                 bottleneck=pred.bottleneck)  # fmt: skip


if __name__ == "__main__":
    main()
