"""``hotline train --mode auto``: the mode, hot budget and look-ahead the cost model predicts fastest here.

:func:`choose` is the decision on figures alone (golden-tested): the tables' bytes, the device's memory, a
hardware description (:mod:`hotline.profiling.costmodel`), the workload and the held-out figures of each
candidate budget. Candidates: ``device`` when every table fits in the device memory the run may take
(:data:`DEVICE_MEMORY_SHARE`), ``hybrid``, and ``hotline`` at look-ahead 0 and :data:`LOOKAHEAD` for every
budget of the held-out coverage curve that fits. The fastest prediction wins, but of the predictions within
:data:`TIE_SHARE` of it (closer than the cost model's error) the simplest configuration is chosen.

:func:`choose_for_run` gathers those figures for a run: the device's memory, the tables' bytes, a profile of a
sample with held-out figures (or a given profile), and the hardware (``--hardware``: a `hotline calibrate`
JSON or a known GPU; default: the GPU torch names when the table knows it, or this CPU, calibrated once and
cached).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hotline.profiling.costmodel import Prediction, Stats, Workload, load_hardware, predict
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

    def line(self) -> str:
        """The one or two lines ``hotline train`` prints."""
        best = self.candidates[0]
        return f"--mode auto: {best.label}, predicted {self.predicted_samples_per_s:,.0f} samples/s on " \
            f"{self.hardware}\n  because {self.reason}"  # fmt: skip

    def code(self) -> list[float]:
        """The decision as numbers (mode, look-ahead, budget), for ranks to agree on one choice."""
        return [float(_SIMPLER[self.mode]), float(self.lookahead), float(self.hbm_budget or 0)]

    @classmethod
    def from_code(cls, code: Sequence[float]) -> AutoChoice:
        """The decision :meth:`code` made (no figures: another rank chose and printed them)."""
        mode = next(m for m, i in _SIMPLER.items() if i == round(code[0]))
        budget = int(round(code[2])) or None
        return cls(mode, int(round(code[1])), budget, 0.0, "chosen by rank 0")

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
        }
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
) -> AutoChoice:
    """The fastest predicted configuration that fits. ``stats_at(budget)``: held-out figures at a hot-tier
    budget in bytes (0: nothing hot, what device and hybrid move); ``budgets``: the hot-tier budgets to try."""
    if table_bytes <= 0 or device_memory <= 0:
        raise ValueError(
            f"table_bytes and device_memory must be positive, got {table_bytes}, {device_memory}"
        )
    room = int(DEVICE_MEMORY_SHARE * device_memory)
    fits = table_bytes <= room
    none_hot = stats_at(0)
    cands: list[Candidate] = []
    if fits:
        cands.append(Candidate("device", 0, None, None, predict("device", workload, none_hot, hw)))
    cands.append(Candidate("hybrid", 0, None, None, predict("hybrid", workload, none_hot, hw)))
    for b in sorted({int(b) for b in budgets if 0 < int(b) <= room and int(b) < table_bytes}):
        s = stats_at(b)
        for k in lookaheads:
            p = predict("hotline_k1" if k else "hotline_k0", workload, s, hw)
            cands.append(Candidate("hotline", int(k), b, s.hot_lookup_share, p))
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
    (:func:`hotline.datasets.default.cache_root`), one file per host, CPU model, core and thread count and
    calibration version."""
    import platform

    import torch

    from hotline.datasets.default import cache_root
    from hotline.profiling.calibrate import VERSION, cpu_model

    cores = os.cpu_count() or 1
    key = json.dumps([platform.node(), platform.machine(), cpu_model(), cores, int(threads or cores), VERSION,
                      torch.__version__])  # fmt: skip
    return cache_root() / f"hardware-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


def cpu_hardware(threads: int = 0, say: Callable[[str], None] | None = None) -> dict:
    """This CPU as its own device: `hotline calibrate`'s description (the figures `bench_costmodel` checks
    the cost model against), timed once per host and thread count (well under a minute) and read back from
    :func:`cpu_hardware_path` afterwards (its ``source`` records the load average it was timed at; delete the
    file, or pass a fresh `hotline calibrate` JSON as --hardware, to time it again). A cache that cannot be
    written only costs the timing next time."""
    from hotline import _io
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _io.write_json(path, hw)
    except OSError as e:
        say(f"could not keep this CPU's timing in {path} ({e.strerror or e}); it is timed again next run")
    return hw


def table_bytes(table_sizes: Sequence[int], embedding_dim: int, optimizer: str) -> int:
    """Bytes of every embedding row with its optimizer state."""
    from hotline.table_layout import bytes_per_row

    return int(sum(table_sizes)) * bytes_per_row(embedding_dim, optimizer)


def choose_for_run(
    config, dataset, hardware: str | None = None, prof=None, progress: bool = False
) -> AutoChoice:
    """:func:`choose` for a TrainConfig and its Dataset: profiles a sample with held-out figures unless
    ``prof`` (a Profile of this dataset) is given."""
    from hotline.datasets.format import Dataset
    from hotline.profiling.costmodel import arch_of, workload_for

    dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    # the checks training makes first, made before the profiling: bad input is named before any long work
    from hotline.training.preflight import check_ids

    check_ids(dataset)
    if dataset.train.num_batches(config.mini_batch_size) == 0:
        raise ValueError(f"the training split of {dataset.path} has no rows to train on")
    if prof is None:
        from hotline.training.placing import profile_for

        prof = profile_for(config, dataset, progress)
    hw = hardware_for(config.device, hardware, config.threads)
    # the model the run trains: its MLPs, interaction and cross layers
    w = workload_for(prof, worker_threads=config.worker_threads, **arch_of(config))
    budgets = [int(b) for b in prof.curve().budget_bytes]
    return choose(
        table_bytes(dataset.table_sizes, config.embedding_dim, config.optimizer),
        device_memory(config.device),
        hw,
        w,
        lambda b: Stats.from_profile(prof, int(b), batch_size=config.mini_batch_size),
        budgets,
    )


def choice_fields(choice: AutoChoice) -> dict:
    """The TrainConfig fields a choice sets."""
    return {"mode": choice.mode, "lookahead": choice.lookahead, "hbm_budget": choice.hbm_budget}
