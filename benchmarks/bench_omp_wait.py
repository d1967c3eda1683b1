"""Benchmark: OpenMP wait policies side by side: torch imported before hotline (libgomp's default, a long
spin), a passive wait with no spin (``OMP_WAIT_POLICY=PASSIVE`` alone, Hotline's earlier setting), and
hotline imported first (its setting: a passive wait after ``GOMP_SPINCOUNT`` = ``hotline._SPIN_COUNT`` spins).

Each setting runs in a fresh Python process (an OpenMP runtime reads the policy once, when it loads; no
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in its environment but the setting's own), with ``--threads`` threads:

- ``CPU ms in pause``: a ``--size`` x ``--size`` matmul, then ``--pause-ms`` asleep, ``--repeats`` times; the
  process's CPU time during each sleep (median): what idle threads take from the look-ahead producer and writer
  that share the cores;
- ``numba region us`` / ``torch region us``: one parallel region started right after the previous one ended (a
  two-chunk Numba ``prange`` doing nothing, a 65,536-element torch add), median of 2,000: the wake-up each
  region pays, which a one-hot split (two regions) and every op of a small step pay;
- ``main job samples/s``: ``hotline`` device-mode training of the main job's model (``TrainConfig``'s defaults:
  dim 16, 13-512-256-64-16, 512-256-1, batch 128) on a synthetic 26-table dataset, ``--steps`` steps after 20
  of warm-up, one after another in the process.

Also printed: whether the process warns (``hotline.pipeline.threads.spinning_warning``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common

import hotline

_PROBE = """
import json, os, statistics, sys, time
setting, size, threads, pause, repeats, steps, data = sys.argv[1], *map(int, sys.argv[2:7]), sys.argv[7]
if setting != "torch first":
    import hotline
policy = [os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")]  # what torch's runtime reads
import numba
import numpy as np
import torch
from numba import njit, prange

import hotline
from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset
from hotline.pipeline.threads import spinning_warning

torch.set_num_threads(threads)
numba.set_num_threads(threads)


@njit(parallel=True, nogil=True)
def region(a):
    for k in prange(a.shape[0]):
        a[k] += 1.0


def median_us(fn, n):
    fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(out)


m = torch.randn(size, size)
cpu = []
for _ in range(repeats + 2):
    m @ m
    c0 = time.process_time()
    time.sleep(pause / 1e3)
    cpu.append(time.process_time() - c0)
cpu = cpu[2:]
a = np.zeros(threads)
x, y, z = torch.randn(65536), torch.randn(65536), torch.empty(65536)
numba_us = median_us(lambda: region(a), 2000)
torch_us = median_us(lambda: torch.add(x, y, out=z), 2000)
cfg = TrainConfig(mode="device", progress=False, num_batches=steps + 20, threads=threads)
trainer = Trainer(cfg, Dataset(data))
try:
    for i, _ in enumerate(trainer.progress(trainer.batches())):
        if i == 19:
            t0 = time.perf_counter()
    sps = steps * cfg.mini_batch_size / (time.perf_counter() - t0)
finally:
    trainer.close()
print(json.dumps({"setting": setting, "cpu_ms_in_pause": 1e3 * statistics.median(cpu), "max_cpu_ms": 1e3 * max(cpu),
                  "numba_region_us": numba_us, "torch_region_us": torch_us, "main_job_samples_per_s": sps,
                  "warns": spinning_warning() is not None,
                  "policy": policy}))
"""

SETTINGS = {
    "torch first": {},
    "passive, no spin": {"OMP_WAIT_POLICY": "PASSIVE"},
    "hotline first": {},
}
"""Each setting's wait-policy environment (nothing else of the user's)."""


def probe(setting: str, data: str, args) -> dict:
    """One fresh process of ``setting``; its figures."""
    env = {k: v for k, v in os.environ.items() if k not in hotline._WAIT_POLICY_VARS}
    argv = [setting, args.size, args.threads, args.pause_ms, args.repeats, args.steps, data]
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, argv)],
        capture_output=True,
        text=True,
        env={**env, **SETTINGS[setting]},
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the {setting} probe failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--size", type=int, default=512, help="rows and columns of the matmul before each pause")
    p.add_argument("--pause-ms", type=int, default=20, help="sleep after each matmul, ms")
    p.add_argument("--steps", type=int, default=400, help="timed training steps of the main job's model")
    p.add_argument("--rounds", type=int, default=3, help="processes per setting, the settings taken in turn")
    p.set_defaults(repeats=20)
    args = p.parse_args(argv)
    if args.smoke:
        args.size, args.pause_ms, args.repeats, args.steps, args.rounds = 64, 5, 3, 5, 1
    common.setup_threads(args.threads)
    from hotline.datasets.synthetic import KAGGLE_TABLE_SIZES, generate

    with tempfile.TemporaryDirectory(prefix="omp-wait-") as tmp:
        samples = max(5000, 2 * 128 * (args.steps + 40))
        data = str(generate(Path(tmp) / "data", samples, seed=args.seed, table_sizes=KAGGLE_TABLE_SIZES,
                            max_rows_per_table=100_000, progress=False))  # fmt: skip
        runs = [probe(setting, data, args) for _ in range(args.rounds) for setting in SETTINGS]
    keys = ("cpu_ms_in_pause", "max_cpu_ms", "numba_region_us", "torch_region_us", "main_job_samples_per_s")
    rows = []
    for setting in SETTINGS:
        mine = [r for r in runs if r["setting"] == setting]
        rows.append({**mine[0], **{k: statistics.median(r[k] for r in mine) for k in keys}, "rounds": mine})
    common.print_table(
        rows,
        [("setting", "setting", ""), ("policy", "torch read (policy, spins)", ""),
         ("cpu_ms_in_pause", "CPU ms in pause", ".2f"), ("numba_region_us", "numba region us", ".1f"),
         ("torch_region_us", "torch region us", ".1f"), ("main_job_samples_per_s", "main job samples/s", ",.0f"),
         ("warns", "warns", "")],
        title=f"OpenMP wait policies on {args.threads} threads (median of {args.rounds} processes each): "
        f"{args.size}x{args.size} matmul then {args.pause_ms} ms asleep ({args.repeats} times), back-to-back "
        f"regions, {args.steps} main-job steps; load average {common.load_average()}",
    )  # fmt: skip
    spin, passive, mine = rows
    print(
        f"torch first burns {spin['cpu_ms_in_pause']:.2f} ms of CPU per {args.pause_ms} ms pause, passive "
        f"{passive['cpu_ms_in_pause']:.2f}, hotline first {mine['cpu_ms_in_pause']:.2f}; a Numba region after "
        f"another: {passive['numba_region_us']:.1f} us passive, {mine['numba_region_us']:.1f} us hotline first; "
        f"the main job: hotline first {mine['main_job_samples_per_s'] / passive['main_job_samples_per_s']:.2f}x "
        f"passive, {mine['main_job_samples_per_s'] / spin['main_job_samples_per_s']:.2f}x torch first"
    )
    report = {
        "benchmark": "omp-wait",
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": common.machine_info(args.threads),
        "spin_count": hotline._SPIN_COUNT,
        "results": rows,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
