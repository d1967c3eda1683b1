"""The phases of a step, each priced in seconds from a hardware description (JSON; see
:func:`~hotline.costmodel.hardware.load_hardware`):

- host work: ``dispatch`` (split the batch: per lookup, and per cold lookup, which also gets a working-buffer
  slot), ``gather`` (cold rows out of host memory: bytes at the host's gather bandwidth) and ``write_back``
  (bytes at its scatter bandwidth);
- link: ``h2d`` / ``d2h`` of the working rows and the index arrays (none when the device is this CPU: the
  tensors are shared, not copied);
- device work: ``lookup`` (device mode: every looked-up row read out of the whole table) or ``assemble`` (the
  other modes: the looked-up rows put together from the hot table and the working buffer), ``compute``
  (forward and backward of each micro-batch of the model the run trains,
  :class:`~hotline.costmodel.workload.Workload`: the dense GEMMs' FLOPs at the dense rate (the MLPs and, for
  DCN-v2, the cross layers' low-rank products), the dot interaction's FLOPs at its own rate (batched small
  products run far below the GEMM rate; cat and dcn have none), bytes at the memory bandwidth, plus a fixed
  cost per pass), ``sparse_update`` (per lookup gradient
  and per updated row) and ``dense_update`` (the dense parameters, plus a cost per parameter tensor); under
  look-ahead also ``refresh`` (the stale rows, which an earlier step in flight may still update: the producer
  skips them and the main thread reads them before the step computes, at the host's one-thread gather
  bandwidth where the device is this CPU, over the link on a GPU).

Two lanes run together (the disk's reads beside its write-backs, the I/O beside the compute) take the longer
plus a calibrated share of the shorter (:func:`overlapped`, :func:`overlapped_at`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hotline.costmodel.estimate import DiskTier, Stats
from hotline.costmodel.workload import Workload

STEP_FORMAT = 6
"""The version of the ``step`` section (a description without it predates step-shaped timing; format 2 timed
the I/O alone, not after a compute pass as training issues it; 2 and 3 priced pages, not requests; 4 requests
alone, not the pages a request reads beyond its first; 5 priced reads beside write-backs from a pair of
threads, not from a timed look-ahead pipeline)."""


def disk_timing(hw: dict) -> dict:
    """The step-shaped disk figures of ``hw`` (its ``disk`` section's ``step``, from ``hotline calibrate --disk
    DIR``); a one-line error where there are none, or only the per-page figures of an older calibration."""
    d = hw.get("disk")
    if d is None:
        raise ValueError("the hardware description has no disk section: run `hotline calibrate --disk DIR`")
    step = d.get("step")
    if not isinstance(step, dict) or step.get("version") != STEP_FORMAT:
        raise ValueError("the hardware description's disk section predates step-shaped disk timing (format "
                         f"{STEP_FORMAT}): run `hotline calibrate --disk DIR` again")  # fmt: skip
    return step


SWEEP_CHUNK_BYTES = 64 << 20
"""The span of the file a sweep of held writes reads and writes at a time (``chunk_bytes`` of
:meth:`hotline.tiers.held_rows.HeldRows.sweep`)."""


def held_timing(hw: dict) -> dict:
    """The held writes' figures of ``hw``'s disk section (``step.held``: the put's ``fixed_us``, ``us_per_row``
    and ``cpu_us_per_row``; the sweep's ``us_per_span`` and ``mbps``, bytes of the file it covers per second,
    each read and written). A calibration from before held writes has none: the put is priced as the host's
    scatter (the ``write_back`` phase), the sweep at the disk's sequential write rate each way."""
    held = disk_timing(hw).get("held")
    if held is not None:
        return held
    seq = float(hw["disk"].get("seq_write_mbps", 0.0))
    if seq <= 0:
        raise ValueError("the hardware description's disk section has no sequential write rate to price held "
                         "writes with: run `hotline calibrate --disk DIR` again")  # fmt: skip
    return {"put": {"fixed_us": 0.0, "us_per_row": 0.0, "cpu_us_per_row": 0.0},
            "sweep": {"us_per_span": 0.0, "mbps": seq / 2}}  # fmt: skip


def sweep_spans(held: float, file_rows: float, record: int) -> tuple[float, float]:
    """(spans, records) a sweep of ``held`` records spread at random over a file of ``file_rows`` reads and
    writes: it takes the held records in file order, a span from one to the last within
    :data:`SWEEP_CHUNK_BYTES` of it, so with ``x`` held records a chunk a span covers all but about
    ``chunk / x`` of its chunk and a gap of about as much follows it (all of the file where they lie close, one
    record a span where they lie far apart; rows gathered at the file's popular head cover less)."""
    if held <= 0 or file_rows <= 0:
        return 0.0, 0.0
    held = min(float(held), float(file_rows))
    x = held * max(1, SWEEP_CHUNK_BYTES // int(record)) / file_rows
    spans = held / (x + 1.0)
    covered = file_rows * (x + np.expm1(-x)) / (x + 1.0) + spans
    return spans, float(min(file_rows, covered))


def held_write_s(hw: dict, disk: DiskTier, rows: float, record: int) -> tuple[float, float, float]:
    """(the put's seconds, the sweep's seconds a step, the put's CPU seconds) of a step writing ``rows`` records
    into the write buffer of ``disk.held_rows`` records: the put timed per row, and a sweep of a full buffer
    (:func:`sweep_spans` at the calibrated cost per span and rate) spread over the ``held_rows / rows`` steps
    that fill it (every row written taken as new: a row written again while held takes no slot, and the
    buffer fills more slowly)."""
    if rows <= 0:
        return 0.0, 0.0, 0.0
    t = held_timing(hw)
    put, sweep = t["put"], t["sweep"]
    spans, covered = sweep_spans(disk.held_rows, disk.file_rows or disk.held_rows, record)
    sweep_s = spans * sweep["us_per_span"] * 1e-6 + covered * record / (sweep["mbps"] * 1e6)
    return ((put["fixed_us"] + put["us_per_row"] * rows) * 1e-6, sweep_s * rows / disk.held_rows,
            put["cpu_us_per_row"] * rows * 1e-6)  # fmt: skip


def _disk_phases(hw: dict, disk: DiskTier, cold_rows: float, record: int) -> dict[str, float]:
    """Seconds per step of the disk store, as the calibration timed a step's I/O through the store's code
    (``fixed + per request + per page`` for the fetch's reads and for the write-back, each at the store's I/O
    depth, their CPU inside; a step's requests are its pages times ``calls_per_page``, the write-back's the
    fetch's, one per run of pages; the fetch reads all but the ``skipped_share`` of them; ``disk_reread``: the
    pages read again under look-ahead, at the reads' rates per request and per page), and
    the CPU seconds the I/O threads spend in them (``disk_cpu``, for the record). With held writes
    (``disk.held_rows`` at least a step's rows) the write-back is :func:`held_write_s`'s put and its share of
    a sweep (``disk_sweep``, inside ``disk_write``), not page writes in place."""
    t = disk_timing(hw)
    rows = cold_rows * (1.0 - disk.cached_share)
    pages = rows * disk.pages_per_cold_row
    calls = pages * disk.calls_per_page

    def seconds(k: dict, share: float = 1.0, fixed: bool = True) -> float:
        if calls <= 0:
            return 0.0
        per = k["us_per_call"] * calls + k.get("us_per_page", 0.0) * pages
        return (fixed * k["fixed_us"] + share * per) * 1e-6

    out = {
        "disk_read": seconds(t["read"], 1.0 - disk.skipped_share),
        "disk_write": seconds(t["write"]),
        "disk_reread": seconds(t["read"], disk.reread_share, fixed=False),
        "disk_cpu": calls * (t["read"]["cpu_us_per_call"] + t["write"]["cpu_us_per_call"]) * 1e-6,
    }
    if disk.held_rows and rows <= disk.held_rows:  # more than the buffer holds: written in place
        put, sweep, cpu = held_write_s(hw, disk, rows, record)
        out.update(disk_write=put + sweep, disk_sweep=sweep,
                   disk_cpu=calls * t["read"]["cpu_us_per_call"] * 1e-6 + cpu)  # fmt: skip
    return out


def overlapped(a: float, b: float, penalty: float) -> float:
    """Seconds of two lanes run together: the longer plus ``penalty`` of the shorter (0 free, 1 serial)."""
    return max(a, b) + penalty * min(a, b)


def overlapped_at(a: float, b: float, penalty: float | list) -> float:
    """Seconds of two lanes run together: the longer plus, of the shorter, ``penalty`` at their ratio
    (:func:`penalty_at`: one figure, or points by the ratio)."""
    longer, shorter = max(a, b), min(a, b)
    return longer + penalty_at(penalty, shorter / longer if longer > 0 else 1.0) * shorter


def penalty_at(penalty: float | list, ratio: float) -> float:
    """The overlap penalty of two lanes whose shorter is ``ratio`` of the longer: ``penalty`` itself where it is
    one figure, or, where it is points ``[[ratio, penalty], ...]`` (``compute_penalties``, timed at
    :data:`~hotline.costmodel.disk_overlap.BESIDE_SHARES`), linear between them and the nearest one's beyond
    them. Between two points the penalty rises with the ratio by at most the ratio's own rise (a point above that, or below the one before
    it, is taken at that bound): the step, the longer lane plus the penalty of the shorter, then never shrinks
    as either lane grows (its slope in the longer lane is 1 - slope * ratio^2), which the fit of reads beside
    write-backs relies on, and a noisy point cannot price the shorter compute dearer than the longer."""
    if not isinstance(penalty, list):
        return float(penalty)
    points = sorted(penalty)
    ratios, penalties = [float(points[0][0])], [float(points[0][1])]
    for r, p in points[1:]:
        ratios.append(float(r))
        penalties.append(min(max(float(p), penalties[-1]), penalties[-1] + ratios[-1] - ratios[-2]))
    return float(np.interp(ratio, ratios, penalties))


def beside(io: float, compute: float, timing: dict) -> float:
    """Seconds of the disk lane beside the compute lane: :func:`overlapped` at the calibrated penalty of the I/O
    beside compute, at the two lanes' ratio where it was timed at several (``compute_penalties``)."""
    return overlapped_at(io, compute, timing.get("compute_penalties", timing["compute_penalty"]))


def compute_terms(w: Workload, samples: float) -> tuple[float, float, float]:
    """(GEMM FLOPs, interaction FLOPs, bytes) of one forward + backward pass over ``samples`` samples, x3 for
    the forward and the two backward products: the dense GEMMs (:meth:`Workload.mlp_layers`: the MLPs and, for
    dcn, the cross layers' low-rank products) at the dense rate; the dot interaction's batched small products
    (dot only: cat and dcn concatenate) at their own rate; and the rows, activations and gradients it reads
    and writes (with the cross layers' elementwise work, :meth:`Workload.elementwise_floats`)."""
    T, L, D = w.num_tables, w.pooling_factor, w.embedding_dim
    layers = w.mlp_layers()
    mlp = 6.0 * samples * sum(i * o for i, o in layers)
    inter = 6.0 * samples * (T + 1) * (T + 1) * D if w.interaction == "dot" else 0.0
    act = sum(o for _, o in layers)
    floats = 4 * T * L * D + 2 * (T + 1) * D + 6 * act + w.elementwise_floats()
    return mlp, inter, 4.0 * samples * floats


def compute_features(w: Workload, samples: float) -> tuple[float, float]:
    """(FLOPs, bytes) of one forward + backward pass over ``samples`` samples (:func:`compute_terms`, the two
    kinds of FLOPs added)."""
    mlp, inter, bytes_ = compute_terms(w, samples)
    return mlp + inter, bytes_


def pass_key(w: Workload) -> str:
    """The dense pass's shape, without its batch size: how a timed pass of the model (``device.passes`` of a
    hardware description, :func:`hotline.costmodel.dense_timing.time_pass`) is found again."""
    arch = w.interaction + (f" {w.dcn_num_layers}x{w.dcn_low_rank_dim}" if w.interaction == "dcn" else "")
    return (f"T{w.num_tables} L{max(1, round(w.pooling_factor))} D{w.embedding_dim} "
            f"bottom {'-'.join(map(str, w.bottom_mlp))} top {'-'.join(map(str, w.top_mlp))} {arch}")  # fmt: skip


def timed_pass(w: Workload, dev: dict) -> dict | None:
    """The description's timing of this model's dense pass (``device.passes``), or None."""
    return (dev.get("passes") or {}).get(pass_key(w))


def _fitted_compute_s(w: Workload, dev: dict, samples: float, passes: float) -> float:
    mlp, inter, bytes_ = compute_terms(w, samples)
    return (
        mlp / (dev["dense_gflops"] * 1e9)
        + inter / (dev.get("interaction_gflops", dev["dense_gflops"]) * 1e9)
        + bytes_ / (dev["mem_gbps"] * 1e9)
        + passes * dev["pass_overhead_us"] * 1e-6
    )


def _compute_s(w: Workload, dev: dict, samples: float, passes: float = 1.0) -> float:
    """Forward + backward over ``samples`` samples in ``passes`` passes (0 samples: no pass): the fitted
    formula (FLOPs at the dense and the interaction's rate, the latter the dense rate where the description has
    none of its own, e.g. the GPU table; bytes; a cost per pass), scaled, where the description timed this
    model's pass (:func:`pass_key`), so that it gives that timing at the timed batch size."""
    if samples <= 0:
        return 0.0
    t = _fitted_compute_s(w, dev, samples, passes)
    timed = timed_pass(w, dev)
    if timed is not None:
        at = replace(w, batch_size=int(timed["batch"]), pooling_factor=timed["pooling_factor"])
        t *= timed["pass_us"] * 1e-6 / _fitted_compute_s(at, dev, timed["batch"], 1.0)
    return t


def _assemble_s(w: Workload, dev: dict) -> float:
    """The looked-up rows put together from the hot table and the working buffer: at the description's
    assembly rate, or in proportion to the lookups of this model's timed pass (:func:`pass_key`)."""
    N = w.lookups
    timed = timed_pass(w, dev)
    if timed is not None:
        return timed["assemble_us"] * 1e-6 * N / (timed["batch"] * w.num_tables * timed["pooling_factor"])
    rate = dev.get("assemble_gbps", dev.get("gather_gbps", dev["mem_gbps"]))
    return N * 4.0 * w.embedding_dim / (rate * 1e9)


def _update_s(w: Workload, dev: dict, lookups: float, rows: float) -> float:
    """One sparse update: per lookup gradient (coalesced) and per updated row."""
    if lookups <= 0:
        return 0.0
    return (
        lookups * dev.get("update_ns_per_lookup", 0.0) * 1e-9
        + lookups * w.embedding_dim * dev["update_ns_per_lookup_float"] * 1e-9
        + rows * w.embedding_dim * dev["update_ns_per_row_float"] * 1e-9
        + dev.get("update_overhead_us", 0.0) * 1e-6
    )


def _dense_update_s(w: Workload, dev: dict) -> float:
    """The dense optimizer's step: its parameters, gradients and state streamed, plus a cost per parameter
    tensor (:meth:`Workload.param_tensors`: weight and bias of each MLP layer; W, V and bias of each cross
    layer)."""
    tensors = len(w.param_tensors())
    return (
        12.0 * w.dense_params() / (dev["mem_gbps"] * 1e9)
        + dev.get("dense_update_overhead_us", 0.0) * 1e-6
        + tensors * dev.get("dense_update_us_per_tensor", 0.0) * 1e-6
    )


def _link_s(hw: dict, nbytes: float, direction: str) -> float:
    link = hw["link"]
    if link.get("shared_memory"):  # the device is this CPU: tensors are shared, nothing is copied
        return 0.0
    copies = link.get("copies_per_step", 1) if direction == "h2d" else 1
    return nbytes / (link[f"{direction}_gbps"] * 1e9) + copies * link.get("latency_us", 0.0) * 1e-6


def _host(hw: dict, key: str, threads: int | None, default: float | None = None) -> float:
    """A host rate at ``threads`` (None: the calibration's thread count), e.g. ``dispatch_ns_per_lookup``
    (``default`` where the description has no such figure)."""
    if default is not None and key not in hw["host"]:
        return default
    v = hw["host"][key]
    if isinstance(v, dict):  # {"1": value with one thread, "n": value with all calibrated threads}
        return v["1"] if threads == 1 else v["n"]
    return v


def phases(mode: str, w: Workload, s: Stats, hw: dict, disk: DiskTier | None = None) -> dict[str, float]:
    """Seconds per step of each phase of ``mode`` (one of :data:`PRICED_MODES`); ``disk``: the cold rows live in the
    disk store (reads, page writes or held writes and the CPU issuing them: ``disk_read``, ``disk_write``,
    ``disk_cpu``; ``disk_sweep``: held writes' share of a sweep, inside ``disk_write``)."""
    dev = hw["device"]
    B, N, R = w.batch_size, w.lookups, w.row_bytes
    index_bytes = 8.0 * N * 2 + 4.0 * B * 14  # lookup positions and slots; dense features and labels
    threads = w.worker_threads if mode == "hotline_k1" else None
    out: dict[str, float] = {}
    if mode == "device":
        # every looked-up row read out of the whole table (the other modes read hot rows and the working set)
        out["lookup"] = N * 4.0 * w.embedding_dim / (dev.get("gather_gbps", dev["mem_gbps"]) * 1e9)
        out["compute"] = _compute_s(w, dev, B)
        out["sparse_update"] = _update_s(w, dev, N, s.unique_rows_per_batch)
    else:
        cold = s.unique_rows_per_batch if mode == "hybrid" else s.cold_rows_per_batch
        # per lookup (classify it) and per cold lookup (give it a working-buffer slot)
        cold_lookups = N * (1.0 if mode == "hybrid" else 1.0 - min(max(s.hot_lookup_share, 0.0), 1.0))
        out["dispatch"] = (
            N * _host(hw, "dispatch_ns_per_lookup", threads)
            + cold_lookups * _host(hw, "dispatch_ns_per_cold_lookup", threads, 0.0)
        ) * 1e-9
        # under look-ahead the producer skips the stale rows; the main thread reads them on one thread before
        # the step computes (hotline.pipeline.threads.BETWEEN_STEPS_THREADS), on the step's critical path
        stale = min(max(s.stale_rows_per_batch, 0.0), cold) if mode == "hotline_k1" else 0.0
        out["gather"] = (cold - stale) * R / (_host(hw, "gather_gbps", threads) * 1e9)
        if mode == "hotline_k1":
            if hw["link"].get("shared_memory"):  # this CPU: one thread copies them into the working buffer
                out["refresh"] = stale * R / (_host(hw, "gather_gbps", 1) * 1e9)
            else:  # a GPU: over the link (an upper bound: the rows forwarded from a live step stay on the device)
                out["refresh"] = stale * R / (hw["link"]["h2d_gbps"] * 1e9)
        out["h2d"] = _link_s(hw, cold * R + index_bytes, "h2d")
        # the looked-up rows put together from the hot table and the working buffer (device mode's "lookup")
        out["assemble"] = _assemble_s(w, dev)
        if mode in ("hybrid", "hotline_k1"):  # one pass (look-ahead fuses the micro-batches: rows are ready)
            out["compute"] = _compute_s(w, dev, B)
        else:  # K=0: the popular micro-batch, then the non-popular one (each pass only when it has samples)
            p = min(max(s.popular_sample_share, 0.0), 1.0)
            out["compute"] = _compute_s(w, dev, B, passes=(1.0 - (1.0 - p) ** B) + (1.0 - p**B))
        out["sparse_update"] = _update_s(w, dev, N, s.unique_rows_per_batch)
        out["d2h"] = _link_s(hw, cold * R, "d2h")
        out["write_back"] = cold * R / (_host(hw, "scatter_gbps", None) * 1e9)
        if disk is not None:  # a sequential step has no stale rows: its fetch reads every page
            out.update(
                _disk_phases(hw, disk if mode == "hotline_k1" else replace(disk, skipped_share=0.0), cold, R)
            )
    out["dense_update"] = _dense_update_s(w, dev)
    return out
