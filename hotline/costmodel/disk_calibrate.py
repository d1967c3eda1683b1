"""Calibration of the disk tier, timed through the disk store's own code (:class:`~hotline.tiers.disk_file.RowFile`:
O_DIRECT where the filesystem allows, coalescing, the I/O thread pool) on scratch files of its own that are
removed afterwards.

Two kinds of figures:

- the disk's headline rates (what ``hotline calibrate --disk`` prints): random 4 KiB reads per second at depth 1
  and at the store's I/O depth, random page writes per second at that depth, the sequential write rate, and the
  CPU each costs;
- ``step``, what the cost model prices a step's I/O with: step-shaped batches (the distinct rows of a step, as
  records of the run's size, read with :meth:`RowFile.read_rows` and written back over the pages that read
  fetched with :meth:`RowFile.write_rows`, as the store's fetch and write-back do) at several sizes, each
  timed right after a forward and backward pass as a sequential step issues it, each direction fitted as
  ``fixed + per request + per page`` (a request, one system call, reads a run of neighbouring pages; uniform
  draws over a large file make about one per page, so each size is also timed as pairs of rows in neighbouring
  pages, one request per two pages: a step of skewed ids reads runs of pages, and its cost moves with the
  pages more than with the requests); how the store's concurrent work overlaps
  (:mod:`~hotline.costmodel.disk_overlap`: the I/O beside the compute, reads beside write-backs); and a
  ``probe``, the median times of one of those batches (:data:`PROBE_ROWS`), which :class:`DiskProbe` times
  again at another moment so that :func:`at_probe` prices at the disk's speed then.

The I/O thread pool is started before any timing (its threads are made on first use).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from hotline.costmodel.dense_timing import overlapped_pass
from hotline.costmodel.disk_overlap import overlap_penalties, penalty_curve, read_compute_write
from hotline.costmodel.fitting import nnls
from hotline.costmodel.phases import STEP_FORMAT, SWEEP_CHUNK_BYTES
from hotline.tiers.disk_file import PAGE, RowFile, aligned_bytes, manifest_path, order_path

_SCRATCH = "hotline-disk-calibration.bin"
_STEP_SCRATCH = "hotline-disk-calibration-step.bin"
_HELD_SCRATCH = "hotline-disk-calibration-held.bin"
_SCRATCH_DIR = "hotline-disk-calibration"
"""The scratch files' folder in the directory timed (a fresh one per calibration, removed at its end; named
``.hotline-disk-calibration.hotline-tmp-PID-RANDOM``: a run killed before its end leaves one that the next
calibration in that directory removes, :func:`hotline._io.scratch_folder`)."""
STEP_ROWS = (256, 1024, 2048, 4096, 8192)
"""Distinct rows per timed step-shaped batch (each about one page: uniform over a file many times larger)."""
PROBE_ROWS = 2048
"""The step-shaped batch (one of :data:`STEP_ROWS`, each row alone in its page) whose read and write-back times
are kept as the calibration's ``probe``: :class:`DiskProbe` times it again at another moment and :func:`at_probe`
scales the step's fits by how it moved."""


def _rate(fn, n: int) -> tuple[float, float]:
    """(operations per second, CPU seconds per operation) of ``fn()`` doing ``n`` operations."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / max(wall, 1e-9), cpu / max(n, 1)


def _scratch_file(
    path: Path, rows: int, floats: int, depth: int, rng: np.random.Generator, held_bytes: int = 0
) -> tuple[RowFile, float]:
    """A RowFile of ``rows`` records of ``floats`` floats (its writes held in ``held_bytes``, 0: in place), every
    page written (an unwritten extent reads as zeros without touching the disk), and the sequential write rate
    in bytes per second."""
    f = RowFile(path, rows, floats, 0, io_depth=depth, held_bytes=held_bytes)
    chunk = aligned_bytes(1 << 20)
    chunk[:] = rng.integers(0, 255, chunk.shape[0], dtype=np.uint8)

    def sequential() -> None:
        for at in range(0, f.size, chunk.shape[0]):
            n = min(chunk.shape[0], f.size - at)
            if os.pwrite(f._fd, chunk[:n], at) != n:
                raise OSError(f"short write to {path}")
        os.fsync(f._fd)

    try:
        bps, _ = _rate(sequential, f.size)
        # The file was just written whole: the disk settled before anything is timed on it (on a virtual disk
        # the host may still be flushing what the guest's writes returned from, and a sync waits for that).
        os.sync()
        f.read_rows(rng.choice(rows, size=4 * depth, replace=False))  # starts the I/O threads
    except BaseException:
        f.close()  # an I/O error, a short write, an interrupt: the file's descriptors and threads closed
        raise
    return f, bps


def _remove(path: Path) -> None:
    for p in (path, manifest_path(path), order_path(path)):
        p.unlink(missing_ok=True)


def _fit(
    calls: list[float], seconds: list[float], sizes: list[int], pages: list[float] | None = None
) -> dict:
    """``seconds = fixed + per_call * calls`` by least squares over the median of each size's timings
    (``sizes[i]``: the batch size timing ``i`` belongs to; a neighbour's burst on a shared machine moves a
    median less); with ``pages`` (pages each timing read, some requests reading neighbouring pages together),
    ``fixed + per_call * calls + per_page * pages``, non-negative (``us_per_page`` 0 without)."""
    calls, seconds, sizes = (np.asarray(a, float) for a in (calls, seconds, sizes))
    groups = np.unique(sizes)
    x = np.array([np.median(calls[sizes == g]) for g in groups])
    y = np.array([np.median(seconds[sizes == g]) for g in groups])
    if pages is not None:
        pg = np.asarray(pages, float)
        z = np.array([np.median(pg[sizes == g]) for g in groups])
        per_call, per_page, fixed = nnls(np.stack([x, z, np.ones_like(x)], axis=1).tolist(), list(y))
        if per_call + per_page > 0:
            return {"fixed_us": 1e6 * float(fixed), "us_per_call": 1e6 * float(per_call),
                    "us_per_page": 1e6 * float(per_page)}  # fmt: skip
    per_call, fixed = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (float(y.mean() / max(x.mean(), 1)), 0.0)
    if per_call <= 0:  # a loaded machine can tilt the line: fall back to the mean rate
        per_call, fixed = float(y.sum() / x.sum()), 0.0
    return {
        "fixed_us": 1e6 * max(0.0, float(fixed)),
        "us_per_call": 1e6 * float(per_call),
        "us_per_page": 0.0,
    }


def _step_once(f: RowFile, rows: np.ndarray, compute) -> tuple[int, int, float, float, float, float]:
    """One step-shaped read of ``rows`` and its write-back, each right after ``compute()`` (a forward and
    backward pass), as a sequential step issues them: (requests, pages, read seconds, write seconds, read CPU
    seconds, write CPU seconds); the write-back makes the fetch's requests over the same pages."""
    compute()
    ps, (read, _, write), (cpu_read, cpu_write) = read_compute_write(f, rows, compute)
    return ps.reads, int(ps.pages.shape[0]), read, write, cpu_read, cpu_write


def _step_io(f: RowFile, rng: np.random.Generator, repeats: int, compute) -> dict:
    """The ``step`` section: step-shaped reads and write-backs at :data:`STEP_ROWS`, fitted per direction, and
    the overlap penalties (module docstring).

    Each timed read and write-back comes right after a forward and backward pass (``compute``), as a
    sequential step issues them: the fetch after the previous step's compute and this step's dispatch, the
    write-back after this step's compute. What a parallel region leaves behind on this process's cores (an
    OpenMP team spin-waiting for its next region, caches filled with the model's tensors) then costs the I/O
    here what it costs it in training. A round of every size runs untimed first (the I/O threads, the
    buffers, the file's extent map), then ``repeats`` rounds with the sizes in a new random order each round:
    a neighbour's burst on a shared machine lands on one timing of some sizes, which each size's median
    drops, instead of on every timing of one size, which tilts the line."""

    page_starts = np.arange(0, f.num_pages - 1, 3)  # pairs of neighbouring pages, a page apart from the next

    def draw(n: int, pair: bool) -> np.ndarray:
        """``n`` rows at random, each alone in its page (``pair``: half as many pairs of rows in neighbouring
        pages, which one request reads together, as a step's popular-but-not-hot rows sharing a run of pages)."""
        if not pair:
            return rng.choice(f.num_rows, size=n, replace=False)
        first = rng.choice(page_starts, size=min(n // 2, page_starts.shape[0]), replace=False)
        rows = np.concatenate([-(-first * PAGE // f.record), -(-(first + 1) * PAGE // f.record)])
        return np.unique(rows[rows < f.num_rows])

    def one(n: int, pair: bool) -> tuple[int, int, float, float, float, float]:
        return _step_once(f, draw(n, pair), compute)

    shapes = [(n, pair) for n in STEP_ROWS for pair in (False, True)]
    for n, pair in shapes:
        one(n, pair)
    sizes, calls, pages, t_read, t_write, cpu_read, cpu_write = [], [], [], [], [], [], []
    for _ in range(repeats):
        for i in rng.permutation(len(shapes)).tolist():
            n, pair = shapes[i]
            got = (2 * n + pair, *one(n, pair))
            for out, v in zip((sizes, calls, pages, t_read, t_write, cpu_read, cpu_write), got, strict=True):
                out.append(v)
    total = float(sum(calls))
    penalties = overlap_penalties(f, rng, repeats, compute, STEP_ROWS[-1])
    curve = penalty_curve(penalties)
    probe = np.asarray(sizes) == 2 * PROBE_ROWS  # the probe's shape: PROBE_ROWS rows, each alone in its page
    return {
        "version": STEP_FORMAT,
        "record_bytes": f.record,
        "rows": list(STEP_ROWS),
        "repeats": repeats,
        "probe": {
            "rows": PROBE_ROWS,
            "read_us": 1e6 * float(np.median(np.asarray(t_read)[probe])),
            "write_us": 1e6 * float(np.median(np.asarray(t_write)[probe])),
        },
        "read": {**_fit(calls, t_read, sizes, pages), "cpu_us_per_call": 1e6 * sum(cpu_read) / total},
        "write": {**_fit(calls, t_write, sizes, pages), "cpu_us_per_call": 1e6 * sum(cpu_write) / total},
        "read_write_penalty": penalties["read_write"]["penalty"],
        "compute_penalty": penalties["compute"]["penalty"],
        "compute_penalties": curve,
        "penalties_measured": penalties,
    }


def _held_io(path: Path, rows: int, record: int, depth: int, rng: np.random.Generator, repeats: int,
             compute) -> dict:  # fmt: skip
    """The ``step.held`` section (:func:`hotline.costmodel.phases.held_timing`), timed on a scratch file at
    ``path`` whose writes are held (:mod:`hotline.tiers.held_rows`, a buffer that holds every row written here):
    the put, step-shaped write-backs of :data:`STEP_ROWS` rows each right after a forward and backward pass,
    fitted as ``fixed + per row`` (wall and CPU); and two sweeps, of those rows (close together: nearly all of
    the file) and of one row a sweep's span apart (``repeats`` times), from which the cost per span and the
    bytes covered per second (each read and written) are solved."""
    from hotline.kernels.held_rows import EMPTY, sized

    total = min(rows, (1 + repeats) * sum(STEP_ROWS))
    budget = 1 << 20
    while sized(budget, record)[1] < total:
        budget *= 2
    f, _ = _scratch_file(path, rows, record // 4, depth, rng, held_bytes=budget)
    try:
        sizes, t_put, cpu_put = [], [], []
        for r in range(1 + repeats):  # a round untimed first: the table's and records' pages touched
            for n in rng.permutation(np.asarray(STEP_ROWS)).tolist():
                batch = rng.choice(rows, size=min(n, rows), replace=False)
                recs, ps = f.read_rows(batch)
                compute()
                c0, t0 = time.process_time(), time.perf_counter()
                f.write_rows(batch, recs, ps)
                if r:
                    t_put.append(time.perf_counter() - t0)
                    cpu_put.append(time.process_time() - c0)
                    sizes.append(batch.shape[0])
        held = f.held
        capacity = int(held.capacity)
        put = _fit(sizes, t_put, sizes)
        timed = [[*swept_spans(np.sort(held.keys[held.keys != EMPTY]), record), _timed_sweep(f)]]
        apart = np.arange(0, rows, max(1, SWEEP_CHUNK_BYTES // record) + 1)
        for _ in range(repeats):
            f.write_rows(apart, f.read_rows(apart)[0])
            timed.append([*swept_spans(apart, record), _timed_sweep(f)])
    finally:
        f.close()
        _remove(path)
    per_span, per_record = nnls([[a, b] for a, b, _ in timed], [t for *_, t in timed])
    if per_record <= 0:  # the sweeps cannot tell the two apart: every second priced by the bytes
        per_span, per_record = 0.0, sum(t for *_, t in timed) / sum(b for _, b, _ in timed)
    return {
        "put": {
            "fixed_us": put["fixed_us"],
            "us_per_row": put["us_per_call"],
            "cpu_us_per_row": 1e6 * sum(cpu_put) / sum(sizes),
        },
        "sweep": {
            "us_per_span": 1e6 * float(per_span),
            "mbps": record / float(per_record) / 1e6,
            "timed": [[float(x) for x in t] for t in timed],
        },
        "buffer_rows": capacity,
    }


def swept_spans(positions: np.ndarray, record: int) -> tuple[int, int]:
    """(spans, records) a sweep of the held records at the sorted file ``positions`` reads and writes: a span
    from one to the last within :data:`~hotline.costmodel.phases.SWEEP_CHUNK_BYTES` of it
    (:meth:`hotline.tiers.held_rows.HeldRows.sweep`)."""
    chunk = max(1, SWEEP_CHUNK_BYTES // record)
    spans = covered = i = 0
    while i < positions.shape[0]:
        lo = int(positions[i])
        j = int(np.searchsorted(positions, lo + chunk))
        spans, covered, i = spans + 1, covered + int(positions[j - 1]) + 1 - lo, j
    return spans, covered


def _timed_sweep(f: RowFile) -> float:
    t0 = time.perf_counter()
    f.held.sweep(f)
    return time.perf_counter() - t0


def _scratch_dir(directory: Path) -> Path:
    """A fresh folder for scratch files in ``directory``, removed with everything in it afterwards (a SIGTERM
    unwinds to that too; after a ``kill -9`` the next calibration there removes it): a file of the user's
    there, whatever its name, is never opened, refused or removed."""
    from hotline._io import scratch_folder

    try:
        return scratch_folder(directory, _SCRATCH_DIR)
    except OSError as e:
        raise OSError(e.errno, f"cannot make a scratch folder in {directory} ({e.strerror or e})") from None


def calibrate_disk(directory: str | os.PathLike, depth: int = 32, file_bytes: int = 512 << 20,
                   reads: int = 4000, seed: int = 0, record_bytes: int = 256, repeats: int = 5) -> dict:  # fmt: skip
    """The disk section of a hardware description, measured in ``directory`` (scratch files of ``file_bytes``
    each, in a fresh folder of their own there, removed with it afterwards); ``record_bytes``: the run's record
    (a row and its optimizer state, ``bytes_per_row``). Bad arguments raise ValueError and a directory that
    cannot take the scratch folder OSError, in words that name no command-line flag (its callers add theirs)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory (the disk is timed in one)")
    if record_bytes < 4 or record_bytes % 4:
        raise ValueError(f"the record size must be a positive multiple of 4 bytes, got {record_bytes}")
    if depth < 1:
        raise ValueError(f"the I/O depth must be >= 1, got {depth}")
    rng = np.random.default_rng(seed)
    rows = max(1024, file_bytes // PAGE)
    scratch = _scratch_dir(directory)
    try:
        return _calibrate_in(scratch, directory, depth, file_bytes, reads, record_bytes, repeats, rows, rng)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _calibrate_in(scratch: Path, directory: Path, depth: int, file_bytes: int, reads: int, record_bytes: int,
                  repeats: int, rows: int, rng: np.random.Generator) -> dict:  # fmt: skip
    """:func:`calibrate_disk`'s timings, its scratch files in ``scratch``."""
    # What was written before (a training run's write-backs, hundreds of MB) flushed first: a calibration right
    # after bench_disk_tier's runs, unflushed, read far slower than the one before them and the runs did.
    os.sync()
    path = scratch / _SCRATCH
    try:
        f, seq_bps = _scratch_file(path, rows, PAGE // 4, depth, rng)  # one 4 KiB record per page
        try:

            def random_reads(k: int, d: int):
                picked = [rng.choice(rows, size=k, replace=False) for _ in range(4)]
                f.io_depth = d

                def run() -> None:
                    for p in picked:
                        f.read_rows(p)

                return _rate(run, 4 * k)

            iops_1, _ = random_reads(max(64, reads // 8) // 4, 1)
            iops_d, cpu_read = random_reads(reads // 4, depth)
            picked = rng.choice(rows, size=reads // 4, replace=False)
            recs, pages = f.read_rows(picked)
            write_iops, cpu_write = _rate(lambda: f.write_rows(picked, recs, pages), picked.shape[0])
            mode = f.mode
        finally:
            f.close()
    finally:
        _remove(path)
    step_path = scratch / _STEP_SCRATCH
    step_rows = max(1024, file_bytes // record_bytes)
    compute = overlapped_pass(np.random.default_rng(0))
    try:
        g, _ = _scratch_file(step_path, step_rows, record_bytes // 4, depth, rng)
        try:
            step = _step_io(g, rng, repeats, compute)
        finally:
            g.close()
    finally:
        _remove(step_path)
    step["held"] = _held_io(scratch / _HELD_SCRATCH, step_rows, record_bytes, depth, rng, repeats, compute)
    return {
        "path": str(directory),
        "io_mode": mode,
        "depth": int(depth),
        "read_iops": {"1": iops_1, "depth": iops_d},
        "write_iops": write_iops,
        "seq_write_mbps": seq_bps / 1e6,
        "cpu_us_per_read": 1e6 * cpu_read,
        "cpu_us_per_write": 1e6 * cpu_write,
        "page_bytes": PAGE,
        "step": step,
    }


class DiskProbe:
    """The calibration's probe timed again, at any moment: :data:`PROBE_ROWS` rows read and written back, each
    right after a forward and backward pass, as the calibration times its step-shaped batches, on a scratch file
    like the calibration's (``file_bytes`` of ``record_bytes`` records, every page written, O_DIRECT where the
    filesystem allows) in a fresh folder in ``directory``, removed by :meth:`close`. Calling it returns the
    medians of ``repeats`` timings, in the calibration's ``probe`` fields; :func:`at_probe` prices with them.

    On a virtual disk the speed moves within minutes (``bench_disk_tier`` times a probe beside each run): a
    probe beside a run says what the disk did then."""

    def __init__(self, directory: str | os.PathLike, record_bytes: int, depth: int = 32,
                 file_bytes: int = 512 << 20, seed: int = 0) -> None:  # fmt: skip
        self._rng = np.random.default_rng(seed)
        self._scratch = _scratch_dir(Path(directory))
        try:
            rows = max(1024, file_bytes // record_bytes)
            path = self._scratch / _STEP_SCRATCH
            self._file, _ = _scratch_file(path, rows, record_bytes // 4, depth, self._rng)
            self._compute = overlapped_pass(np.random.default_rng(0))
            self._compute()
        except BaseException:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise

    def __call__(self, repeats: int = 7) -> dict:
        f = self._file
        got = [_step_once(f, self._rng.choice(f.num_rows, size=PROBE_ROWS, replace=False), self._compute)
               for _ in range(repeats)]  # fmt: skip
        return {"rows": PROBE_ROWS, "read_us": 1e6 * float(np.median([g[2] for g in got])),
                "write_us": 1e6 * float(np.median([g[3] for g in got]))}  # fmt: skip

    def close(self) -> None:
        self._file.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> DiskProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def at_probe(disk: dict, probe: dict) -> dict:
    """A hardware description's ``disk`` section priced at the moment ``probe`` (a :class:`DiskProbe` timing, or
    the mean of two) was timed: the step's read fit scaled by the probe's read time over the calibration's, the
    write fit by its write time (the CPU per request, what the I/O takes from the compute's cores, as
    calibrated). The scales go in ``step.at_probe``. A section without a probe (an older calibration) is
    returned as it is."""
    step = disk.get("step", {})
    ref = step.get("probe")
    if ref is None:
        return disk
    scale = {way: probe[f"{way}_us"] / ref[f"{way}_us"] for way in ("read", "write")}
    timed = ("fixed_us", "us_per_call", "us_per_page")
    scaled = {way: {k: v * scale[way] if k in timed else v for k, v in step[way].items()} for way in scale}
    return {**disk, "step": {**step, **scaled, "at_probe": scale}}
