"""Choose, the cost model's last stage: the mode, hot budget and look-ahead predicted fastest, on figures alone.

:func:`choose` is the decision (golden-tested): the tables' bytes, the device's memory, a hardware description
(:mod:`hotline.costmodel.hardware`), the workload and the held-out figures of each candidate budget.
Candidates: ``device`` when every table fits in the device memory the run may take
(:data:`DEVICE_MEMORY_SHARE`), ``hybrid``, and ``hotline`` at look-ahead 0 and :data:`LOOKAHEAD` for every
budget of the held-out coverage curve that fits. The fastest prediction wins, but of the predictions within
:data:`TIE_SHARE` of it (closer than the cost model's error) the simplest configuration is chosen. With the
disk cold store (``--cold-store disk``, :class:`ColdDisk`) hybrid and hotline are priced with the disk tier
(:class:`~hotline.costmodel.estimate.DiskTier`), and device mode only where the device has memory of its own
that holds every table (on a CPU its memory is the host memory the disk store keeps the rows out of).

:func:`hotline.costmodel.auto.resolve` gathers those figures for a run and makes the choice every rank's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hotline.costmodel.estimate import DiskTier, Stats
from hotline.costmodel.price import Prediction, predict
from hotline.costmodel.workload import Workload
from hotline.table_layout import bytes_per_row
from hotline.units import format_size

DEVICE_MEMORY_SHARE = 0.8
"""Share of the device's memory the embedding tables (device mode) or the hot tier may take: the rest holds
the model, its activations and the staging buffers."""

LOOKAHEAD = 2
"""The look-ahead ``auto`` weighs against 0 (the cost model prices any K >= 1 alike)."""

TIE_SHARE = 0.10
"""Predictions within this share of the fastest are not told apart, and the simplest of them is chosen: the
cost model's error against measured runs (``benchmarks/bench_costmodel.py``) and the spread of runs of one
configuration (``bench_pipeline``'s rounds) are of that order (their figures: ``docs/performance.md``)."""

_SIMPLER = {"device": 0, "hybrid": 1, "hotline": 2}


@dataclass
class ColdDisk:
    """The disk cold store ``--mode auto`` prices hybrid and hotline with (``--cold-store disk``)."""

    directory: str
    """``--cold-dir``: where the store's file goes (named in the reason)."""
    cache_bytes: int = 0
    """``--cold-cache``: bytes of the DRAM tier, which holds the most popular cold rows (0: none)."""
    held_bytes: int = 0
    """``--cold-write-buffer``: bytes of the held writes, swept to the file in order (0: written in place;
    :func:`hotline.tiers.held_rows.write_buffer_bytes`)."""

    def __post_init__(self) -> None:
        if not self.directory or self.cache_bytes < 0 or self.held_bytes < 0:
            raise ValueError(f"ColdDisk needs a directory, cache_bytes >= 0 and held_bytes >= 0, got "
                             f"{self.directory!r}, {self.cache_bytes}, {self.held_bytes}")  # fmt: skip


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
            rec["disk_held_rows"] = best.disk.held_rows
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
        from hotline.costmodel.phases import disk_timing

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
        record = bytes_per_row(workload.embedding_dim, workload.optimizer)
        return records_tier(workload.embedding_dim, workload.optimizer, share, disk.held_bytes,
                            table_bytes // record)  # fmt: skip

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
    if tier.held_rows:
        cache += f", written rows held in {format_size(disk.held_bytes)} and swept to the file in order"
    pages = f"{tier.pages_per_cold_row:.3g} page{'' if tier.pages_per_cold_row == 1 else 's'}"
    return (
        f"cold rows on disk in {disk.directory} ({pages} of 4 KiB read per cold row{cache}, priced with the "
        "disk's calibrated figures)"
    )


def records_tier(embedding_dim: int, optimizer: str, cached_share: float = 0.0, held_bytes: int = 0,
                 file_rows: int = 0) -> DiskTier:  # fmt: skip
    """The disk tier before any run measured it: each cold row reads the pages its record spans in the file (a
    record is the row and its optimizer's whole state, ``bytes_per_row(embedding_dim, optimizer)`` bytes;
    Adam's at dim 128, 1540 bytes, spans 1.375 pages on average), none shared with another row of the step (the
    popularity order only lowers it); ``held_bytes`` of held writes (the records they hold:
    :func:`hotline.kernels.held_rows.sized`) in a file of ``file_rows`` records."""
    from hotline.kernels.held_rows import sized
    from hotline.tiers.disk_file import pages_per_record

    record = bytes_per_row(embedding_dim, optimizer)
    held = sized(int(held_bytes), record)[1] if held_bytes > 0 else 0
    return DiskTier(
        pages_per_record(record), cached_share, held_rows=held, file_rows=file_rows if held else 0
    )
