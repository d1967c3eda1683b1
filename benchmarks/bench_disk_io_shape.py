"""The disk store's step I/O right after a forward and backward pass, against the same I/O after a pause.

Why the disk calibration times each step-shaped read and write-back right after a compute pass
(:mod:`hotline.costmodel.disk_calibrate`): the store's I/O threads need this CPU's cores, and what a parallel
region leaves on them (an OpenMP team spin-waiting for its next region) takes them. Paired timings, ABBA
order, each pair the same number of distinct rows read (``RowFile.read_rows``) and written back
(``RowFile.write_rows``) from a file of ``--file-rows`` 256-byte records: once right after a forward and
backward pass (:func:`hotline.costmodel.dense_timing.overlapped_pass`), once after a 30 ms pause. Printed: the
median ratio of each pair (after compute / after pause) with its interquartile range, and the median times.

``--torch-first`` loads torch before ``hotline`` (as a script that imports torch first does, and
``benchmarks/common.py`` did before it imported ``hotline`` first): torch's OpenMP then reads
an environment without a wait policy and its team spins after each region, where ``hotline`` sets a short spin
and then a passive wait for every process that imports it first (the CLI, and a script that does). ``--buffered``: through
the page cache, a file read in first (the I/O is then all CPU: no disk in the figure).

Run: ``python benchmarks/bench_disk_io_shape.py --torch-first`` and ``python benchmarks/bench_disk_io_shape.py``
(one process each: the policy is read when torch loads).
"""

from __future__ import annotations

import sys

if "--torch-first" in sys.argv:  # before anything imports hotline, which sets the wait policy
    import torch  # noqa: F401

import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--rows", type=int, default=2000, help="distinct rows per step")
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--file-rows", type=int, default=2_000_000)
    p.add_argument("--buffered", action="store_true", help="through the page cache (the I/O is all CPU)")
    p.add_argument("--torch-first", action="store_true", help="torch loaded before hotline (see above)")
    p.add_argument("--dir", default=None, help="where the scratch file goes (default: a temp dir)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.pairs, args.file_rows = 64, 2, 20_000
    import numpy as np

    from hotline.costmodel.dense_timing import overlapped_pass
    from hotline.costmodel.disk_calibrate import _step_once
    from hotline.tiers.disk_file import RowFile

    common.setup_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    compute = overlapped_pass(np.random.default_rng(args.seed))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        f = RowFile(Path(tmp) / "rows.bin", args.file_rows, 64, 0, io_depth=32, direct=not args.buffered)
        try:
            chunk = np.ones((1 << 16, 64), np.float32)
            for lo in range(0, args.file_rows, chunk.shape[0]):
                f.put_positions(lo, chunk[: min(chunk.shape[0], args.file_rows - lo)])
            f.flush()
            if f.direct:
                f.drop_page_cache()
            else:  # every page in the page cache: the timed I/O is system calls and copies only
                for lo in range(0, args.file_rows, 100_000):
                    f.read_rows(np.arange(lo, min(lo + 100_000, args.file_rows)))

            def one(before) -> np.ndarray:
                """The calibration's step-shaped timing, each read and write-back right after ``before()``."""
                rows = rng.choice(args.file_rows, size=args.rows, replace=False)
                return np.array(_step_once(f, rows, before)[2:4])

            def pause() -> None:
                time.sleep(0.03)

            for _ in range(2):
                one(pause), one(compute)
            paused, after = [], []
            for i in range(args.pairs):  # ABBA: a drift in the machine's load falls on both alike
                order = (pause, compute) if i % 2 == 0 else (compute, pause)
                got = {fn: one(fn) for fn in order}
                paused.append(got[pause])
                after.append(got[compute])
            mode = f.mode
        finally:
            f.close()
    paused, after = np.array(paused), np.array(after)
    ratio = after / paused
    policy = common.wait_policy()
    report = {
        "benchmark": "bench_disk_io_shape",
        "torch_first": args.torch_first,
        "omp_wait_policy_seen_by_torch": "unset (libgomp default: spin)" if args.torch_first else policy,
        "io_mode": mode,
        "rows": args.rows,
        "pairs": args.pairs,
        "load_average": common.load_average(),
    }
    for j, what in enumerate(("read", "write_back")):
        q1, med, q3 = np.percentile(ratio[:, j], [25, 50, 75])
        report[what] = {"after_pause_ms": 1e3 * float(np.median(paused[:, j])),
                        "after_compute_ms": 1e3 * float(np.median(after[:, j])),
                        "ratio_median": float(med), "ratio_iqr": [float(q1), float(q3)]}  # fmt: skip
        print(f"{what:10s} after a pause {report[what]['after_pause_ms']:6.1f} ms, after a forward and backward "
              f"{report[what]['after_compute_ms']:6.1f} ms: ratio {med:.2f} [{q1:.2f}-{q3:.2f}]")  # fmt: skip
    print(f"({mode}; {args.rows} rows; torch's OpenMP wait policy: {report['omp_wait_policy_seen_by_torch']}; "
          f"load average {report['load_average']}: figures under load)")  # fmt: skip
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
