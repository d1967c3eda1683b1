"""Runs the benchmarks and regenerates docs/performance.md from the JSON they write.

Every figure on the performance page comes from a benchmark's JSON, quoted by this script together with the
command that made it and the machine it ran on (CPU model, cores, load average before and after, date), so
the page cannot drift from what the benchmarks measure::

    python benchmarks/run_all.py                       # every benchmark (about 15 minutes on 2 cores), then the page
    python benchmarks/run_all.py --only dispatcher,pipeline-kaggle
    python benchmarks/run_all.py --from-json benchmarks/results   # the page again from the JSON, no reruns

Run it on an idle machine: the page says what the load was. JSON and the benchmarks' printed output are kept in
``--json-dir`` (default ``benchmarks/results/``, committed: the page can be rebuilt from it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hotline, installed or not
from hotline._io import write_json, write_text  # noqa: E402 - every file through the one atomic writer
from hotline.costmodel.timing import cpu_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_page  # noqa: E402 - the GPU section, beside this script
import scale_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    """One benchmark run the page quotes."""

    name: str
    """Section and file name."""
    script: str
    """The script in benchmarks/."""
    args: tuple[str, ...]
    """Its flags (besides --json)."""
    what: str
    """One line: what it compares."""
    columns: tuple[str, ...] = ()
    """The fields of its rows the page shows (empty: all): each rate once (not the time it is the inverse of);
    the JSON holds the rest."""
    rows: str = "results"
    """The JSON's list of rows."""


SWEEP = ("mode", "target", "coverage", "popular_share", "cold_rows_per_step", "saturated", "samples_per_s",
         "stall_share")  # fmt: skip
"""A pipeline sweep's fields on the page: each throughput beside the coverage, popular share and cold rows."""

DUPLICATES = ("benchmark", "machine", "cpus", "load_average_1min", "config")
"""Figures a section's machine line or command already gives."""

BENCHES = (
    Bench(
        "dispatcher",
        "bench_dispatcher.py",
        (),
        "the dispatcher's split of a 4096 x 26 batch against a numpy split, with the memory-limit probe",
        (
            "pooling",
            "method",
            "lookups_per_batch",
            "mlookups_per_s",
            "popular_share",
            "speedup_vs_numpy",
            "probe_mlookups_per_s",
            "rank_probe_mlookups_per_s",
        ),
    ),
    Bench(
        "profile",
        "bench_profile.py",
        (),
        "access counting (Numba) against np.bincount",
        ("workload", "method", "lookups", "total_rows", "mlookups_per_s", "speedup_vs_bincount"),
    ),
    Bench(
        "sparse-update",
        "bench_sparse_update.py",
        (),
        "the sparse row update against index_add_",
        (
            "dim",
            "optimizer",
            "method",
            "lookups",
            "unique_rows",
            "mlookups_per_s",
            "speedup_vs_index_add",
        ),
    ),
    Bench(
        "gather",
        "bench_gather.py",
        (),
        "the working-set gather and write-back against index_select / index_copy_",
        ("op", "dim", "method", "rows", "median_ms", "gb_per_s", "ratio_vs_torch"),
    ),
    Bench(
        "preprocess",
        "bench_preprocess.py",
        (),
        "Criteo text to a dataset, end to end, against pandas read_csv",
    ),
    Bench(
        "pipeline-emb-heavy",
        "bench_pipeline.py",
        ("--config", "emb-heavy"),
        "every mode side by side at budgets for 70/85/95% coverage (dim 64, batch 4096)",
        SWEEP,
        "sweep",
    ),
    Bench(
        "pipeline-kaggle",
        "bench_pipeline.py",
        ("--config", "kaggle"),
        "every mode side by side at budgets for 70/85/95% coverage (dim 16, batch 2048)",
        SWEEP,
        "sweep",
    ),
    Bench(
        "pipeline-mlperf",
        "bench_pipeline.py",
        ("--config", "mlperf-dcnv2"),
        "the MLPerf DLRM-DCNv2 shape (multi-hot, DCN) at a row cap that fits here",
        SWEEP,
        "sweep",
    ),
    Bench(
        "costmodel",
        "bench_costmodel.py",
        (),
        "the cost model's predicted / measured samples/s per mode and budget",
        (
            "config",
            "mode",
            "target",
            "coverage",
            "stale_rows",
            "predicted",
            "measured",
            "ratio",
            "ratio_at_probe",
            "bottleneck",
            "in_target",
        ),
    ),
    Bench(
        "disk-tier",
        "bench_disk_tier.py",
        (),
        "cold rows on local disk: hotline against hybrid, an mmap baseline and all-in-memory",
        (
            "mode",
            "target",
            "hot_rows",
            "coverage",
            "popular_share",
            "cold_rows_per_step",
            "saturated",
            "samples_per_s",
            "os_read_bytes_per_step",
            "exposed_read_ms",
            "predicted_ratio",
            "page_cache",
        ),
    ),
    Bench(
        "torchrec",
        "bench_torchrec.py",
        (),
        "torchrec's EBC and fused EBC against Hotline's collection and trainer",
    ),
    Bench(
        "distributed",
        "bench_distributed.py",
        ("--threads", "1"),
        "1 and 2 gloo ranks, every mode, budgets for 70/85/95% coverage",
        (
            "mode",
            "nproc",
            "target",
            "coverage",
            "popular_share",
            "cold_rows_per_step",
            "saturated",
            "samples_per_s",
            "bytes_total",
            "vs_n1",
            "max_rel_diff_vs_n1",
        ),
    ),
    Bench(
        "drift",
        "bench_drift.py",
        (),
        "static against adaptive placement on drifting data, and the counting's cost",
        (
            "placement",
            "samples_per_s",
            "hot_lookup_share",
            "popular_sample_share",
            "cold_rows_per_step",
            "replacements",
            "rows_promoted",
            "replace_ms_mean",
            "hot_share_by_day_text",
        ),
    ),
)


def machine() -> dict:
    """The machine the figures come from."""
    return {
        "cpu": cpu_model() or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


@dataclass(frozen=True)
class Snapshot:
    """What the machine is doing, from ``/proc``: cumulative CPU ticks (busy: user, nice, system, irq, softirq;
    all), the tasks blocked in uninterruptible sleep (D state: waiting on the disk) now, and the block devices'
    requests in flight now."""

    busy: int
    total: int
    blocked: int
    in_flight: int


def snapshot() -> Snapshot | None:
    """The machine now (None where ``/proc`` does not say: not Linux)."""
    try:
        stat = Path("/proc/stat").read_text().splitlines()
        disks = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return None
    cpu = [int(v) for v in stat[0].split()[1:]]
    blocked = next((int(line.split()[1]) for line in stat if line.startswith("procs_blocked ")), 0)
    # field 12 of a device's line: I/Os currently in progress; whole disks only (/sys/block: vda, nvme0n1, ...),
    # as a partition's requests are its disk's too
    try:
        whole = set(os.listdir("/sys/block"))
    except OSError:
        whole = None
    in_flight = sum(
        int(f[11])
        for f in (line.split() for line in disks)
        if len(f) > 11 and (whole is None or f[2] in whole)
    )
    return Snapshot(busy=sum(cpu[i] for i in (0, 1, 2, 5, 6) if i < len(cpu)), total=sum(cpu[:8]),
                    blocked=blocked, in_flight=in_flight)  # fmt: skip


def quiet(before: Snapshot, now: Snapshot, busy_share: float = 0.10) -> bool:
    """Whether the interval between two snapshots was quiet: at most ``busy_share`` of the cores busy, and at
    its end no task waiting on the disk and no request in flight."""
    ticks = now.total - before.total
    busy = (now.busy - before.busy) / ticks if ticks > 0 else 0.0
    return busy <= busy_share and now.blocked == 0 and now.in_flight == 0


def settle(
    quiet_s: int = 5, limit_s: float = 300.0, sample=snapshot, sleep=time.sleep, clock=time.monotonic
) -> dict:
    """Waits until the machine has been quiet (:func:`quiet`) for ``quiet_s`` one-second intervals in a row, or
    ``limit_s`` seconds have passed; returns how long it waited and whether it settled. What one benchmark leaves
    behind (a disk-heavy one's deferred writes and deletions, a process still exiting) would otherwise be
    measured by the next. (The load average lags: after bench_disk_tier it counts its own I/O threads over the
    last minute, so quiet is judged from the CPU and disk counters, not from it.)"""
    start = clock()
    prev = sample()
    if prev is None:
        return {"settled": None, "waited_s": 0.0, "quiet_s": quiet_s}
    run = 0
    while run < quiet_s:
        if clock() - start >= limit_s:
            return {"settled": False, "waited_s": round(clock() - start, 1), "quiet_s": quiet_s}
        sleep(1.0)
        now = sample()
        run = run + 1 if quiet(prev, now) else 0
        prev = now
    return {"settled": True, "waited_s": round(clock() - start, 1), "quiet_s": quiet_s}


def run(bench: Bench, json_dir: Path, smoke: bool) -> dict:
    """Runs one benchmark; returns its record (command, machine, loads, return code, JSON or None)."""
    out = json_dir / f"{bench.name}.json"
    argv = [
        sys.executable,
        str(HERE / bench.script),
        *bench.args,
        "--json",
        str(out),
        *(["--smoke"] if smoke else []),
    ]
    shown = " ".join(["python", f"benchmarks/{bench.script}", *bench.args, "--json", f"{bench.name}.json"])
    calm = {"settled": None, "waited_s": 0.0} if smoke else settle()  # what the last one left behind, done
    record = {"command": shown, "machine": machine(), "load_before": list(os.getloadavg()), "smoke": smoke,
              "settle": calm}  # fmt: skip
    record["started"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if out.exists():
        out.unlink()  # ours, from an earlier run: a failed run must not quote it
    print(f"== {bench.name}: {shown}", flush=True)
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    write_text(json_dir / f"{bench.name}.txt", proc.stdout)
    record.update(load_after=list(os.getloadavg()), returncode=proc.returncode)
    if proc.returncode:
        record["error"] = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "no output"
    write_json(json_dir / f"{bench.name}.run.json", record)
    return record


def _cell(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return "-" if v is None else str(v).replace("|", "/")


def table(rows: list[dict], columns: tuple[str, ...] = ()) -> list[str]:
    """A Markdown table of ``rows``: the ``columns`` any row has, or (none given) their scalar fields, in
    first-seen order; a column with one value in every row is said once below the table."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k, v in r.items() if k not in cols and not isinstance(v, (dict, list))]
    if columns:
        cols = [c for c in columns if c in cols]
    same = {
        c: _cell(rows[0].get(c)) for c in cols if len(rows) > 1 and len({_cell(r.get(c)) for r in rows}) == 1
    }
    cols = [c for c in cols if c not in same]
    if not cols:
        return []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    if same:
        lines += ["", "In every row: " + ", ".join(f"{c} {v}" for c, v in same.items()) + "."]
    return lines


def _settled(calm: dict | None) -> str:
    """How the machine was before the run (:func:`settle`), for the page: nothing where it was not waited for."""
    if not calm or calm.get("settled") is None:
        return ""
    if calm["settled"]:
        return f" (quiet for {calm['quiet_s']} s after {calm['waited_s']:.0f} s of waiting)"
    return f" (**not quiet** after {calm['waited_s']:.0f} s of waiting: disk or cores still busy)"


def section(bench: Bench, record: dict | None, data: dict | None) -> list[str]:
    """The page's section of one benchmark."""
    out = [f"## {bench.name}", "", bench.what[0].upper() + bench.what[1:] + ".", ""]
    if record is None:
        return [*out, "Not run yet.", ""]
    m = record["machine"]
    out += ["```bash", record["command"], "```", ""]
    out += [
        f"Ran {record['started']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), Python {m['python']}; "
        f"load average {record['load_before'][0]:.2f} before{_settled(record.get('settle'))}, "
        f"{record['load_after'][0]:.2f} after.",
        "",
    ]
    if record.get("smoke"):
        out += ["**A `--smoke` run (tiny sizes): it checks the script, it measures nothing.**", ""]
    if record.get("returncode"):
        return [*out, f"**Failed** (exit {record['returncode']}): `{record.get('error', '')}`", ""]
    if data is None:
        return [*out, "It wrote no JSON.", ""]
    results = data.get(bench.rows)
    if isinstance(results, list) and results and isinstance(results[0], dict):
        out += [*table(results, bench.columns), ""]
    scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list)) and k not in DUPLICATES}
    for key in ("targets", "summary", "verdict", "checks", "ratios"):
        if isinstance(data.get(key), dict):
            scalars.update({f"{key}.{k}": v for k, v in data[key].items() if not isinstance(v, (dict, list))})
    if scalars:
        out += (
            ["| figure | value |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in scalars.items()] + [""]
        )
    return out


def page(records: dict[str, dict], json_dir: Path) -> str:
    """docs/performance.md from the records and JSON in ``json_dir``."""
    lines = [
        "# Performance: measured figures",
        "",
        "Generated by `python benchmarks/run_all.py` from the benchmarks' JSON (every field of NAME in",
        "[benchmarks/results/](../benchmarks/results/)`NAME.json`). Competitors run side by side in one process:",
        "compare ratios within a run, never figures across machines or days. A hotline throughput stands beside the",
        "coverage, popular share and cold rows it measured; >= 99.9% coverage is marked saturated, not a result.",
        "The GPU sections come from `benchmarks/gpu_bench.py` ([GPU.md](../benchmarks/GPU.md)) on a lent GPU.",
        "",
    ]
    for bench in BENCHES:
        data_path = json_dir / f"{bench.name}.json"
        data = json.loads(data_path.read_text()) if data_path.exists() else None
        lines += section(bench, records.get(bench.name), data)
    lines += scale_page.section(json_dir)
    lines += gpu_page.section(json_dir, _cell)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    p.add_argument("--json-dir", type=Path, default=HERE / "results", help="where JSON and printed output go")
    p.add_argument("--from-json", type=Path, default=None, metavar="DIR", help="no runs: the page from DIR")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md", help="the page to write")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (checks the script, not the machine)")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {b.name for b in BENCHES})
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(b.name for b in BENCHES)}")
    if args.from_json is not None and not args.from_json.is_dir():
        p.error(f"--from-json {args.from_json}: not a directory (the --json-dir of an earlier run)")
    json_dir = args.from_json or args.json_dir
    # The project's output policy, before any run: the page is none of the files the page is made from, the
    # results folder is a folder, and a second run_all on the same outputs while this one runs is refused (its
    # results would mix with these, and two benchmarks at once measure neither).
    from hotline.outputs import Output, OutputError, claim

    read = "--from-json" if args.from_json else "--json-dir"
    made_from = [
        (f"{read} file", json_dir / f"{b.name}{ext}") for b in BENCHES for ext in (".json", ".run.json")
    ]
    outputs = [
        Output("--out", args.out),
        *([] if args.from_json else [Output("--json-dir", json_dir, "dir")]),
    ]
    try:
        held = claim(outputs, inputs=made_from, force=True)
    except OutputError as e:
        p.error(str(e))
    with held:
        if args.from_json is None:
            for bench in BENCHES:
                if (not names or bench.name in names) and (HERE / bench.script).exists():
                    run(bench, json_dir, args.smoke)
        records = {}
        for bench in BENCHES:
            rec = json_dir / f"{bench.name}.run.json"
            if rec.exists():
                records[bench.name] = json.loads(rec.read_text())
        write_text(held.path("--out"), page(records, json_dir))
    print(f"wrote {args.out} ({len(records)} of {len(BENCHES)} benchmarks quoted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
