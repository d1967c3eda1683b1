"""Price, the cost model's second stage: samples/s of device, hybrid, hotline K=0 and K>=1 and the phase or
lane that bounds each, from a workload, its estimated figures and a hardware description. Pure: it never times
anything (the timing probes, :mod:`hotline.costmodel.calibrate` and :mod:`~hotline.costmodel.disk_calibrate`,
sit above it).

Sequential modes (device, hybrid, hotline K=0) add their phases (:func:`~hotline.costmodel.phases.phases`).
Hotline with look-ahead K >= 1 runs host work on a producer thread, the write-back on a writer thread and
compute on the main thread: a step takes the largest of host work, link and device work, plus what cannot
overlap (the hand-over between threads); where the device is this CPU, all of them share its cores by the
executor's rule (torch keeps the cores the producer was not measured to keep busy:
:func:`hotline.pipeline.threads.compute_threads`; every producer kernel releases the GIL), so host work and
compute overlap only partly: a step takes the longer of the two plus the calibrated share (``overlap_penalty``,
measured with the rule on) of the shorter (see :func:`shared_cores_lane`).

What a step moves comes from held-out figures (never the in-sample ones): lookups that hit hot rows, the
popular-sample share, unique cold rows per mini-batch, and unique rows per mini-batch (hybrid's working set).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hotline.costmodel.estimate import DiskTier, Stats
from hotline.costmodel.phases import beside, disk_timing, overlapped, phases
from hotline.costmodel.workload import Workload, workload_for

PRICED_MODES = ("device", "hybrid", "hotline_k0", "hotline_k1")
"""The modes predicted: ``hotline_k1`` stands for any look-ahead K >= 1 (the pipelined step)."""


@dataclass
class Prediction:
    """Predicted step time of one mode, by phase."""

    mode: str
    samples_per_s: float
    step_s: float
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds per step of each phase (in a pipelined step, of each lane: host, link, device, ...)."""
    bottleneck: str = ""
    """The phase (sequential) or lane (pipelined) that takes the most time."""
    compute_threads: int = 0
    """Look-ahead on a CPU device: torch's threads while the producer runs, by the executor's rule (0: n/a)."""


def shared_cores_lane(t_host: float, t_device: float, host: dict, worker_threads: int) -> tuple[int, float]:
    """(torch threads, seconds) of a look-ahead step whose host work (``t_host`` s on the producer and writer)
    and device work (``t_device`` s on all calibrated threads) share this CPU's cores.

    torch's threads come from the executor's own rule (:func:`hotline.pipeline.threads.compute_threads`) at
    the producer's busy share of the step, solved by fixed point (the share depends on the step, the step on
    the threads). Where the calibration measured the overlap with that rule on (``overlap_penalty``: the part
    of the shorter lane that still costs time, 0 free, 1 serial), the step is the longer lane plus that part
    of the shorter. Without one, device work is stretched to the threads it keeps (linear in threads, an upper
    bound) and runs beside host work: the longer of the two."""
    from hotline.pipeline.threads import compute_threads

    cores = int(host.get("cores", host.get("threads", 1)))
    calibrated = float(host.get("threads", cores))
    penalty = host.get("overlap_penalty")
    step = max(t_host, t_device)
    n = cores
    for _ in range(8):  # converges in two or three rounds; the share only moves n by whole threads
        n = compute_threads(cores, worker_threads, t_host / step if step > 0 else 0.0)
        if penalty is not None:
            new = max(t_host, t_device) + float(penalty) * min(t_host, t_device)
        else:
            new = max(t_host, t_device * calibrated / min(n, calibrated))
        if abs(new - step) <= 1e-12:
            break
        step = new
    return n, step


def predict(mode: str, w: Workload, s: Stats, hw: dict, disk: DiskTier | None = None) -> Prediction:
    """Predicted samples/s of ``mode`` (``hotline_k1``: any look-ahead K >= 1) and its bottleneck; ``disk``:
    with the cold rows in the disk store."""
    if mode not in PRICED_MODES:
        raise ValueError(f"mode must be one of {PRICED_MODES}, got {mode!r}")
    ph = phases(mode, w, s, hw, disk)
    if mode != "hotline_k1":
        # disk_cpu is inside the reads' and writes' wall time, disk_sweep inside disk_write; a sequential step
        # reads nothing again
        timed = {k: v for k, v in ph.items() if k not in ("disk_cpu", "disk_reread", "disk_sweep")}
        step = sum(timed.values())
        bottleneck = max(timed, key=timed.get)
        return Prediction(mode, w.batch_size / step, step, ph, bottleneck)
    lanes = {
        "host work (dispatch + gather)": ph["dispatch"] + ph["gather"],
        "link (h2d + d2h)": ph["h2d"] + ph["d2h"],
        "device (compute + updates)": ph["refresh"]
        + ph["assemble"]
        + ph["compute"]
        + ph["sparse_update"]
        + ph["dense_update"],
        "write-back": ph["write_back"] + ph.get("disk_write", 0.0) + ph.get("disk_reread", 0.0),
    }
    timing = disk_timing(hw) if disk is not None else {}
    if disk is not None:  # the producer's reads beside the writer's write-backs: one file, one I/O pool
        lanes["disk (reads beside writes)"] = overlapped(
            ph["disk_read"], ph["disk_write"] + ph["disk_reread"], timing["read_write_penalty"]
        )
        lanes["host work (dispatch + gather)"] += ph["disk_read"]
    step = max(lanes.values())
    host = hw["host"]
    threads = 0
    if hw["link"].get("shared_memory"):  # every lane runs on this CPU's cores
        t_h = ph["dispatch"] + ph["gather"] + ph["write_back"]
        threads, lanes["shared cores"] = shared_cores_lane(
            t_h, lanes["device (compute + updates)"], host, w.worker_threads
        )
        step = max(step, lanes["shared cores"])
        if disk is not None:  # the I/O threads beside the compute, as the calibration timed them together
            lanes["disk beside compute"] = beside(
                lanes["disk (reads beside writes)"], lanes["shared cores"], timing
            )
            step = max(step, lanes["disk beside compute"])
    handover = host.get("handover_us", 0.0) * 1e-6
    step += handover
    lanes["hand-over"] = handover
    bottleneck = max((k for k in lanes if k != "hand-over"), key=lanes.get)
    return Prediction(
        mode, w.batch_size / step, step, {**ph, **{f"lane: {k}": v for k, v in lanes.items()}}, bottleneck,
        compute_threads=threads,
    )  # fmt: skip


def predict_all(
    w: Workload, s: Stats, hw: dict, modes=PRICED_MODES, disk: DiskTier | None = None
) -> dict[str, Prediction]:
    """:func:`predict` for each mode."""
    return {m: predict(m, w, s, hw, disk) for m in modes}


def prediction_table(preds: dict[str, Prediction]) -> str:
    """The predictions as text: mode, samples/s, ms/step, speed-up over hybrid, bottleneck."""
    hybrid = preds.get("hybrid")
    lines = [f"{'mode':<11} {'samples/s':>11} {'ms/step':>9} {'vs hybrid':>9}  bottleneck"]
    for m, p in preds.items():
        vs = f"{p.samples_per_s / hybrid.samples_per_s:.2f}x" if hybrid else "-"
        lines.append(f"{m:<11} {p.samples_per_s:>11,.0f} {1e3 * p.step_s:>9.2f} {vs:>9}  {p.bottleneck}")
    return "\n".join(lines)


def speedup_curve(prof, hw: dict, workload: Workload | None = None, budgets=None):
    """A DataFrame over budgets (default: the profile's curve budgets): held-out coverage and popular share,
    predicted samples/s of every mode, and hotline's (best K) speed-up over hybrid and share of device."""
    import pandas as pd

    w = workload or workload_for(prof)
    curve = prof.curve(budgets)
    rows = []
    for b in curve.budget_bytes:
        s = Stats.from_profile(prof, int(b))
        preds = predict_all(w, s, hw)
        best = max(preds["hotline_k0"].samples_per_s, preds["hotline_k1"].samples_per_s)
        rows.append(
            {
                "budget_bytes": int(b),
                "heldout_coverage": s.hot_lookup_share,
                "heldout_popular_share": s.popular_sample_share,
                **{f"{m}_samples_per_s": p.samples_per_s for m, p in preds.items()},
                "speedup_vs_hybrid": best / preds["hybrid"].samples_per_s,
                "k0_vs_hybrid": preds["hotline_k0"].samples_per_s / preds["hybrid"].samples_per_s,
                "k1_vs_hybrid": preds["hotline_k1"].samples_per_s / preds["hybrid"].samples_per_s,
                "share_of_device": best / preds["device"].samples_per_s,
                "bottleneck_k1": preds["hotline_k1"].bottleneck,
            }
        )
    return pd.DataFrame(rows)
