"""Cost model: samples/s of device, hybrid, hotline K=0 and K>=1 from a profile's held-out figures, the model,
the batch and a hardware description; and which phase bounds each.

A step is a set of phases, each priced from the hardware description (JSON; see :func:`load_hardware`):

- host work: ``dispatch`` (split the batch: per lookup, and per cold lookup, which also gets a working-buffer
  slot), ``gather`` (cold rows out of host memory: bytes at the host's gather bandwidth) and ``write_back``
  (bytes at its scatter bandwidth);
- link: ``h2d`` / ``d2h`` of the working rows and the index arrays (none when the device is this CPU: the
  tensors are shared, not copied);
- device work: ``lookup`` (device mode: every looked-up row read out of the whole table) or ``assemble`` (the
  other modes: the looked-up rows put together from the hot table and the working buffer), ``compute``
  (forward and backward of each micro-batch of the model the run trains, :class:`Workload`: the dense GEMMs'
  FLOPs at the dense rate (the MLPs and, for DCN-v2, the cross layers' low-rank products), the dot
  interaction's FLOPs at its own rate (batched small products run far below the GEMM rate; cat and dcn have
  none), bytes at the memory bandwidth, plus a fixed cost per pass), ``sparse_update`` (per lookup gradient
  and per updated row) and ``dense_update`` (the dense parameters, plus a cost per parameter tensor); under
  look-ahead also ``refresh`` (the stale rows, which an earlier step in flight may still update: the producer
  skips them and the main thread reads them before the step computes, at the host's one-thread gather
  bandwidth where the device is this CPU, over the link on a GPU).

Sequential modes (device, hybrid, hotline K=0) add their phases. Hotline with look-ahead K >= 1 runs host work
on a producer thread, the write-back on a writer thread and compute on the main thread: a step takes the
largest of host work, link and device work, plus what cannot overlap (the hand-over between threads); where the
device is this CPU, all of them share its cores by the executor's rule (torch keeps the cores the producer was
not measured to keep busy: :func:`hotline.pipeline.threads.compute_threads`; every producer kernel releases
the GIL), so host work and compute overlap only partly: a step takes the longer of the two plus the
calibrated share (``overlap_penalty``, measured with the rule on) of the shorter (see
:func:`shared_cores_lane`).

What a step moves comes from held-out figures (never the in-sample ones): lookups that hit hot rows, the
popular-sample share, unique cold rows per mini-batch, and unique rows per mini-batch (hybrid's working set).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np

from hotline.table_layout import bytes_per_row

MODES = ("device", "hybrid", "hotline_k0", "hotline_k1")
"""The modes predicted: ``hotline_k1`` stands for any look-ahead K >= 1 (the pipelined step)."""

INTERACTIONS = ("dot", "cat", "dcn")
"""The interactions priced (``hotline.models.dlrm.INTERACTIONS``, kept here so pricing needs no torch)."""

ARCH_FIELDS = ("bottom_mlp", "top_mlp", "interaction", "dcn_num_layers", "dcn_low_rank_dim")
"""The model fields a :class:`Workload` takes from a training config (:func:`arch_of`)."""


@dataclass
class Workload:
    """What one training step computes and moves (besides the held-out figures)."""

    batch_size: int
    """Mini-batch size B."""
    num_tables: int
    """Embedding tables T."""
    pooling_factor: float = 1
    """Lookups per table per sample L (multi-hot bags of per-table sizes: the measured mean, padding not counted)."""
    embedding_dim: int = 16
    """Embedding dimension D."""
    bottom_mlp: tuple[int, ...] = (13, 512, 256, 64, 16)
    """Bottom MLP layer widths (DLRM's --arch-mlp-bot; the last is the embedding dim)."""
    top_mlp: tuple[int, ...] = (512, 256, 1)
    """Top MLP widths after the interaction (DLRM's --arch-mlp-top; its input is the interaction's output)."""
    optimizer: str = "sgd"
    """Sparse optimizer (``hotline.table_layout.OPTIMIZERS``), which sets the state bytes a row carries."""
    worker_threads: int = 1
    """Numba threads of the look-ahead producer (host work of K >= 1 runs on them)."""
    interaction: str = "dot"
    """The model's feature interaction (``--arch-interaction-op``): ``dot``, ``cat`` or ``dcn`` (DCN-v2)."""
    dcn_num_layers: int = 3
    """Cross layers of the ``dcn`` interaction (``--dcn-num-layers``)."""
    dcn_low_rank_dim: int = 512
    """Rank r of each cross layer of the ``dcn`` interaction (``--dcn-low-rank-dim``)."""

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.num_tables <= 0 or self.embedding_dim <= 0:
            raise ValueError("batch_size, num_tables and embedding_dim must be positive")
        bytes_per_row(self.embedding_dim, self.optimizer)  # a known optimizer
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"the interaction must be one of {INTERACTIONS}, got {self.interaction!r}")
        if self.dcn_num_layers < 1 or self.dcn_low_rank_dim < 1:
            raise ValueError(f"dcn_num_layers and dcn_low_rank_dim must be >= 1, got {self.dcn_num_layers} and "
                             f"{self.dcn_low_rank_dim}")  # fmt: skip
        if len(self.bottom_mlp) < 2 or len(self.top_mlp) < 1 or min(*self.bottom_mlp, *self.top_mlp) < 1:
            raise ValueError(f"MLP widths must be positive, bottom at least two: got bottom {self.bottom_mlp}, "
                             f"top {self.top_mlp}")  # fmt: skip
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(f"the bottom MLP {'-'.join(map(str, self.bottom_mlp))} must end with the embedding "
                             f"dim {self.embedding_dim}")  # fmt: skip

    @property
    def lookups(self) -> int:
        return self.batch_size * self.num_tables * self.pooling_factor

    @property
    def row_bytes(self) -> int:
        return bytes_per_row(self.embedding_dim, self.optimizer)

    @property
    def interaction_width(self) -> int:
        """Width of the interaction's output, the top MLP's input: dot, the dense features beside the F(F-1)/2
        pairwise products of the F = T + 1 features; cat and dcn, the F * D features concatenated."""
        F, D = self.num_tables + 1, self.embedding_dim
        return F * (F - 1) // 2 + D if self.interaction == "dot" else F * D

    def _mlps(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(in, out) of the bottom MLP's layers and of the top MLP's (from the interaction's output)."""
        bot, top = list(self.bottom_mlp), [self.interaction_width, *self.top_mlp]
        return list(zip(bot[:-1], bot[1:])), list(zip(top[:-1], top[1:]))

    def cross_layers(self) -> list[tuple[int, int]]:
        """(in, out) of the GEMMs of the dcn cross network (none for dot and cat): per layer ``V_l x_l``
        (F*D -> r), then ``W_l`` of that (r -> F*D), neither with a bias of its own."""
        if self.interaction != "dcn":
            return []
        n, r = (self.num_tables + 1) * self.embedding_dim, self.dcn_low_rank_dim
        return [(n, r), (r, n)] * self.dcn_num_layers

    def mlp_layers(self) -> list[tuple[int, int]]:
        """(in, out) of every dense GEMM the model runs, in order: the bottom MLP, the cross network's low-rank
        products (dcn), the top MLP from the interaction's output (:attr:`interaction_width`)."""
        bottom, top = self._mlps()
        return bottom + self.cross_layers() + top

    def param_tensors(self) -> list[int]:
        """Elements of every dense parameter tensor, as hotline.models builds them: each MLP layer's weight and
        bias; each cross layer's ``W`` [F*D, r], ``V`` [r, F*D] and bias [F*D]."""
        bottom, top = self._mlps()
        cross = self.cross_layers()
        biases = [cross[0][0]] * self.dcn_num_layers if cross else []
        return [x for i, o in bottom + top for x in (i * o, o)] + [i * o for i, o in cross] + biases

    def dense_params(self) -> int:
        return sum(self.param_tensors())

    def elementwise_floats(self) -> int:
        """Floats read and written per sample by the cross layers' elementwise ``x_0 * (y + b) + x_l`` (dcn;
        0 otherwise): three ops over F*D floats, each reading two and writing one (9 F*D) forward, and twice
        that backward."""
        if self.interaction != "dcn":
            return 0
        return 27 * (self.num_tables + 1) * self.embedding_dim * self.dcn_num_layers


@dataclass
class Stats:
    """Held-out figures of a placement (what a step moves)."""

    hot_lookup_share: float
    """Share of lookups that hit hot rows (held-out access coverage)."""
    popular_sample_share: float
    """Share of samples whose every lookup is hot."""
    cold_rows_per_batch: float
    """Unique cold rows per mini-batch (the working set)."""
    unique_rows_per_batch: float
    """Unique rows per mini-batch with nothing hot (hybrid's working set)."""
    stale_rows_per_batch: float = 0.0
    """Of the cold rows, those a look-ahead step finds held by an earlier step still in flight (held-out,
    :data:`hotline.profiling.heldout.STALE_WINDOW`; 0 where not measured): the producer skips them and the main
    thread reads them again before the step computes."""

    @classmethod
    def from_profile(cls, prof, budget, batch_size: int | None = None) -> Stats:
        """The held-out figures of ``prof`` at ``budget`` (in-sample ones only when it has no held-out samples)."""
        k = prof.hot_rows_for(budget)
        if prof.heldout is not None and (batch_size is None or batch_size == prof.heldout.batch_size):
            h = prof.heldout.figures(k)
            return cls(
                float(h["access_coverage"]),
                float(h["popular_sample_share"]),
                float(h["unique_cold_rows_per_batch"]),
                float(prof.heldout.figures(0)["unique_cold_rows_per_batch"]),
                prof.heldout.stale_rows_per_batch(k),
            )
        c = prof.curve([k * prof.bytes_per_row], batch_size=batch_size).iloc[0]
        return cls(
            float(c.access_coverage),
            float(c.popular_sample_share),
            float(c.expected_cold_rows_per_batch),
            float(c.expected_unique_rows_per_batch),
        )


@dataclass
class DiskTier:
    """The disk cold store of a run (``--cold-store disk``): how a step's cold rows meet the disk. Its rates
    come from the hardware description's ``disk`` section (``hotline calibrate --disk DIR``)."""

    pages_per_cold_row: float = 1.0
    """4 KiB pages read per cold row not in the DRAM tier (1: each row its own page; the popularity order
    lets rows of a step share pages, below 1)."""
    cached_share: float = 0.0
    """Share of the cold rows served by the DRAM tier (``--cold-cache``)."""
    reread_share: float = 0.0
    """Pages read beyond the fetch's, per page of the step's cold rows, under look-ahead: the refresh reads the
    pages of stale rows again before their step, and a write-back reads the pages it has not read and those
    another step wrote since (read-modify-write) (0 before a run measured it; sequential steps read none
    again)."""
    skipped_share: float = 0.0
    """Share of the step's pages the fetch does not read, under look-ahead: pages that only stale rows need
    (the refresh or the write-back reads them; 0 before a run measured it)."""
    calls_per_page: float = 1.0
    """I/O requests (system calls) per page: the store reads a run of neighbouring pages with one request, and a
    request costs about the same for one page or a few (1: no two pages of a step neighbours, what the
    calibration's uniform draws make; a run measures it: its reads over its pages)."""

    def __post_init__(self) -> None:
        if not self.pages_per_cold_row >= 0 or not 0 <= self.cached_share <= 1 or not self.reread_share >= 0:
            raise ValueError("pages_per_cold_row and reread_share must be >= 0 and cached_share in [0, 1]")
        if not 0 <= self.skipped_share <= 1:
            raise ValueError(f"skipped_share must be in [0, 1], got {self.skipped_share}")
        if not 0 <= self.calls_per_page <= 1:
            raise ValueError(f"calls_per_page must be in [0, 1] (one request reads one page or more), "
                             f"got {self.calls_per_page}")  # fmt: skip

    @classmethod
    def of_records(cls, embedding_dim: int, optimizer: str, cached_share: float = 0.0) -> DiskTier:
        """The tier before any run measured it: each cold row reads the pages its record spans in the file (a
        record is the row and its optimizer's whole state, ``bytes_per_row(embedding_dim, optimizer)`` bytes;
        Adam's at dim 128, 1540 bytes, spans 1.375 pages on average), none shared with another row of the step (the
        popularity order only lowers it)."""
        from hotline.tiers.disk_file import pages_per_record

        return cls(pages_per_record(bytes_per_row(embedding_dim, optimizer)), cached_share)


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


def _disk_phases(hw: dict, disk: DiskTier, cold_rows: float) -> dict[str, float]:
    """Seconds per step of the disk store, as the calibration timed a step's I/O through the store's code
    (``fixed + per request + per page`` for the fetch's reads and for the write-back, each at the store's I/O
    depth, their CPU inside; a step's requests are its pages times ``calls_per_page``, the write-back's the
    fetch's, one per run of pages; the fetch reads all but the ``skipped_share`` of them; ``disk_reread``: the
    pages read again under look-ahead, at the reads' rates per request and per page), and
    the CPU seconds the I/O threads spend in them (``disk_cpu``, for the record)."""
    t = disk_timing(hw)
    pages = cold_rows * (1.0 - disk.cached_share) * disk.pages_per_cold_row
    calls = pages * disk.calls_per_page

    def seconds(k: dict, share: float = 1.0, fixed: bool = True) -> float:
        if calls <= 0:
            return 0.0
        per = k["us_per_call"] * calls + k.get("us_per_page", 0.0) * pages
        return (fixed * k["fixed_us"] + share * per) * 1e-6

    return {
        "disk_read": seconds(t["read"], 1.0 - disk.skipped_share),
        "disk_write": seconds(t["write"]),
        "disk_reread": seconds(t["read"], disk.reread_share, fixed=False),
        "disk_cpu": calls * (t["read"]["cpu_us_per_call"] + t["write"]["cpu_us_per_call"]) * 1e-6,
    }


def _overlapped(a: float, b: float, penalty: float) -> float:
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
    :data:`BESIDE_SHARES`), linear between them and the nearest one's beyond them. Between two points the
    penalty rises with the ratio by at most the ratio's own rise (a point above that, or below the one before
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


def _beside(io: float, compute: float, timing: dict) -> float:
    """Seconds of the disk lane beside the compute lane: :func:`_overlapped` at the calibrated penalty of the I/O
    beside compute, at the two lanes' ratio where it was timed at several (``compute_penalties``)."""
    return overlapped_at(io, compute, timing.get("compute_penalties", timing["compute_penalty"]))


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


# ---------------------------------------------------------------------------------------------- hardware
def known_gpus() -> dict:
    """The shipped table of GPUs (``hotline/profiling/gpus.json``): device and link figures, with sources."""
    text = resources.files("hotline.profiling").joinpath("gpus.json").read_text()
    return json.loads(text)["gpus"]


def load_hardware(spec: str | os.PathLike | dict, host: str | os.PathLike | dict | None = None) -> dict:
    """A hardware description: a dict, a JSON file (from ``hotline calibrate``), or the name of a known GPU
    (``H100``, ``H200``, ...), whose host side comes from ``host`` (a calibration JSON; default: the typical
    host figures shipped with the GPU table)."""
    from hotline._paths import file_problem
    from hotline.profiling.hardware import check_hardware

    source = str(spec)
    if isinstance(spec, dict):
        hw, source = dict(spec), "(given as a dict)"
    elif Path(spec).exists() or Path(spec).is_symlink() or str(spec).endswith(".json"):
        problem = file_problem(spec)
        if problem is not None:
            raise ValueError(f"hardware file {spec} {problem}")
        try:
            hw = json.loads(Path(spec).read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"hardware file {spec} is not valid JSON: {e}") from None
    else:
        gpus = known_gpus()
        name = str(spec)
        match = next((k for k in gpus if k.lower() == name.lower()), None)
        if match is None:
            raise ValueError(f"hardware {name!r}: neither a JSON file nor a known GPU ({', '.join(gpus)})")
        gpu = gpus[match]
        base = (
            load_hardware(host)
            if host is not None
            else json.loads(resources.files("hotline.profiling").joinpath("gpus.json").read_text())[
                "typical_host"
            ]
        )
        hw = {**base, "name": f"{match} + {base.get('name', 'host')}", "device": gpu["device"],
              "link": gpu["link"], "sources": gpu.get("sources", [])}  # fmt: skip
    return check_hardware(hw, source)


# ---------------------------------------------------------------------------------------------- phases
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
    hardware description, :func:`hotline.profiling.calibrate.time_pass`) is found again."""
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
    """Seconds per step of each phase of ``mode`` (one of :data:`MODES`); ``disk``: the cold rows live in the
    disk store (reads, page writes and the CPU issuing them: ``disk_read``, ``disk_write``, ``disk_cpu``)."""
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
                _disk_phases(hw, disk if mode == "hotline_k1" else replace(disk, skipped_share=0.0), cold)
            )
    out["dense_update"] = _dense_update_s(w, dev)
    return out


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
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ph = phases(mode, w, s, hw, disk)
    if mode != "hotline_k1":
        # disk_cpu is inside the reads' and writes' wall time; a sequential step reads nothing again
        timed = {k: v for k, v in ph.items() if k not in ("disk_cpu", "disk_reread")}
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
        lanes["disk (reads beside writes)"] = _overlapped(
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
            lanes["disk beside compute"] = _beside(
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
    w: Workload, s: Stats, hw: dict, modes=MODES, disk: DiskTier | None = None
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


def arch_of(model) -> dict:
    """The :data:`ARCH_FIELDS` a model is built with, from a ``TrainConfig`` or ``DLRMConfig`` (attributes) or
    a dict of TrainConfig fields (the keys it has: a missing one takes TrainConfig's default, as a run would);
    lists become tuples. Splat it into :class:`Workload` or :func:`workload_for`."""
    get = model.get if isinstance(model, dict) else (lambda k: getattr(model, k, None))
    out = {}
    for k in ARCH_FIELDS:
        v = get(k)
        if v is not None:
            out[k] = tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else v
    return out


def workload_for(
    prof,
    bottom_mlp=None,
    top_mlp=(512, 256, 1),
    worker_threads: int = 1,
    interaction: str = "dot",
    dcn_num_layers: int = 3,
    dcn_low_rank_dim: int = 512,
) -> Workload:
    """The workload of training the model (its MLPs, interaction and cross layers: pass ``**arch_of(config)``)
    on ``prof``'s dataset with its mini-batch size, dim and optimizer (bottom MLP default: Kaggle DLRM's
    13-512-256-64, then the embedding dim if it differs)."""
    D = int(prof.profiler.embedding_dim)
    bottom = tuple(bottom_mlp) if bottom_mlp else ((13, 512, 256, 64) if D == 64 else (13, 512, 256, 64, D))
    return Workload(
        batch_size=prof.mini_batch_size,
        num_tables=prof.num_tables,
        pooling_factor=prof.total_lookups / max(1, prof.num_samples * prof.num_tables),
        embedding_dim=D,
        bottom_mlp=bottom,
        top_mlp=tuple(top_mlp),
        optimizer=prof.profiler.optimizer,
        worker_threads=worker_threads,
        interaction=interaction,
        dcn_num_layers=dcn_num_layers,
        dcn_low_rank_dim=dcn_low_rank_dim,
    )


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
