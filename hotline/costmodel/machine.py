"""This machine's figures for ``--mode auto``: the device's memory, and the hardware description it prices with
(a `hotline calibrate` JSON, a known GPU, or this CPU timed once and cached, :func:`cpu_hardware`), with the run's
own dense pass timed beside it (:func:`with_timed_pass`) and the disk of a ``--cold-dir`` timed once per
filesystem and record size and cached (:func:`disk_hardware`). The caches live in
:func:`hotline.datasets.default.cache_root`; a cache that cannot be written only costs the timing next time."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from hotline.costmodel.hardware import load_hardware
from hotline.costmodel.workload import Workload


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
        from hotline.costmodel.hardware import known_gpus

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
    calibration version, torch version and OpenMP wait policy (a Numba or torch parallel region's start cost
    depends on it, and the timings with it)."""
    import platform

    import torch

    import hotline
    from hotline.costmodel.calibrate import VERSION
    from hotline.costmodel.timing import cpu_model
    from hotline.datasets.default import cache_root

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
    from hotline.costmodel.calibrate import calibrate

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
    ``device.passes`` (:func:`~hotline.costmodel.dense_timing.time_pass`, a few passes), unless it holds one
    for this model already: the cost model then prices every mode's compute from the run's own model, not
    only from the calibration's fit over 13 other shapes (see :func:`~hotline.costmodel.phases.pass_key`).
    Timed each run, not cached: it is the largest phase of a CPU step. Timed beside the calibration's
    reference pass, so that the speed this host had during the calibration, not in that second, scales it.

    ``recalibrate`` (``hw`` is :func:`cpu_hardware`'s cached calibration): when the reference pass runs more
    than :data:`STALE_CALIBRATION` times faster now than when the calibration was timed, that calibration was
    timed in a slow spell or beside other work (the test suite, a build) and would price every mode that much
    too slow: this CPU is timed again (under a minute), and the faster of the two calibrations is kept and
    prices the run."""
    from hotline.costmodel.calibrate import calibrate
    from hotline.costmodel.dense_timing import time_pass
    from hotline.costmodel.phases import pass_key

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

    from hotline.costmodel.disk_overlap import BESIDE_SHARES
    from hotline.costmodel.phases import STEP_FORMAT
    from hotline.datasets.default import cache_root

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
    delete the file to time it again; one kept without the held writes' figures is timed again). The timing runs in a fresh directory of its own inside
    ``cold_dir`` (scratch files, removed with it afterwards: nothing of the user's is touched; made by
    :func:`~hotline.costmodel.disk_calibrate.calibrate_disk`); ``timing``:
    :func:`~hotline.costmodel.disk_calibrate.calibrate_disk`'s sizes (tests time a small file)."""
    from hotline.costmodel.disk_calibrate import calibrate_disk
    from hotline.costmodel.phases import STEP_FORMAT

    path = disk_hardware_path(cold_dir, record_bytes, depth)
    try:
        kept = json.loads(path.read_text())
        step = kept.get("step", {})
        if step.get("version") == STEP_FORMAT and "held" in step:  # a timing from before held writes: again
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


def torch_device_type(device: str) -> str:
    """``cpu`` or ``cuda`` (torch's name for the device's kind)."""
    import torch

    return torch.device(device).type
