"""``hotline train --mode auto``: the mode, hot budget and look-ahead the cost model predicts fastest here.

:func:`choose` is the decision on figures alone (golden-tested): the tables' bytes, the device's memory, a
hardware description (:mod:`hotline.profiling.costmodel`), the workload and the held-out figures of each
candidate budget. Candidates: ``device`` when every table fits in the device memory the run may take
(:data:`DEVICE_MEMORY_SHARE`), ``hybrid``, and ``hotline`` at look-ahead 0 and :data:`LOOKAHEAD` for every
budget of the held-out coverage curve that fits. The fastest prediction wins, but of the predictions within
:data:`TIE_SHARE` of it (closer than the cost model's error) the simplest configuration is chosen. With the
disk cold store (``--cold-store disk``, :class:`ColdDisk`) hybrid and hotline are priced with the disk tier
(:class:`~hotline.profiling.costmodel.DiskTier`), and device mode only where the device has memory of its own
that holds every table (on a CPU its memory is the host memory the disk store keeps the rows out of).

:func:`choose_for_run` gathers those figures for a run: the device's memory, the tables' bytes, a profile of a
sample with held-out figures (or a given profile), and the hardware (``--hardware``: a `hotline calibrate`
JSON or a known GPU; default: the GPU torch names when the table knows it, or this CPU, calibrated once and
cached; the cold dir's disk, with ``--cold-store disk``, timed once per filesystem and record size and
cached beside it, :func:`disk_hardware`). Before any of that it refuses, with one line naming the flags, tables
the memory store cannot hold (:func:`hotline.training.preflight.check_memory`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hotline.profiling.costmodel import DiskTier, Prediction, Stats, Workload, load_hardware, predict
from hotline.units import format_size

DEVICE_MEMORY_SHARE = 0.8
"""Share of the device's memory the embedding tables (device mode) or the hot tier may take: the rest holds
the model, its activations and the staging buffers."""

LOOKAHEAD = 2
"""The look-ahead ``auto`` weighs against 0 (the cost model prices any K >= 1 alike)."""

TIE_SHARE = 0.10
"""Predictions within this share of the fastest are not told apart, and the simplest of them is chosen: the
cost model is checked to 0.8-1.25 of measured runs (``benchmarks/bench_costmodel.py``), and two runs of one
configuration differed by up to 12% on the 2-core machine this was measured on (``bench_pipeline``'s rounds)."""

_SIMPLER = {"device": 0, "hybrid": 1, "hotline": 2}


@dataclass
class ColdDisk:
    """The disk cold store ``--mode auto`` prices hybrid and hotline with (``--cold-store disk``)."""

    directory: str
    """``--cold-dir``: where the store's file goes (named in the reason)."""
    cache_bytes: int = 0
    """``--cold-cache``: bytes of the DRAM tier, which holds the most popular cold rows (0: none)."""

    def __post_init__(self) -> None:
        if not self.directory or self.cache_bytes < 0:
            raise ValueError(
                f"ColdDisk needs a directory and cache_bytes >= 0, got {self.directory!r}, {self.cache_bytes}"
            )


@dataclass
class Candidate:
    """One configuration the chooser priced."""

    mode: str
    """``device``, ``hybrid`` or ``hotline``."""
    lookahead: int
    """Steps gathered ahead (hotline; 0 otherwise)."""
    hbm_budget: int | None
    """Hot-tier bytes (hotline), else None."""
    coverage: float | None
    """Held-out share of lookups that hit hot rows at that budget (hotline), else None."""
    prediction: Prediction
    """The cost model's prediction."""
    disk: DiskTier | None = None
    """The disk tier it was priced with (``--cold-store disk``), else None."""

    @property
    def label(self) -> str:
        if self.mode != "hotline":
            return self.mode
        return f"hotline K={self.lookahead} at {format_size(self.hbm_budget)} (coverage {self.coverage:.2f})"


@dataclass
class AutoChoice:
    """What ``--mode auto`` chose, why, and what it predicted."""

    mode: str
    """The chosen mode."""
    lookahead: int
    """The chosen look-ahead (hotline; 0 otherwise)."""
    hbm_budget: int | None
    """The chosen hot-tier bytes (hotline), else None."""
    predicted_samples_per_s: float
    """The cost model's figure for the choice."""
    reason: str
    """One line: why this choice."""
    candidates: list[Candidate] = field(default_factory=list)
    """Everything priced: the choice first, then the rest fastest first."""
    table_bytes: int = 0
    """Bytes of every embedding table (rows and optimizer state)."""
    device_memory: int = 0
    """Bytes of the device's memory."""
    hardware: str = ""
    """The hardware description's name."""
    cold_store: str = "memory"
    """The cold store hybrid and hotline were priced with: ``memory`` or ``disk``."""
    cold_dir: str | None = None
    """The disk store's directory (``disk``), else None."""
    dense_pass: dict | None = None
    """This CPU's timing of the run's dense pass the compute was priced from (:func:`with_timed_pass`), else
    None (the calibration's fit alone, or a GPU)."""
    trains_on: str = ""
    """Where the run trains when that is not the hardware priced (``--hardware H100`` on a CPU), else empty."""

    def line(self, width: int = 100) -> str:
        """What ``hotline train`` prints: the choice, then why, wrapped to ``width`` columns."""
        import textwrap

        best = self.candidates[0]
        head = f"--mode auto: {best.label}, predicted {self.predicted_samples_per_s:,.0f} samples/s on {self.hardware}"
        if self.trains_on:
            head += f" (priced only: this run trains on {self.trains_on})"
        return "\n".join(
            [
                *textwrap.wrap(head, width, subsequent_indent="    "),
                *textwrap.wrap(
                    f"because {self.reason}", width, initial_indent="  ", subsequent_indent="    "
                ),
            ]
        )

    def record(self, measured_samples_per_s: float | None = None) -> dict:
        """The choice as the run's summary keeps it: prediction beside the measured result."""
        rec = {
            "mode": self.mode,
            "lookahead": self.lookahead,
            "hbm_budget": self.hbm_budget,
            "predicted_samples_per_s": self.predicted_samples_per_s,
            "reason": self.reason,
            "hardware": self.hardware,
            "table_bytes": self.table_bytes,
            "device_memory": self.device_memory,
            "cold_store": self.cold_store,
            "cold_dir": self.cold_dir,
        }
        if self.dense_pass is not None:
            rec["dense_pass"] = self.dense_pass
        best = self.candidates[0] if self.candidates else None
        if best is not None and best.disk is not None:  # what the disk tier was priced with
            rec["disk_pages_per_cold_row"] = best.disk.pages_per_cold_row
            rec["disk_cached_share"] = best.disk.cached_share
        if measured_samples_per_s is not None:
            rec["measured_samples_per_s"] = measured_samples_per_s
            rec["measured_over_predicted"] = measured_samples_per_s / max(self.predicted_samples_per_s, 1e-12)
        return rec


def choose(
    table_bytes: int,
    device_memory: int,
    hw: dict,
    workload: Workload,
    stats_at: Callable[[int], Stats],
    budgets: Sequence[int],
    lookaheads: Sequence[int] = (0, LOOKAHEAD),
    disk: ColdDisk | None = None,
    device_in_memory: bool = True,
) -> AutoChoice:
    """The fastest predicted configuration that fits. ``stats_at(budget)``: held-out figures at a hot-tier
    budget in bytes (0: nothing hot, what device and hybrid move); ``budgets``: the hot-tier budgets to try;
    ``disk``: the cold rows live in the disk store (``hw`` then needs a ``disk`` section);
    ``device_in_memory``: False where device mode would not pass training's check of host memory
    (:func:`~hotline.training.preflight.check_memory`: the memory available now, less its margin, below the
    tables' bytes), though the tables fit 80% of the device's."""
    from hotline.training.preflight import COLD_DISK_FLAGS

    if table_bytes <= 0 or device_memory <= 0:
        raise ValueError(
            f"table_bytes and device_memory must be positive, got {table_bytes}, {device_memory}"
        )
    on_cpu = bool(hw.get("link", {}).get("shared_memory"))  # the device is this CPU: its memory is the host's
    if on_cpu and disk is None and table_bytes > device_memory:
        raise ValueError(
            f"the tables ({format_size(table_bytes)} of embedding rows and optimizer state) exceed this "
            f"machine's memory ({format_size(device_memory)}): keep the cold rows on disk with {COLD_DISK_FLAGS}"
        )
    if disk is not None:
        from hotline.profiling.costmodel import disk_timing

        disk_timing(hw)  # a description without the disk's figures: one line, before any pricing
    room = int(DEVICE_MEMORY_SHARE * device_memory)
    fits = table_bytes <= room
    none_hot = stats_at(0)

    def tier(budget: int, s: Stats) -> DiskTier | None:
        """The disk tier at a hot budget: the DRAM tier holds the next ``cache_bytes`` of rows by popularity
        after the hot ones (the file's head), so it serves the cold rows a budget that much larger makes hot."""
        if disk is None:
            return None
        cold = s.unique_rows_per_batch if budget == 0 else s.cold_rows_per_batch
        share = 0.0
        if disk.cache_bytes and cold > 0:
            share = min(1.0, max(0.0, 1.0 - stats_at(budget + disk.cache_bytes).cold_rows_per_batch / cold))
        return DiskTier.of_records(workload.embedding_dim, workload.optimizer, cached_share=share)

    def priced(mode: str, k: int, budget: int | None, s: Stats, coverage: float | None) -> Candidate:
        cost_mode = mode if mode != "hotline" else ("hotline_k1" if k else "hotline_k0")
        d = tier(budget or 0, s) if mode != "device" else None
        return Candidate(mode, int(k), budget, coverage, predict(cost_mode, workload, s, hw, d), d)

    # with the disk store, device mode only on a device of its own that holds every table
    device_ok = fits and not (disk is not None and on_cpu) and device_in_memory
    cands: list[Candidate] = []
    if device_ok:
        cands.append(priced("device", 0, None, none_hot, None))
    cands.append(priced("hybrid", 0, None, none_hot, None))
    for b in sorted({int(b) for b in budgets if 0 < int(b) <= room and int(b) < table_bytes}):
        s = stats_at(b)
        for k in lookaheads:
            cands.append(priced("hotline", k, b, s, s.hot_lookup_share))
    # fastest first; equal predictions: the simpler mode, the smaller budget, the shorter look-ahead
    cands.sort(key=lambda c: (-c.prediction.samples_per_s, _SIMPLER[c.mode], c.hbm_budget or 0, c.lookahead))
    fastest = cands[0]
    # the simplest configuration predicted within TIE_SHARE of the fastest: the model does not tell them apart
    floor = (1.0 - TIE_SHARE) * fastest.prediction.samples_per_s
    best = min(
        (c for c in cands if c.prediction.samples_per_s >= floor),
        key=lambda c: (_SIMPLER[c.mode], c.lookahead, c.hbm_budget or 0),
    )
    cands.remove(best)
    cands.insert(0, best)
    sizes = f"the tables ({format_size(table_bytes)})"
    memory = (
        f"{format_size(room)} of device memory ({DEVICE_MEMORY_SHARE:.0%} of {format_size(device_memory)})"
    )
    runner = next((c for c in cands[1:] if c.mode != best.mode), None)
    if best is not fastest:  # the simpler of configurations the model does not tell apart
        versus = (
            f"; {fastest.label} is predicted {fastest.prediction.samples_per_s:,.0f} samples/s, within "
            f"{TIE_SHARE:.0%}, which the cost model does not tell apart: the simpler one"
        )
    elif runner is not None:
        versus = f"; next best {runner.label}: {runner.prediction.samples_per_s:,.0f} samples/s"
    else:
        versus = ""
    if best.mode == "device":
        reason = f"all tables fit in device memory: {sizes} within {memory}{versus}"
        if disk is not None:
            reason += f"; --cold-store disk ({disk.directory}) is not used: no row is cold"
    elif best.mode == "hybrid":
        where = "fit in" if fits else "exceed"
        why = "no hot budget is predicted faster than hybrid"
        if best is not fastest:
            why = f"no hot budget is predicted more than {TIE_SHARE:.0%} faster than hybrid"
        if not any(c.mode == "hotline" for c in cands):
            why = "no hot budget of the coverage curve fits"
        reason = f"{sizes} {where} {memory} and {why}{versus}"
    else:
        where = "do not fit in" if not fits else "fit in"
        hyb = next(c for c in cands if c.mode == "hybrid").prediction.samples_per_s
        reason = (
            f"{sizes} {where} {memory}; its bottleneck is {best.prediction.bottleneck}, "
            f"{best.prediction.samples_per_s / hyb:.2f}x hybrid{versus}"
        )
    if best.disk is not None:
        reason = f"{disk_reason(disk, best.disk)}: {reason}"
        if on_cpu and fits:
            reason += "; device mode not considered: on this CPU its memory is the host memory --cold-store disk keeps the rows out of"  # fmt: skip
    elif fits and not device_ok:
        reason += "; device mode not considered: the tables do not fit in the host memory available now (MemAvailable less its margin), which training checks"  # fmt: skip
    return AutoChoice(
        best.mode,
        best.lookahead,
        best.hbm_budget,
        best.prediction.samples_per_s,
        reason,
        cands,
        int(table_bytes),
        int(device_memory),
        str(hw.get("name", "")),
        "disk" if disk is not None else "memory",
        disk.directory if disk is not None else None,
    )


def disk_reason(disk: ColdDisk, tier: DiskTier) -> str:
    """The reason's words for the disk store a choice was priced with."""
    cache = ""
    if disk.cache_bytes:
        cache = f", its DRAM tier ({format_size(disk.cache_bytes)}) serving {tier.cached_share:.0%} of them"
    pages = f"{tier.pages_per_cold_row:.3g} page{'' if tier.pages_per_cold_row == 1 else 's'}"
    return (
        f"cold rows on disk in {disk.directory} ({pages} of 4 KiB read per cold row{cache}, priced with the "
        "disk's calibrated figures)"
    )


# ---------------------------------------------------------------------------------------------- a run's figures
def device_memory(device: str) -> int:
    """Bytes of memory of ``device``: a GPU's total memory, or this machine's physical memory for the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def hardware_for(device: str, spec: str | None = None, threads: int = 0) -> dict:
    """The hardware description ``auto`` prices with: ``spec`` (a `hotline calibrate` JSON or a known GPU's
    name) when given; else the GPU torch names, when the shipped table knows it; else this CPU at ``threads``
    (0: all cores), calibrated once and cached (:func:`cpu_hardware`)."""
    import torch

    if spec:
        return load_hardware(spec)
    dev = torch.device(device)
    if dev.type == "cuda":
        from hotline.profiling.costmodel import known_gpus

        name = torch.cuda.get_device_name(dev)
        match = next((k for k in known_gpus() if k.lower() in name.lower()), None)
        if match is None:
            raise ValueError(
                f"--mode auto: no figures for the GPU {name!r} (known: {', '.join(known_gpus())}); pass "
                "--hardware FILE (from `hotline calibrate`) or an explicit --mode"
            )
        return load_hardware(match)
    return cpu_hardware(threads)


def cpu_hardware_path(threads: int = 0) -> Path:
    """Where :func:`cpu_hardware` keeps this host's calibration at ``threads``: the cache directory
    (:func:`hotline.datasets.default.cache_root`), one file per host, CPU model, core and thread count,
    calibration version, torch version and OpenMP wait policy (a Numba or torch region's start cost 51 us with
    no spin against 2 us with hotline's short one: the timings depend on it)."""
    import platform

    import torch

    import hotline
    from hotline.datasets.default import cache_root
    from hotline.profiling.calibrate import VERSION, cpu_model

    cores = os.cpu_count() or 1
    policy = [os.environ.get(k) for k in hotline._WAIT_POLICY_VARS]
    key = json.dumps([platform.node(), platform.machine(), cpu_model(), cores, int(threads or cores), VERSION,
                      torch.__version__, *policy])  # fmt: skip
    return cache_root() / f"hardware-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


def cpu_hardware(threads: int = 0, say: Callable[[str], None] | None = None) -> dict:
    """This CPU as its own device: `hotline calibrate`'s description (the figures `bench_costmodel` checks
    the cost model against), timed once per host and thread count (well under a minute) and read back from
    :func:`cpu_hardware_path` afterwards (its ``source`` records the load average it was timed at; delete the
    file, or pass a fresh `hotline calibrate` JSON as --hardware, to time it again). A cache that cannot be
    written only costs the timing next time."""
    from hotline.profiling.calibrate import calibrate

    path = cpu_hardware_path(threads)
    if path.is_file():
        try:
            return load_hardware(path)
        except ValueError:
            pass  # damaged or from another version: time it again
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"timing this CPU once for the cost model of --mode auto (under a minute; kept in {path})")
    hw = calibrate(threads=threads or None)
    _keep(path, hw, "this CPU's timing", say)
    return hw


STALE_CALIBRATION = 1.3
"""When this CPU runs the calibration's reference pass more than this many times faster now than it did while
its cached calibration was timed, that calibration is taken as timed in a slow spell or beside other work, and
it is timed again (:func:`with_timed_pass` with ``recalibrate``)."""


def with_timed_pass(
    hw: dict,
    w: Workload,
    threads: int = 0,
    say: Callable[[str], None] | None = None,
    recalibrate: bool = False,
) -> dict:
    """``hw`` (this CPU's calibration) with the run's own dense pass timed on this CPU and added to
    ``device.passes`` (:func:`~hotline.profiling.calibrate.time_pass`, a few passes), unless it holds one
    for this model already: the cost model then prices every mode's compute from the run's own model, not
    only from the calibration's fit over 13 other shapes (see :func:`~hotline.profiling.costmodel.pass_key`).
    Timed each run, not cached: it is the largest phase of a CPU step. Timed beside the calibration's
    reference pass, so that the speed this host had during the calibration, not in that second, scales it.

    ``recalibrate`` (``hw`` is :func:`cpu_hardware`'s cached calibration): when the reference pass runs more
    than :data:`STALE_CALIBRATION` times faster now than when the calibration was timed, that calibration was
    timed in a slow spell or beside other work (the test suite, a build) and would price every mode that much
    too slow: this CPU is timed again (under a minute), and the faster of the two calibrations is kept and
    prices the run."""
    from hotline.profiling.calibrate import calibrate, time_pass
    from hotline.profiling.costmodel import pass_key

    key = pass_key(w)
    passes = hw["device"].get("passes") or {}
    if key in passes:
        return hw
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    say(
        f"timing this model's dense pass on this CPU for --mode auto (batch {w.batch_size:,}: a few passes of"
        " the run's own model, longer for a larger one)"
    )
    timed = time_pass(w, threads=threads or None, reference_us=hw["device"].get("reference_pass_us"))
    slower = timed["reference_scale"]
    if recalibrate and slower > STALE_CALIBRATION:
        path = cpu_hardware_path(threads)
        say(
            f"this CPU's cached calibration ran its reference pass {slower:.2f}x slower than this CPU runs it "
            f"now ({hw.get('source', 'no source')}): timing this CPU again (under a minute)"
        )
        fresh = calibrate(threads=threads or None)
        if fresh["device"]["reference_pass_us"] < hw["device"]["reference_pass_us"]:
            _keep(path, fresh, "this CPU's timing", say)
            hw = {**hw, **fresh}  # a disk section priced beside it stays
            timed = time_pass(w, threads=threads or None, reference_us=fresh["device"]["reference_pass_us"])
    return {**hw, "device": {**hw["device"], "passes": {**passes, key: timed}}}


def _keep(path: Path, figures: dict, what: str, say: Callable[[str], None]) -> None:
    """Keeps a timing in the cache; one that cannot be written only costs the timing next time."""
    from hotline import _io

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _io.write_json(path, figures)
    except OSError as e:
        say(f"could not keep {what} in {path} ({e.strerror or e}); it is timed again next run")


def filesystem_of(path: str | os.PathLike) -> list[str]:
    """The filesystem ``path`` lives on, as the kernel names it (``/proc/self/mountinfo``: the mount point that
    holds it, the device's major:minor, the filesystem type and its source), or its device number where that
    table cannot be read."""
    real = os.path.realpath(path)
    best: list[str] = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                point = fields[4].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(tail) >= 2 and (not best or len(point) >= len(best[0])):
                    best = [point, fields[2], tail[0], tail[1]]
    except (OSError, IndexError):
        best = []
    return best or [f"st_dev {os.stat(path).st_dev}"]


def disk_hardware_path(cold_dir: str | os.PathLike, record_bytes: int, depth: int) -> Path:
    """Where :func:`disk_hardware` keeps the timing of ``cold_dir``'s disk: the cache directory, one file per
    host, filesystem (:func:`filesystem_of`), record size and I/O depth (the step-shaped figures depend on
    both) and timing format (the step section's, and the compute lengths the I/O beside compute is timed at:
    a timing kept before either changed is not read, and the disk is timed again)."""
    import platform

    from hotline.datasets.default import cache_root
    from hotline.profiling.costmodel import STEP_FORMAT
    from hotline.profiling.disk_calibrate import BESIDE_SHARES

    key = json.dumps([platform.node(), filesystem_of(cold_dir), int(record_bytes), int(depth), STEP_FORMAT,
                      list(BESIDE_SHARES)])  # fmt: skip
    return cache_root() / f"disk-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


def disk_hardware(
    cold_dir: str | os.PathLike,
    record_bytes: int,
    depth: int = 32,
    say: Callable[[str], None] | None = None,
    **timing,
) -> dict:
    """The ``disk`` section ``auto`` prices the disk store with: `hotline calibrate --disk`'s figures for the
    filesystem of ``cold_dir`` at the run's record size and I/O depth, timed once (about a minute) and read
    back from :func:`disk_hardware_path` afterwards (its ``source`` records the load average it was timed at;
    delete the file to time it again). The timing runs in a fresh directory of its own inside
    ``cold_dir`` (scratch files, removed with it afterwards: nothing of the user's is touched; made by
    :func:`~hotline.profiling.disk_calibrate.calibrate_disk`); ``timing``:
    :func:`~hotline.profiling.disk_calibrate.calibrate_disk`'s sizes (tests time a small file)."""
    from hotline.profiling.costmodel import STEP_FORMAT
    from hotline.profiling.disk_calibrate import calibrate_disk

    path = disk_hardware_path(cold_dir, record_bytes, depth)
    try:
        kept = json.loads(path.read_text())
        if kept.get("step", {}).get("version") == STEP_FORMAT:
            return kept
    except (OSError, ValueError, AttributeError):
        pass  # none yet, damaged or from another version: time it again
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    fs = filesystem_of(cold_dir)
    what = f"{fs[3]} on {fs[2]}" if len(fs) == 4 else fs[0]
    say(f"timing the disk of {cold_dir} once for --mode auto ({what}, {record_bytes}-byte records, depth "
        f"{depth}; about a minute, on scratch files removed afterwards; kept in {path})")  # fmt: skip
    try:  # in a scratch folder of its own that calibrate_disk makes in cold_dir and removes
        section = calibrate_disk(cold_dir, depth, record_bytes=record_bytes, **timing)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(
            f"--mode auto could not time the disk of --cold-dir {cold_dir} ({why}): pass --hardware "
            "FILE with a disk section (`hotline calibrate --disk DIR`) or an explicit --mode"
        ) from None
    section["path"] = str(cold_dir)
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    # as `hotline calibrate` records it: a timing taken under load is not the disk's (delete the file to time again)
    section["source"] = f"--mode auto's timing of {cold_dir}, load average {load}"
    _keep(path, section, "the disk's timing", say)
    return section


def table_bytes(table_sizes: Sequence[int], embedding_dim: int, optimizer: str) -> int:
    """Bytes of every embedding row with its optimizer state."""
    from hotline.table_layout import bytes_per_row

    return int(sum(table_sizes)) * bytes_per_row(embedding_dim, optimizer)


def choose_for_run(
    config,
    dataset,
    hardware: str | dict | None = None,
    prof=None,
    progress: bool = False,
    nodes: int = 1,
    available: int | None = None,
) -> AutoChoice:
    """:func:`choose` for a TrainConfig and its Dataset: profiles a sample with held-out figures unless
    ``prof`` (a Profile of this dataset) is given. With ``config.cold_store == 'disk'`` it prices the disk
    store in ``config.cold_dir`` (the hardware's ``disk`` section, else :func:`disk_hardware`). Before any
    long work it refuses a run whose rows cannot fit in this machine's memory, and prices only the hot budgets
    that fit it (``nodes``: machines the ranks run on, each holding its share; ``available``: the memory figure,
    default the smaller of the machine's ``MemAvailable`` and the cgroup's room, as
    :func:`~hotline.training.preflight.check_memory` takes it)."""
    from hotline.datasets.format import Dataset
    from hotline.profiling.costmodel import arch_of, disk_timing, timed_pass, workload_for
    from hotline.table_layout import bytes_per_row

    dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    # the checks training makes first, made before the profiling: bad input is named before any long work
    from hotline.training.host_memory import host_memory
    from hotline.training.preflight import MemoryShortfall, check_ids, check_memory

    if dataset.train.num_batches(config.mini_batch_size) == 0:
        raise ValueError(f"the training split of {dataset.path} has no rows to train on")
    # hybrid needs the least host memory of the modes: the rows (memory store) or their index arrays (disk);
    # checked first, from the sizes alone: a run that cannot fit is refused before the ids are read
    available = host_memory() if available is None else available  # the machine's and the cgroup's
    check_memory(replace(config, mode="hybrid", hbm_budget=None), dataset, max(1, nodes), available)
    check_ids(dataset)  # reads every id of every split once

    def in_memory(budget: int) -> bool:
        """Whether hotline at ``budget`` passes the check training makes (the disk store's hot rows and DRAM
        tier are host memory too)."""
        try:
            hot = replace(config, mode="hotline", hbm_budget=int(budget), lookahead=LOOKAHEAD)
            check_memory(hot, dataset, max(1, nodes), available)
        except MemoryShortfall:
            return False
        return True

    hw = hardware_for(config.device, hardware, config.threads)
    _say_gpu_on_cpu(hardware, config.device)
    disk = None
    if config.cold_store == "disk":
        disk = ColdDisk(str(config.cold_dir), int(config.cold_cache))
        if "disk" not in hw:  # a --hardware FILE with a disk section is used as is
            record = bytes_per_row(config.embedding_dim, config.optimizer)
            hw = {**hw, "disk": disk_hardware(config.cold_dir, record, config.cold_io_depth)}
        disk_timing(hw)  # one line for an outdated disk section, before the profiling
    if prof is None:
        from hotline.training.placing import profile_for

        prof = profile_for(config, dataset, progress)
    # the model the run trains: its MLPs, interaction and cross layers
    w = workload_for(prof, worker_threads=config.worker_threads, **arch_of(config))
    if hardware is None and torch_device_type(config.device) == "cpu":  # this CPU's own calibration
        hw = with_timed_pass(hw, w, config.threads, recalibrate=True)
    budgets = [int(b) for b in prof.curve().budget_bytes if in_memory(int(b))]
    try:  # device mode's check before its tables are made (on a CPU they are host memory)
        check_memory(
            replace(config, mode="device", cold_store="memory", cold_dir=None),
            dataset,
            max(1, nodes),
            available,
        )
        device_in_memory = True
    except MemoryShortfall:
        device_in_memory = False
    choice = choose(
        table_bytes(dataset.table_sizes, config.embedding_dim, config.optimizer),
        device_memory(config.device),
        hw,
        w,
        lambda b: Stats.from_profile(prof, int(b), batch_size=config.mini_batch_size),
        budgets,
        disk=disk,
        device_in_memory=device_in_memory,
    )
    choice.dense_pass = timed_pass(w, hw["device"])
    return choice


def _say_gpu_on_cpu(hardware, device: str) -> None:
    """One line on stderr when ``--hardware`` names a GPU and the run trains on the CPU: the choice prices the
    GPU's speeds with this host's memory as the device's (the run is on this machine), not the GPU's."""
    from hotline.profiling.costmodel import known_gpus
    from hotline.units import format_size

    if not isinstance(hardware, str) or torch_device_type(device) != "cpu":
        return
    gpu = next((k for k in known_gpus() if k.lower() == hardware.lower()), None)
    if gpu is not None:
        print(
            f"hotline train: warning: --hardware {hardware} prices a {gpu}'s speeds, but this run trains on the CPU: "
            f"the device memory priced is this host's ({format_size(device_memory(device))}), not the {gpu}'s; "
            "run on the GPU (--device cuda) to price the GPU as it is",
            file=sys.stderr,
        )


def torch_device_type(device: str) -> str:
    """``cpu`` or ``cuda`` (torch's name for the device's kind)."""
    import torch

    return torch.device(device).type


def resolve(config, dataset, comm=None, hardware: str | dict | None = None) -> tuple:
    """``mode='auto'`` made concrete for every rank: rank 0 chooses (:func:`choose_for_run`, the ranks'
    machines counted from ``LOCAL_WORLD_SIZE``, each holding its ranks' share of the rows) and every rank
    takes that choice, figures and all (:meth:`~hotline.distributed.comm.Comm.broadcast_object`). Returns the
    config to train (:func:`choice_fields` applied) and the :class:`AutoChoice`."""
    world = comm.world_size if comm is not None else 1
    nodes = max(1, world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    choice = None
    if comm is None or comm.rank == 0:
        choice = choose_for_run(config, dataset, hardware, progress=config.progress, nodes=nodes)
    if comm is not None:
        choice = comm.broadcast_object(choice)
    return replace(config, **choice_fields(choice)), choice


def choice_fields(choice: AutoChoice) -> dict:
    """The TrainConfig fields a choice sets (device mode keeps no cold store: nothing is cold)."""
    fields = {"mode": choice.mode, "lookahead": choice.lookahead, "hbm_budget": choice.hbm_budget}
    if choice.mode == "device":
        fields.update(cold_store="memory", cold_dir=None, cold_cache=0)
    return fields
