"""Disk tier benchmark: cold rows on local disk, side by side with all-in-memory and a memory-mapped baseline.

One run, the same data, model and batches for every row (each from the same initial weights). The hot budgets
come from a profile of the train split's first ``--profile-batches`` mini-batches (Hotline's learning phase),
and every row trains on the batches after them: its coverage is that of data the profile did not count, as in
a run whose profile read a sample. The budgets are chosen on the held-out curve (the validation split), which
is what ``--mode auto`` prices with (rows that trained on the batches the profile counted would overstate the
coverage).

- ``device``: every row in memory (the upper bound);
- ``mmap``: plain PyTorch ``nn.EmbeddingBag`` (sum, sparse gradients, SGD) over one memory-mapped file of all
  tables, the file's pages dropped from the page cache just before the timed steps (the file unmapped first:
  a mapped page is not dropped; ``posix_fadvise DONTNEED`` on the file, else ``/proc/sys/vm/drop_caches``
  where permitted: the JSON says which worked), then mapped again. What it really read from disk is counted
  per step (major page faults, ``/proc/self/io`` read bytes) with the share of its table in the page cache
  after the drop and at the end (``mincore``);
- ``hybrid_disk``: every row in the disk store (``--cold-store disk``), each step's rows read when due;
- ``hotline_k0_disk`` and ``hotline_k2_disk`` (``--lookahead``): hot rows in memory, the rest in the disk
  store, at hot budgets for ``--coverages`` (80/90/95% of the held-out lookups; each row prints what it saw).

The disk store runs with O_DIRECT (the page cache bypassed; the JSON says which mode ran) and a DRAM tier of
``--dram-budget`` bytes: the tables are many times what the run may cache. Its file is written whole before the
clock (every row on disk, as after a long run:
:func:`hotline.tiers.pending_rows.write_whole`). Every tiered row prints measured
coverage, popular share, cold rows, disk bytes and reads per step beside samples/s (and the bytes the kernel
counted read from storage), and the exposed read time per step (look-ahead: the main thread's wait for the
producer; sequential: the reads and writes themselves).
The cost model (``--hardware FILE`` from ``hotline calibrate --disk DIR``, or a calibration run here) predicts
each disk row's samples/s from the run's measured figures; the ratio predicted/measured is printed. This disk's
speed moves 20% to 2x within minutes, so each disk row is priced at the disk's speed beside it: the calibration's
probe (a step-shaped read and write-back of 2,048 rows) is timed right before the row's trainer is made and
right after it is closed, and the calibrated read and write fits are scaled by the median of the two and the
calibration's own probe over the calibration's (``disk now/cal`` in the table: a probe moves the price only as far
as both beside the row agree; a ``--hardware`` file without a probe is priced as it is). Every disk row is run
``--rounds`` times (default 3), one round after another, each round priced at its own probes; the round with the
median samples/s stands for the row (every round's figures in the JSON): the cost model prices a typical step,
and one 20-step run on this disk is one draw of how its reads and write-backs overlapped. From the same
calibration, ``--mode auto``'s choice (priced with the disk store and the DRAM tier, among the measured
budgets: a measured row) and its margin to the fastest disk row (JSON ``auto``).

Targets, at the 90% budget: hotline K>=2 with the disk store >= 2x hybrid with it, >= 3x the mmap baseline,
>= 0.6x all-in-memory. The benchmark prints whether each is met and, where not, why, in the run's figures.

Run: ``python benchmarks/bench_disk_tier.py --json disk.json`` (timings on a loaded machine are not the
host's figures: the JSON records the load average).
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import disk_tier_results as results  # noqa: E402
import memlimit  # noqa: E402

# the pricing and pooling that tests/test_disk_bench.py calls as bench_disk_tier.NAME
from disk_tier_results import mean_of, paired_margin, pool_penalties, row_probe, typical  # noqa: E402, F401

PHASES = ("dispatch", "gather", "disk_read", "write_back", "stall")


def make_data(args, root: Path):
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    rows = int(args.batch * (args.profile_batches + args.steps + args.warmup_steps) * 7 / 6) + 1000
    path = generate(root / "data", rows, seed=args.seed, max_rows_per_table=args.max_rows_per_table,
                    zipf=args.zipf, progress=False)  # fmt: skip
    return Dataset(path)


def run_trainer(name: str, dataset, args, probe=None, **kw) -> dict:
    """One timed Hotline run (device, hybrid or hotline; the disk store where ``cold_store='disk'``).
    ``probe``: a :class:`~hotline.costmodel.disk_calibrate.DiskProbe`, timed right before the run's trainer is
    made and right after it is closed (JSON ``disk_probe``: each, and their mean; the cost model prices the row
    at :func:`row_probe`). Not between the warm-up and the clock: there a look-ahead run's producer and writer
    threads are still reading and writing, and the probe timed 1.3-2.3x slower beside K=2 than before or after
    it."""
    from hotline import Trainer

    if probe is not None:
        os.sync()  # what the runs before wrote, flushed (as before the clock)
        before = probe()
    trainer = Trainer(results.config(args, **kw), dataset)
    times: dict[str, float] = {}
    counters: dict[str, float] = {}
    io_mode = getattr(getattr(trainer.mode, "cold", None), "file", None)
    try:
        if io_mode is not None:
            from hotline.tiers.pending_rows import write_whole

            write_whole(io_mode)
        it = trainer.progress(trainer.batches(args.profile_batches))  # the batches after the profiled ones
        for _ in range(args.warmup_steps):
            next(it)
        # The disk settled before the clock starts: the store's file was just written whole (write_whole)
        # and the runs before wrote hundreds of MB; on a virtual disk the host may still be flushing those when
        # the guest's writes have returned, and a flush here waits for it (untimed).
        os.sync()
        io0, t0, samples = io_counters(), time.perf_counter(), 0
        for s in it:
            samples += s.samples
            for k, v in s.counters.items():
                counters[k] = counters.get(k, 0.0) + v
            for k, v in s.times.items():
                times[k] = times.get(k, 0.0) + v
        elapsed = time.perf_counter() - t0
        io = _delta(io0, io_counters())
    finally:
        trainer.close()
    steps = args.steps
    rec = {"mode": name, "samples_per_s": samples / elapsed, "step_ms": 1e3 * elapsed / steps,
           **common.measured(counters, samples, steps)}  # fmt: skip
    rec.update({f"{k}_ms": 1e3 * times[k] / steps for k in PHASES if k in times})
    if io_mode is not None:
        disk_rows = counters.get("disk_rows", 0.0)
        disk_pages = counters.get("disk_pages", 0.0)
        rec.update(
            io_mode=io_mode.mode,
            page_cache="bypassed (O_DIRECT)" if io_mode.direct else "used (buffered I/O)",
            os_read_bytes_per_step=None if io["read_bytes"] is None else io["read_bytes"] / steps,
            major_faults_per_step=io["major_faults"] / steps,
            disk_bytes_per_step=counters.get("disk_bytes_read", 0.0) / steps,  # what the fetch read
            disk_pages_per_step=disk_pages / steps,  # what the step's rows on disk span (the write-back's)
            disk_reads_per_step=counters.get("disk_reads", 0.0) / steps,
            disk_rows_per_step=disk_rows / steps,
            pages_per_disk_row=disk_pages / max(1.0, disk_rows),
            cached_share=1.0 - disk_rows / max(1.0, counters.get("working_set_rows", 0.0)),
            skipped_share=1.0 - counters.get("disk_bytes_read", 0.0) / 4096 / max(1.0, disk_pages),
            held_rows=io_mode.held.capacity if io_mode.held else 0,
            file_rows=io_mode.num_rows,  # held writes
        )
        lookahead = kw.get("lookahead", 0) if kw.get("mode") == "hotline" else 0
        os_read = rec["os_read_bytes_per_step"]  # the kernel's count: the fetch's pages and those read again
        rec["reread_share"] = (
            None if os_read is None
            else (os_read - rec["disk_bytes_per_step"]) / max(1.0, 4096 * rec["disk_pages_per_step"])
        )  # fmt: skip
        exposed = (
            times.get("stall", 0.0)
            if lookahead
            else times.get("disk_read", 0.0) + times.get("write_back", 0.0)
        )
        rec["exposed_read_ms"] = 1e3 * exposed / steps
    if probe is not None:
        after = probe()
        rec["disk_probe"] = {
            **mean_of(before, after),
            "rows": before["rows"],
            "before": before,
            "after": after,
        }
    return rec


def drop_page_cache(path: Path) -> list[str]:
    """Drops ``path``'s pages from the page cache; returns the ways that worked."""
    worked = []
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        worked.append("posix_fadvise(DONTNEED)")
    except OSError:
        pass
    finally:
        os.close(fd)
    if not worked:  # the whole machine's page cache: only where the file's own pages could not be dropped
        with contextlib.suppress(OSError), open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
            worked.append("/proc/sys/vm/drop_caches")
    return worked


def io_counters() -> dict:
    """This process's major page faults (``getrusage``) and bytes read from storage (``/proc/self/io``
    ``read_bytes``, every thread's: the page cache's hits are not counted, O_DIRECT reads are); None where the
    kernel does not say."""
    import resource

    read = None
    with contextlib.suppress(OSError, ValueError), open("/proc/self/io") as f:
        read = next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    return {"major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt, "read_bytes": read}


def _delta(before: dict, after: dict) -> dict:
    return {k: None if before[k] is None or after[k] is None else after[k] - before[k] for k in before}


def resident_share(array) -> float | None:
    """Share of the pages of a memory-mapped numpy array that are in the page cache now (``mincore`` through
    ctypes); None where it cannot be asked."""
    import ctypes

    import numpy as np

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        page = os.sysconf("SC_PAGE_SIZE")
        n = -(-array.nbytes // page)
        vec = (ctypes.c_ubyte * n)()
        if libc.mincore(ctypes.c_void_p(array.ctypes.data), array.nbytes, vec) != 0:
            return None
    except (OSError, AttributeError, ValueError):
        return None
    return float((np.frombuffer(vec, np.uint8) & 1).mean())


def run_mmap(dataset, args, root: Path, dram: int | None = None) -> dict:
    """Plain PyTorch: nn.EmbeddingBag over a memory-mapped file of every table (sparse SGD), the DLRM's dense
    part, the page cache dropped before the timed steps. ``dram``: the timed steps' page cache held to this
    DRAM budget by a memory cgroup (:mod:`memlimit`; the row ``mmap_dram``), as the disk store's DRAM tier is
    held to it, and the mapping advised ``MADV_RANDOM``: with the kernel's readahead (8 MiB on this machine's
    disk) a fault reads far more than the row it needs and evicts the rest of the small cache, and the first
    try of this row read 474 GB in 10 minutes without finishing its 20 steps; None: the whole machine's memory
    for the page cache, the kernel's readahead (the row ``mmap``)."""
    import numpy as np
    import torch

    from hotline._malloc import keep_freed_memory
    from hotline.models.dlrm import DLRM
    from hotline.table_layout import TableLayout
    from hotline.tiers.base import loss_and_backward
    from hotline.tiers.disk_store import table_chunks

    # as a Trainer does (the rows beside it make one): a step's freed heap kept for the next, so the timed
    # steps allocate nothing new and a page-cache limit squeezes only the page cache
    keep_freed_memory()
    cfg = results.config(args)
    layout = TableLayout(dataset.table_sizes)
    D, path = args.dim, root / "mmap-tables.f32"
    mm = np.memmap(path, np.float32, "w+", shape=(layout.num_rows, D))
    for t, n in enumerate(layout.table_sizes):
        for lo, w in table_chunks(n, D, cfg.seed, t):
            mm[layout.offsets[t] + lo : layout.offsets[t] + lo + w.shape[0]] = w
    mm.flush()
    del mm
    model = DLRM(cfg.model_config(dataset.table_sizes), seed=cfg.seed)
    dense_opt = torch.optim.SGD(model.parameters(), lr=cfg.learning_rate)
    split, B, first = dataset.train, args.batch, args.profile_batches  # the trainer's batches (run_trainer)
    T, L = dataset.num_tables, dataset.pooling_factor
    sparse: dict = {}

    def map_table() -> None:
        """The bag over a fresh mapping of the file, and its optimizer (SGD keeps no state)."""
        sparse["mm"] = np.memmap(path, np.float32, "r+", shape=(layout.num_rows, D))
        if dram is not None:  # random rows: no readahead (see the docstring)
            sparse["mm"]._mmap.madvise(mmap.MADV_RANDOM)
        sparse["bag"] = torch.nn.EmbeddingBag(layout.num_rows, D, mode="sum", sparse=True,
                                              _weight=torch.from_numpy(sparse["mm"]))  # fmt: skip
        sparse["opt"] = torch.optim.SGD(sparse["bag"].parameters(), lr=cfg.learning_rate)

    def step(b: int) -> None:
        batch = split.batch((first + b) * B, (first + b + 1) * B)
        ids = torch.from_numpy(layout.fuse(batch.sparse)).view(-1, L)
        pooled = sparse["bag"](ids).view(-1, T, D)
        dense_opt.zero_grad(set_to_none=True)
        sparse["opt"].zero_grad(set_to_none=True)
        loss_and_backward(model, torch.from_numpy(batch.dense), pooled, torch.from_numpy(batch.labels), B)
        dense_opt.step()
        sparse["opt"].step()

    # mmap_dram: the warm-up runs in the memory cgroup already, so the heap its steps grow is the group's, and
    # the limit set after it (hold) leaves the timed steps' new page cache the DRAM budget
    limit = memlimit.page_cache_limit(dram) if dram is not None else contextlib.nullcontext(None)
    with limit as held:
        map_table()
        for b in range(args.warmup_steps):
            step(b)
        sparse["mm"].flush()
        # A page mapped into a process is not dropped (posix_fadvise skips it): unmap, drop, map again.
        sparse.clear()
        gc.collect()
        dropped = drop_page_cache(path)
        map_table()
        mm = sparse["mm"]
        if held is not None:
            held.hold()
        resident_before = resident_share(mm)
        per_step, elapsed = [], 0.0
        for b in range(args.warmup_steps, args.warmup_steps + args.steps):
            c0, t0 = io_counters(), time.perf_counter()
            step(b)
            elapsed += time.perf_counter() - t0
            per_step.append(_delta(c0, io_counters()))
        cgroup = held.stat() if held is not None else {}
    resident_after = resident_share(mm)
    path.unlink()
    read = [d["read_bytes"] for d in per_step]
    faults = [d["major_faults"] for d in per_step]
    known = all(x is not None for x in read)
    return {"mode": "mmap" if dram is None else "mmap_dram", "samples_per_s": args.steps * B / elapsed,
            "step_ms": 1e3 * elapsed / args.steps, "page_cache_dropped_by": dropped,
            "page_cache": "used (mmap), the machine's memory" if held is None else f"used (mmap), {held.how}",
            "page_cache_limit_bytes": None if held is None else held.limit_bytes,
            "readahead": "kernel default" if dram is None else "off (MADV_RANDOM)",
            "cgroup_cache_bytes": cgroup.get("cache"), "cgroup_limit_hits": cgroup.get("failcnt"),
            "table_bytes": layout.num_rows * D * 4,
            "os_read_bytes_per_step": sum(read) / args.steps if known else None,
            "os_read_bytes_by_step": read, "major_faults_per_step": sum(faults) / args.steps,
            "major_faults_by_step": faults, "resident_share_before": resident_before,
            "resident_share_after": resident_after}  # fmt: skip


def _mmap_child(dataset_path: str, args, root: str, dram: int) -> dict:
    from hotline.datasets.format import Dataset

    common.setup_threads(args.threads)
    return run_mmap(Dataset(dataset_path), args, Path(root), dram=dram)


def run_mmap_dram(dataset, args, root: Path, dram: int) -> dict:
    """:func:`run_mmap` with its page cache held to ``dram`` (the ``mmap_dram`` row), in a process of its own
    (spawned: torch's OpenMP threads do not survive a fork), so that a step whose heap outgrows the limit's
    headroom ends that process, not the benchmark: the row then records the error."""
    import concurrent.futures
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        try:
            return pool.submit(_mmap_child, str(dataset.path), args, str(root), dram).result()
        except concurrent.futures.process.BrokenProcessPool:
            return {"mode": "mmap_dram", "error": "its process ended (the memory cgroup's OOM killer: the heap "
                    "outgrew the limit's headroom)", "page_cache_limit_bytes": None}  # fmt: skip


def disk_calibration(args, root: Path) -> dict:
    from hotline.costmodel.disk_calibrate import calibrate_disk
    from hotline.table_layout import bytes_per_row

    record = bytes_per_row(args.dim, "sgd")
    print(f"calibrating the disk (hotline calibrate --disk, {record}-byte records) ...", flush=True)
    return calibrate_disk(root, args.io_depth, seed=args.seed, record_bytes=record)


def hardware(args, root: Path, dataset=None, disk_before: dict | None = None) -> dict | None:
    import json

    from hotline.costmodel import STEP_FORMAT
    from hotline.table_layout import bytes_per_row

    if args.hardware:
        hw = json.loads(Path(args.hardware).read_text())
    elif args.smoke:
        return None
    else:
        from hotline.costmodel.calibrate import calibrate
        from hotline.costmodel.machine import with_timed_pass

        print("calibrating the host (hotline calibrate) for the cost model ...", flush=True)
        hw = calibrate(args.threads, args.seed)
        # as `hotline train --mode auto` prices on a CPU: the run's own pass timed too
        if dataset is not None:
            hw = with_timed_pass(hw, results.workload(dataset, args), args.threads, say=lambda m: None)
    step = hw.get("disk", {}).get("step", {})
    record = bytes_per_row(args.dim, "sgd")
    if step.get("version") != STEP_FORMAT or step.get("record_bytes") != record:
        after = disk_calibration(args, root)
        # This disk's speed moves 20-30% within minutes: timed before the runs and after them, the mean of the
        # two brackets the runs (each calibration kept in the JSON).
        hw["disk"] = after if disk_before is None else {**mean_of(disk_before, after), "before": disk_before,
                                                        "after": after}  # fmt: skip
        if disk_before is not None:
            pool_penalties(hw["disk"]["step"], disk_before["step"], after["step"])
    return hw


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--max-rows-per-table", type=int, default=400_000)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--coverages", type=float, nargs="+", default=[0.8, 0.9, 0.95],
                   help="held-out coverages of the hot budgets")  # fmt: skip
    p.add_argument("--profile-batches", type=int, default=300,
                   help="train batches profiled for the budgets; the rows train on the batches after them")  # fmt: skip
    p.add_argument("--lookahead", type=int, default=2, help="K of the look-ahead run (>= 2)")
    p.add_argument("--io-depth", type=int, default=32)
    p.add_argument("--dram-budget", default="16MiB", help="the disk store's DRAM tier (--cold-cache)")
    p.add_argument("--cold-dir", default=None, help="where the disk store's files go (default: a temp dir)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of every disk row, one round after another; the median round stands for the row")  # fmt: skip
    p.add_argument("--hardware", default=None, help="a hardware JSON (hotline calibrate --disk DIR)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.warmup_steps, args.batch, args.max_rows_per_table = 3, 1, 128, 2000
        args.coverages, args.dram_budget, args.rounds = [0.9], "4KiB", min(args.rounds, 2)
        args.profile_batches = 32
    if args.profile_batches < 1:
        p.error(f"--profile-batches must be at least 1, got {args.profile_batches}")
    # torch's OpenMP reads the wait policy once, when torch loads (common imports hotline first: a short spin,
    # then passive); a spinning team takes cores the store's I/O threads need on a busy machine (docs/training.md: the wait policy)
    torch_policy = (
        "unknown (torch loaded before main)"
        if "torch" in sys.modules
        else common.wait_policy() or "unset (libgomp's default: spin, then sleep)"
    )
    common.setup_threads(args.threads)
    from hotline.table_layout import bytes_per_row
    from hotline.units import parse_size

    dram = parse_size(args.dram_budget)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=args.cold_dir) as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        dataset = make_data(args, root)
        table_bytes = dataset.total_rows * bytes_per_row(args.dim, "sgd")
        print(f"tables: {dataset.total_rows:,} rows, {table_bytes / 2**20:,.0f} MiB; the disk store's DRAM tier "
              f"{dram / 2**20:,.1f} MiB ({table_bytes / max(1, dram):,.0f}x smaller)", flush=True)  # fmt: skip
        from common import budgets_for_coverage

        from hotline.profiling.profiler import profile

        prof = profile(dataset, embedding_dim=args.dim, mini_batch_size=args.batch, seed=args.seed,
                       progress=False, sample_batches=args.profile_batches, heldout="val")  # fmt: skip
        first = args.profile_batches
        profiled = {"train_batches": [0, first], "heldout": prof.heldout.source,
                    "runs_train_batches": [first, first + args.warmup_steps + args.steps]}  # fmt: skip
        print(f"profile: train batches 0..{first - 1} (held-out: {profiled['heldout']}); every row trains on "
              f"batches {first}..{first + args.warmup_steps + args.steps - 1}", flush=True)  # fmt: skip
        placements = []
        for b in budgets_for_coverage(prof, args.coverages, heldout=True):
            path = root / f"placement-{b['hot_rows']}.npz"
            prof.placement(b["budget_bytes"]).save(path, force=True)  # the run's own scratch
            placements.append({**b, "path": str(path)})

        # the disk timed before the runs too (not with --hardware, whose disk section is used as it is)
        disk_before = disk_calibration(args, root) if not (args.hardware or args.smoke) else None
        # the calibration's probe, timed beside each disk row (a scratch file of the calibration's size; small in
        # --smoke, which only checks that it runs)
        from hotline.costmodel.disk_calibrate import DiskProbe

        probe = stack.enter_context(DiskProbe(root, bytes_per_row(args.dim, "sgd"), args.io_depth, seed=args.seed,
                                              file_bytes=(8 << 20) if args.smoke else 512 << 20))  # fmt: skip

        def disk(i: str) -> dict:
            d = root / f"cold-{i}"
            d.mkdir()
            return {
                "cold_store": "disk",
                "cold_dir": str(d),
                "cold_io_depth": args.io_depth,
                "cold_cache": dram,
            }

        def log(rec):
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items()}, flush=True)
            return rec

        rows.append(log(run_trainer("device", dataset, args, mode="device")))
        rows.append(log(run_mmap(dataset, args, root)))
        rows.append(log(run_mmap_dram(dataset, args, root, dram)))
        # the disk rows, --rounds times, one round after another (a slow spell of the disk lands on one round of
        # several rows, not on every round of one)
        runs = [("hybrid_disk", None, 0)] + [(f"hotline_k{k}_disk", pl, k) for pl in placements
                                             for k in (0, args.lookahead)]  # fmt: skip
        rounds: list[list[dict]] = [[] for _ in runs]
        for n in range(max(1, args.rounds)):
            for (name, pl, k), got in zip(runs, rounds, strict=True):
                cold = disk(f"{name}-{pl['hot_rows'] if pl else 0}-{n + 1}")
                if pl is None:
                    rec = run_trainer(name, dataset, args, probe, mode="hybrid", **cold)
                else:
                    rec = run_trainer(name, dataset, args, probe, mode="hotline", lookahead=k,
                                      placement_path=pl["path"], **cold)  # fmt: skip
                    rec.update(target=pl["target"], hot_rows=pl["hot_rows"], budget_bytes=pl["budget_bytes"])
                rec["round"] = n + 1
                shutil.rmtree(cold["cold_dir"], ignore_errors=True)  # one run's table on the disk at a time
                got.append(log(rec))
        hw = hardware(args, root, dataset, disk_before)
    report = {
        "benchmark": "bench_disk_tier",
        "table_bytes": table_bytes,
        "dram_budget_bytes": dram,
        "profile": profiled,
        **results.summarize(rows, rounds, hw, prof, dataset, args, dram, placements),
        "omp_wait_policy_at_torch_load": torch_policy,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
