"""Calibration of the disk tier: random 4 KiB reads per second at depth 1 and at the store's I/O depth, random
page writes per second at that depth, the sequential write rate, and the CPU time each read costs, all timed
through the disk store's own code (:class:`~hotline.tiers.disk_file.RowFile`: O_DIRECT where the filesystem
allows, coalescing, the I/O thread pool), on a scratch file of its own that is removed afterwards.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from hotline.tiers.disk_file import PAGE, RowFile, aligned_bytes, manifest_path, order_path

_SCRATCH = "hotline-disk-calibration.bin"


def _rate(fn, n: int) -> tuple[float, float]:
    """(operations per second, CPU seconds per operation) of ``fn()`` doing ``n`` operations."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / max(wall, 1e-9), cpu / max(n, 1)


def calibrate_disk(directory: str | os.PathLike, depth: int = 32, file_bytes: int = 512 << 20,
                   reads: int = 4000, seed: int = 0) -> dict:  # fmt: skip
    """The disk section of a hardware description, measured in ``directory`` (a scratch file of
    ``file_bytes``, written first: unwritten extents would read as zeros without touching the disk)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--disk {directory} is not a directory")
    rows = max(1024, file_bytes // PAGE)
    path = directory / _SCRATCH
    rng = np.random.default_rng(seed)
    f = RowFile(path, rows, PAGE // 4 - 1, 1, io_depth=depth)  # one 4 KiB record per page
    try:
        chunk = aligned_bytes(1 << 20)
        chunk[:] = rng.integers(0, 255, chunk.shape[0], dtype=np.uint8)

        def sequential() -> None:
            for at in range(0, f.size - chunk.shape[0] + 1, chunk.shape[0]):
                if os.pwrite(f._fd, chunk, at) != chunk.shape[0]:
                    raise OSError(f"short write to {path}")
            os.fsync(f._fd)

        seq_bps, _ = _rate(sequential, f.size)

        def random_reads(k: int, d: int):
            picked = [rng.choice(rows, size=k, replace=False) for _ in range(4)]
            f.io_depth = d

            def run() -> None:
                for p in picked:
                    f.read_rows(p)

            return _rate(run, 4 * k)

        n1 = max(64, reads // 8)
        iops_1, _ = random_reads(n1 // 4, 1)
        iops_d, cpu_read = random_reads(reads // 4, depth)
        picked = rng.choice(rows, size=reads // 4, replace=False)
        recs, pages = f.read_rows(picked)
        f.io_depth = depth
        write_iops, cpu_write = _rate(lambda: f.write_rows(picked, recs, pages), picked.shape[0])
        mode = f.mode
    finally:
        f.close()
        for p in (path, manifest_path(path), order_path(path)):
            p.unlink(missing_ok=True)
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
    }
