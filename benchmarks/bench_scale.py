"""Benchmark: MLPerf DLRM-DCNv2's table sizes on the disk store, inside a memory limit below the table bytes.

Data: a synthetic dataset with the 26 MLPerf tables (204,184,588 rows; ``--rows`` scales every table down
in proportion, for a run that fits a busy machine) and their multi-hot bag sizes (214 ids per sample), Zipf
ids, ``--samples`` training samples. The run: ``--mode hotline --cold-store disk`` (look-ahead ``--lookahead``,
``--hbm-budget`` of hot rows, the DRAM tier ``--cold-cache``: ``auto`` by default, what the limit leaves,
row-wise Adagrad, dim ``--dim``) for ``--steps`` steps of ``--batch`` samples.

Everything after the data runs in child processes (the ``--stages``, by default all six), one after the other,
inside a memory cgroup limited to ``--limit`` (cgroup v1, made under this process's own memory cgroup where the machine lets it; else they run
unlimited and the JSON says so in ``limit.how``), the page cache the one before left charged to it emptied
first, as a user's separate commands would run: ``train`` (the run, its checkpoint, the rest of the run),
``resume`` (a new process resumed from the checkpoint), ``evaluate`` and ``predict`` (``hotline evaluate`` and
``hotline predict`` on the checkpoint), ``export`` (the checkpoint as a torch.distributed.checkpoint directory)
and ``baseline``. Each stage's files go as soon as no later stage needs them (the store's file at the end of
its run, the checkpoint after the last stage that reads it); ``disk_peak_bytes`` is the most the work
directory held beside the data. ``stages`` holds each one's exit code, seconds, peak
resident set and the cgroup's peak (page cache included) and failcnt. Printed, and written as JSON to
``--json``:

- ``per_row_host_bytes``: the host structures that grow with the row count
  (:func:`hotline.training.host_memory.per_row_bytes` on the built mode, mid look-ahead), per row;
- ``cgroup_peak_bytes``, ``ru_maxrss_bytes``: the largest of the stages' cgroup peaks and peak resident sets;
- ``first_step_s``: seconds from the Trainer's construction (profile, placement, the file's fill) to the end of
  the first step; ``samples_per_s`` over the steps after it;
- ``checkpoint_s`` and ``checkpoint_mb_per_s``: one ``save_checkpoint`` at the half-way step (its rows
  streamed into the rows file beside it), beside ``disk_write_mb_per_s``, the disk's sequential write rate
  timed on a scratch file of the same size (at most 8 GiB) just before (written in 64 MiB blocks, fsynced);
  ``checkpoint_peak_rss_bytes``: the child's peak resident set during the save (``VmHWM``, reset before it
  through ``/proc/self/clear_refs``), beside ``rss_before_checkpoint_bytes``; ``load_s``: the resume's load;
  ``delta_checkpoint_s`` and ``_bytes``: a second checkpoint at the end of the run, a delta on the first;
- ``resume_exact``: whether a second run, resumed from that checkpoint, ends bit-identical to the first
  (the SHA-256 of the dense parameters and of every record of the store's file, the hot rows' from the hot
  tier: streamed, as the tables are never whole in memory);
- ``first_step_s``, ``samples_per_s`` over steps ``[1, half)``, ``phases``: those steps' mean seconds per phase
  and counters per step (disk pages and reads, cold rows), ``measured``: coverage (``hot_lookup_share``),
  popular sample share, cold rows per step and the share of them the DRAM tier served (``dram_row_share``),
  rows and pages per step read from disk, rows per 4 KiB page; ``dram_tier_bytes`` and ``dram_tier_rows``:
  the tier ``--cold-cache`` gave;
- ``export``: ``hotline export --format dcp`` of the checkpoint: seconds, bytes, MB/s, peak resident set;
- ``evaluate`` and ``predict``: the last line each printed (their figures are in ``stages``);
- ``baseline``: what a user would otherwise try at the same limit (:mod:`scale_baseline`): the same model,
  optimizer, initial rows and batches from step 0, with the fused table and its row-wise Adagrad state as
  memory-mapped float32 files, for ``--baseline-steps`` steps: its samples/s after the first step, the seconds
  of writing its files and of the first step, its peak resident set (``what`` says it in words);
- ``ceiling``: the disk's random 4 KiB read rate at depth 1 and 32 (on the baseline's table file, its cache
  dropped) and the dense compute alone per step; printed with the disk pages a step reads, the bound they set;
- ``written``: the train stage's steps on a store written whole at start-up (a long run's reads: :mod:`scale_written`).

Memory figures hold on a busy machine; speeds do not (compare the two columns of one run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import common  # puts this checkout's hotline first on sys.path
import memlimit
import numpy as np
import scale_baseline
import scale_held
import scale_report
import scale_stages
import scale_written

MLPERF_ROWS = 204_184_588


def table_sizes(rows: int) -> list[int]:
    """The MLPerf table sizes scaled to about ``rows`` rows in all (each table at least one row)."""
    from hotline.datasets.mlperf import MLPERF_TABLE_SIZES

    return [max(1, round(s * rows / MLPERF_ROWS)) for s in MLPERF_TABLE_SIZES]


def _config(args, cold_dir: str, steps: int):
    from hotline import TrainConfig
    from hotline.units import parse_size

    Path(cold_dir).mkdir(exist_ok=True)
    return TrainConfig(
        mode="hotline", cold_store="disk", cold_dir=cold_dir, optimizer="rowwise-adagrad",
        cold_cache=args.cold_cache if args.cold_cache == "auto" else parse_size(args.cold_cache),
        cold_write_buffer=args.cold_write_buffer if args.cold_write_buffer == "auto"
        else parse_size(args.cold_write_buffer),
        learning_rate=0.01, embedding_dim=args.dim, bottom_mlp=[13, 64, args.dim], top_mlp=[64, 1],
        mini_batch_size=args.batch, num_batches=steps, lookahead=args.lookahead, hbm_budget=args.hbm_budget,
        progress=False, quiet=True,
    )  # fmt: skip


def _digest(trainer) -> str:
    """SHA-256 of the run's state, streamed (the tables never whole in memory): the dense model's parameters,
    then every record of the disk store's file in its order, the hot rows' records from the hot tier."""
    h = hashlib.sha256()
    for name, p in sorted(trainer.model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    mode = trainer.mode
    f = mode.cold.host.file
    hot_pos = f.positions[mode.hot_rows].astype(np.int64)
    H = hot_pos.shape[0]
    hot = np.concatenate([mode.hot_w.cpu().numpy(), mode.hot_s.cpu().numpy().reshape(H, -1)], axis=1)
    lo = 0
    for _, rec in f.read_all(rows=False):
        n = rec.shape[0]
        mine = (hot_pos >= lo) & (hot_pos < lo + n)
        rec[hot_pos[mine] - lo] = hot[mine]
        h.update(rec.tobytes())
        lo += n
    return h.hexdigest()


def _baseline(args, ds, work: Path) -> dict:
    """The memory-mapped baseline (:mod:`scale_baseline`) on the same batches from step 0 for ``--baseline-steps``
    steps, its peak resident set, and the ceiling's parts measured on its table file (the disk's random 4 KiB
    read rate at depth 1 and 32) and the dense compute alone."""
    cfg = _config(args, str(work / "cold-baseline"), args.baseline_steps)
    reset = _reset_peak_rss()
    out = scale_baseline.train_mapped(cfg, ds, work / "mapped", args.baseline_steps)
    model, mode = out.pop("model"), out.pop("mode")
    out["peak_rss_bytes"] = _vm("VmHWM") if reset else None
    out["what"] = scale_baseline.WHAT
    table = mode.paths[0]
    mode.release()  # unmapped: its cached pages can be dropped before the disk's rate is measured on it
    ceiling = {
        f"random_4k_reads_per_s_depth{d}": scale_baseline.random_read_rate(table, d, 8000) for d in (1, 32)
    }
    mode.close()
    del model, mode
    for d in ("cold-baseline", "mapped"):  # made empty by the config and the mode
        shutil.rmtree(work / d, ignore_errors=True)
    ceiling["dense_step_s"] = scale_baseline.dense_step_seconds(cfg, ds, 8)
    return {"baseline": out, "ceiling": ceiling}


def _phases(all_stats: list) -> dict:
    """Mean seconds per step of each phase the steps timed, and mean counters per step, over ``all_stats``."""
    times: dict = {}
    counters: dict = {}
    for st in all_stats:
        for k, v in st.times.items():
            times[k] = times.get(k, 0.0) + float(v)
        for k, v in st.counters.items():
            counters[k] = counters.get(k, 0.0) + float(v)
    n = max(1, len(all_stats))
    return {"steps": len(all_stats), "seconds_per_step": {k: v / n for k, v in sorted(times.items())},
            "counters_per_step": {k: v / n for k, v in sorted(counters.items())}}  # fmt: skip


def _vm(field: str) -> int | None:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``), or None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Resets this process's ``VmHWM`` to its resident set now (Linux ``clear_refs`` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _disk_write_rate(directory: Path, size: int) -> float:
    """MB/s of writing ``size`` bytes sequentially to a scratch file in ``directory`` (64 MiB blocks, fsync),
    as the checkpoint writes its rows file."""
    block = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
    path = directory / "disk-rate.scratch"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for lo in range(0, size, len(block)):
            f.write(block[: min(len(block), size - lo)])
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return size / 1e6 / seconds


def _export_stage(ckpt: Path, work: Path) -> dict:
    """``hotline export --format dcp`` of the checkpoint ``ckpt`` (its rows file read once, each chunk written
    into a torch.distributed.checkpoint directory as its rows are in): seconds, MB/s of the export's bytes
    (beside the train stage's disk sequential write rate), the peak resident set during it (``VmHWM``, reset before it)."""
    import shutil

    from hotline.training.export import export_torchrec_dlrm

    out = work / "export-dcp"
    shutil.rmtree(out, ignore_errors=True)
    reset = _reset_peak_rss()
    t0 = time.perf_counter()
    export_torchrec_dlrm(ckpt, out, format="dcp")
    seconds = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.iterdir())
    hwm = _vm("VmHWM") if reset else None
    shutil.rmtree(out)
    return {"seconds": seconds, "bytes": size, "mb_per_s": size / 1e6 / seconds, "peak_rss_bytes": hwm}


def child(args) -> dict:
    """One stage, in its own process under the limit (as a user's commands run): ``train`` (the run, its
    checkpoint at the half-way step, the rest of the run, the digest of its end), ``resume`` (a new run resumed
    from the checkpoint, its digest) or ``baseline`` (the memory-mapped baseline and the ceiling's parts)."""
    from hotline.datasets.format import Dataset

    common.setup_threads(args.threads)
    ds = Dataset(args.data)
    work = Path(args.work)
    if args.stage == "baseline":
        return _baseline(args, ds, work)
    if args.stage == "export":
        return {"export": _export_stage(work / "ckpt", work)}
    if args.stage == "resume":
        return _resume(args, ds, work)
    if args.stage == "written":  # every row written at start-up: a long run's reads
        return scale_written.run(args, ds, work, _config, _phases, _vmstat)
    return _train(args, ds, work)


VMSTAT = (
    "allocstall_normal",
    "allocstall_movable",
    "pgscan_direct",
    "pgsteal_direct",
    "pgscan_kswapd",
    "compact_stall",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "pgfault",
    "pgmajfault",
    "pswpin",
    "numa_hint_faults",
)


def _vmstat() -> dict[str, int]:
    """The kernel's memory counters (``/proc/vmstat``) that say where a step's system time may go: reclaim,
    compaction, huge-page faults."""
    stat = dict(line.split() for line in open("/proc/vmstat"))
    return {k: int(stat[k]) for k in VMSTAT if k in stat}


def _cpu_ticks() -> dict[str, int]:
    """The machine's CPU time by kind (``/proc/stat``, clock ticks): ``steal`` is time a virtual machine's CPUs
    waited for the host."""
    fields = open("/proc/stat").readline().split()[1:9]
    return dict(
        zip(("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), map(int, fields))
    )


def _cgroup_figures(group: Path | None) -> dict[str, int]:
    """The memory cgroup's failcnt (times it reached its limit) and memory.stat counters (v1), {} without one."""
    if group is None:
        return {}
    try:
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
        out = {
            k: int(v) for k, v in stat.items() if k in ("cache", "pgpgin", "pgpgout", "pgfault", "pgmajfault")
        }
        return out | {"failcnt": int((group / "memory.failcnt").read_text())}
    except OSError:
        return {}


def _train(args, ds, work: Path) -> dict:
    from hotline.tiers.tiered import measured_figures
    from hotline.training.checkpoint import save_checkpoint
    from hotline.training.host_memory import per_row_bytes
    from hotline.training.trainer import Trainer

    half = args.steps // 2
    out: dict = {"rows": ds.total_rows, "dim": args.dim}
    t0 = time.perf_counter()
    tr = Trainer(_config(args, str(work / "cold-a"), args.steps), ds)
    stats = tr.progress(tr.batches())
    next(stats)
    out["first_step_s"] = time.perf_counter() - t0
    mode = tr.mode
    out["startup_s"] = dict(getattr(mode, "startup_s", {}))  # profile, order, fill, store (build_mode)
    out["file_bytes"] = mode.cold.host.file.size
    # mid run (the look-ahead's claims in the book); the DRAM tier and the hot tier are budgets, not per-row
    found = per_row_bytes(mode, ds.total_rows, exclude=[mode.cold.host.file.cache, mode.hot_w, mode.hot_s])
    out["per_row_host_bytes"] = sum(found.values()) / ds.total_rows
    out["per_row_structures"] = {k: v / ds.total_rows for k, v in found.items()}
    # the file's positions: under a byte a row where compact, then not among the structures above
    positions = mode.cold.host.file.positions
    compact = hasattr(positions, "kept_rows")
    out["positions_bytes"] = (
        positions.kept_rows.nbytes + positions.kept_at.nbytes if compact else positions.nbytes
    )
    held = mode.cold.host.file.held
    held0 = held.swept_rows + held.count if held is not None else 0
    group = memlimit._v1_group()
    cg1, cpu1, vm1 = _cgroup_figures(group), _cpu_ticks(), _vmstat()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    timed = [next(stats) for _ in range(half - 1)]
    stats.close()  # the look-ahead drains: steps [0, half) done
    r2 = resource.getrusage(resource.RUSAGE_SELF)  # page faults: a memory limit's reclaim shows here
    cg2, cpu2, vm2 = _cgroup_figures(group), _cpu_ticks(), _vmstat()
    out["vmstat_in_steps"] = {k: vm2[k] - vm1[k] for k in vm1 if vm2[k] != vm1[k]}
    ticks = {k: cpu2[k] - cpu1[k] for k in cpu1}
    out["cpu_in_steps"] = {k: v / max(1, sum(ticks.values())) for k, v in ticks.items()}  # shares of the time
    out["cgroup_in_steps"] = {k: cg2[k] - cg1[k] for k in cg1} | {"cache_bytes": cg2.get("cache", 0)}
    out["faults_per_step"] = {"minor": (r2.ru_minflt - r1.ru_minflt) / max(1, half - 1),
                              "major": (r2.ru_majflt - r1.ru_majflt) / max(1, half - 1)}  # fmt: skip
    out["samples_per_s"] = (half - 1) * args.batch / (time.perf_counter() - t1) if half > 1 else 0.0
    out["held"] = scale_held.sweep_figures(mode.cold.host.file, held0, half - 1)
    out["phases"] = _phases(timed)
    out["measured"] = measured_figures(out["phases"]["counters_per_step"], args.batch, 1)
    per_step = out["phases"]["counters_per_step"]
    out["measured"]["disk_pages_per_step"] = per_step.get("disk_pages", 0.0)
    out["measured"]["disk_rows_per_step"] = per_step.get("disk_rows", 0.0)
    out["measured"]["drawn_rows_per_step"] = per_step.get("drawn_rows", 0.0)  # never written: drawn, not read
    ws = per_step.get("working_set_rows", 0.0)
    out["measured"]["dram_row_share"] = 1.0 - per_step.get("disk_rows", 0.0) / ws if ws else 0.0
    f = tr.mode.cold.host.file
    record = f.record
    out["cold_cache_flag"], out["dram_tier_bytes"], out["dram_tier_rows"] = (
        args.cold_cache,
        f.cache_rows * record,
        f.cache_rows,
    )
    out["measured"]["rows_per_page"] = scale_baseline.PAGE / record
    out["hotline_peak_rss_bytes"] = _vm("VmHWM")
    out["disk_write_mb_per_s"] = _disk_write_rate(work, min(8 << 30, ds.total_rows * (record + 4)))
    scale_held.amortized(out, args.batch)
    out["rss_before_checkpoint_bytes"] = _vm("VmRSS")
    reset = _reset_peak_rss()
    t2 = time.perf_counter()
    ckpt = save_checkpoint(tr, work / "ckpt")
    out["checkpoint_s"] = time.perf_counter() - t2
    out["checkpoint_peak_rss_bytes"] = _vm("VmHWM") if reset else None
    size = sum(p.stat().st_size for p in ckpt.parent.glob(ckpt.name + "*"))
    out["checkpoint_bytes"] = size
    out["checkpoint_mb_per_s"] = size / 1e6 / out["checkpoint_s"]
    out["checkpoint"] = str(ckpt)
    for _ in tr.progress(tr.batches(tr.step_count)):
        pass
    t4 = time.perf_counter()  # the second checkpoint: a delta on the first (the rows written since)
    ckpt2 = save_checkpoint(tr, work / "ckpt2")
    out["delta_checkpoint_s"] = time.perf_counter() - t4
    out["delta_checkpoint_bytes"] = sum(p.stat().st_size for p in ckpt2.parent.glob(ckpt2.name + "*"))
    out["delta_checkpoint_steps"] = tr.step_count - half
    out["digest"] = _digest(tr)
    tr.close()
    shutil.rmtree(work / "cold-a")  # the disk's room for the next files
    return out


def _resume(args, ds, work: Path) -> dict:
    from hotline.training.checkpoint import load_checkpoint
    from hotline.training.trainer import Trainer

    out: dict = {}
    tr = Trainer(_config(args, str(work / "cold-b"), args.steps), ds)
    t3 = time.perf_counter()
    start = load_checkpoint(tr, work / "ckpt")
    out["load_s"] = time.perf_counter() - t3
    for _ in tr.progress(tr.batches(start)):
        pass
    out["resumed_digest"] = _digest(tr)
    tr.close()
    shutil.rmtree(work / "cold-b")
    return out


def main(argv=None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--rows", type=int, default=MLPERF_ROWS, help="rows in all (the 26 tables scaled alike)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--samples", type=int, default=400_000, help="training samples generated")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--baseline-steps", type=int, default=20, help="steps of the memory-mapped baseline")
    p.add_argument("--lookahead", type=int, default=2)
    p.add_argument("--hbm-budget", type=int, default=256 << 20, help="bytes of hot rows")
    p.add_argument(
        "--cold-cache", default="auto", help="the DRAM tier: a size (2GiB) or auto (what the limit leaves)"
    )
    p.add_argument("--cold-write-buffer", default="auto", help="held writes: a size, auto or 0 (in place)")
    p.add_argument("--limit", type=int, default=3 << 30, help="the memory limit in bytes (cgroup v1)")
    p.add_argument(
        "--stages",
        default=",".join(scale_stages.STAGES),
        help=f"the stages to run, some of {','.join(scale_stages.STAGES)}",
    )
    p.add_argument(
        "--work", default="bench-scale", help="a directory on local disk for the data, files and checkpoint"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--stage", default="train", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    scale_stages.apply_smoke(args)
    stages = scale_stages.parse_stages(args.stages)
    if args.cold_cache != "auto":
        from hotline.units import parse_size

        try:
            parse_size(args.cold_cache)
        except ValueError as e:
            raise SystemExit(f"bench_scale: --cold-cache: {e}") from None
    if args.child:
        Path(args.json).write_text(json.dumps(child(args)))
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = table_sizes(args.rows)
    data = scale_stages.data_for(work, sizes, args.samples)
    parent, group, how = (
        memlimit._v1_group(),
        None,
        "not limited: no cgroup v1 memory hierarchy this process may use",
    )
    if parent is not None:
        group = parent / f"bench-scale-{os.getpid()}"
        try:
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(args.limit))
            how = f"cgroup v1 {group / 'memory.limit_in_bytes'} = {args.limit}"
        except OSError as e:
            how, group = f"not limited: cannot make a memory cgroup under {parent} ({e})", None
    out: dict = {"stages": {}}
    t0 = time.perf_counter()
    disk = scale_stages.DiskPeak(work)
    last_reader = max((i for i, x in enumerate(stages) if x in ("resume", "evaluate", "predict", "export")),
                      default=0)  # fmt: skip
    try:
        for i, stage in enumerate(stages):
            code = 0
            need = 1.1 * out.get("checkpoint_bytes", 0)  # the export's directory (no scratch copy)
            if stage == "export" and shutil.disk_usage(work).free < need:
                print(f"bench_scale: stage export skipped: it needs about {need / 1e9:,.0f} GB of disk, "
                      f"{shutil.disk_usage(work).free / 1e9:,.0f} GB free", file=sys.stderr)  # fmt: skip
            else:
                code, result = scale_stages.run_stage(__file__, args, argv, data, work, group, stage)
                out["stages"][stage] = {k: result.pop(k) for k in ("exit", "seconds", "peak_rss_bytes",
                                                                   "cgroup_peak_bytes", "cgroup_failcnt")}  # fmt: skip
                out.update(result)
            if i == last_reader:  # no later stage reads the checkpoint: its room goes to the baseline's files
                for f in work.glob("ckpt*"):
                    shutil.rmtree(f) if f.is_dir() else f.unlink()
            if code != 0 and stage not in ("evaluate", "predict"):  # theirs are recorded, the rest still runs
                print(f"bench_scale: stage {stage} failed (exit {code}) under {how}", file=sys.stderr)
                return 1
    finally:
        out["disk_peak_bytes"] = disk.close()
        if group is not None:
            group.rmdir()
    wall = time.perf_counter() - t0
    if "resumed_digest" in out:
        out["resume_exact"] = out.pop("resumed_digest") == out.pop("digest")
    peak = max((st["cgroup_peak_bytes"] or 0) for st in out["stages"].values()) if group else None
    failcnt = sum((st["cgroup_failcnt"] or 0) for st in out["stages"].values()) if group else None
    out["ru_maxrss_bytes"] = max(st["peak_rss_bytes"] for st in out["stages"].values())
    out.setdefault("rows", sum(sizes))
    table_bytes = out["rows"] * 4 * (args.dim + 1)
    out.update({"limit": {"bytes": args.limit, "how": how}, "table_bytes": table_bytes, "wall_s": wall,
                "cgroup_peak_bytes": peak, "cgroup_failcnt": failcnt, "steps": args.steps, "batch": args.batch,
                "lookahead": args.lookahead, "hbm_budget": args.hbm_budget})  # fmt: skip
    if "startup_s" in out:  # the train stage ran: the bound on its time to the first step
        rate = out["disk_write_mb_per_s"] * 1e6
        out["first_step_bound_s"] = 2 * out["file_bytes"] / rate + out["startup_s"].get("profile_s", 0.0)
    scale_report.print_report(out, args.dim, args.batch)
    cmd = argv if argv is not None else sys.argv[1:]
    common.write_json(args.json, {"command": " ".join(["python benchmarks/bench_scale.py", *cmd]), **out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
