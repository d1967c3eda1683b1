"""Benchmark: CPU that torch's idle OpenMP threads burn between parallel regions, torch imported before hotline
against hotline imported first, side by side.

``import hotline`` sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the environment has a policy), and torch's OpenMP
runtime reads it only when torch loads. Each order runs in a fresh Python process (no ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` in its environment): a ``--size`` x ``--size`` matmul on ``--threads`` threads, then a sleep
of ``--pause-ms``, ``--repeats`` times; the figure is the process's CPU time during each sleep (median), what its
threads take from the look-ahead producer and writer that share the cores. Also printed: whether the process
warns (``hotline.pipeline.threads.spinning_warning``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import common

import hotline

_PROBE = """
import json, statistics, sys, time
order, size, threads, pause, repeats = sys.argv[1], *map(int, sys.argv[2:6])
if order == "hotline first":
    import hotline
import torch
import hotline
from hotline.pipeline.threads import spinning_warning
torch.set_num_threads(threads)
a = torch.randn(size, size)
cpu = []
for _ in range(repeats + 2):
    a @ a
    c0 = time.process_time()
    time.sleep(pause / 1e3)
    cpu.append(time.process_time() - c0)
cpu = cpu[2:]
print(json.dumps({"order": order, "cpu_ms_in_pause": 1e3 * statistics.median(cpu), "max_cpu_ms": 1e3 * max(cpu),
                  "warns": spinning_warning() is not None}))
"""


def probe(order: str, args) -> dict:
    """One fresh process of ``order`` ('torch first' or 'hotline first'); its figures."""
    env = {k: v for k, v in os.environ.items() if k not in hotline._WAIT_POLICY_VARS}
    argv = [order, args.size, args.threads, args.pause_ms, args.repeats]
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, argv)], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"the {order} probe failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--size", type=int, default=512, help="rows and columns of the matmul before each pause")
    p.add_argument("--pause-ms", type=int, default=20, help="sleep after each matmul, ms")
    p.set_defaults(repeats=20)
    args = p.parse_args(argv)
    if args.smoke:
        args.size, args.pause_ms, args.repeats = 64, 5, 3
    common.setup_threads(args.threads)
    rows = [probe(order, args) for order in ("torch first", "hotline first")]
    common.print_table(
        rows,
        [("order", "import order", ""), ("cpu_ms_in_pause", "CPU ms in pause", ".2f"),
         ("max_cpu_ms", "max", ".2f"), ("warns", "warns", "")],
        title=f"CPU of idle OpenMP threads: {args.size}x{args.size} matmul on {args.threads} threads, then "
        f"{args.pause_ms} ms asleep, median of {args.repeats}, load average {common.load_average()}",
    )  # fmt: skip
    spin, passive = rows[0]["cpu_ms_in_pause"], rows[1]["cpu_ms_in_pause"]
    print(
        f"torch first burns {spin:.2f} ms of CPU per {args.pause_ms} ms pause, hotline first {passive:.2f} ms "
        f"({spin / max(passive, 1e-3):.0f}x)"
    )
    report = {
        "benchmark": "omp-wait",
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": common.machine_info(args.threads),
        "results": rows,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
