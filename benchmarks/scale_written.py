"""``bench_scale``'s ``written`` stage: the train stage's timed steps on a store whose every row was written at
start-up (``--no-cold-lazy``), as a long run's steps are once the rows it reads were written before.

The ``train`` stage's store is lazily initialized: early in a run nearly every disk row a step asks for was never
written, so it is drawn, not read (``drawn_rows``). A long run reads them from the file. This stage measures that
case side by side with the others (same data, limit, batch and steps), with the sweep of its held writes read and
written through rows that exist on disk. It reports its own start-up (the eager fill included).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

import scale_held


def run(args, ds, work: Path, config_of, phases_of, vm_of) -> dict:
    """The stage's figures under ``written``: first step, start-up, samples/s over steps ``[1, steps // 2)``, their
    phases (``phases_of``), what the kernel did meanwhile (``vm_of``: counters before and after), and the held
    writes' sweep forced after them with the samples/s a long run's sweeps leave (the measured sweep spread)."""
    from hotline.training.trainer import Trainer

    half = args.steps // 2
    cold = work / "cold-w"
    t0 = time.perf_counter()
    tr = Trainer(replace(config_of(args, str(cold), args.steps), cold_lazy=False), ds)
    try:
        stats = tr.progress(tr.batches())
        next(stats)
        out: dict = {"first_step_s": time.perf_counter() - t0, "startup_s": dict(tr.mode.startup_s)}
        f = tr.mode.cold.host.file
        held0 = f.held.swept_rows + f.held.count if f.held is not None else 0
        before, t1 = vm_of(), time.perf_counter()
        timed = [next(stats) for _ in range(half - 1)]
        stats.close()
        seconds = time.perf_counter() - t1
        after = vm_of()
        out["kernel_in_steps"] = {k: after[k] - before[k] for k in before if after[k] != before[k]}
        out["samples_per_s"] = (half - 1) * args.batch / seconds if half > 1 else 0.0
        out["phases"] = phases_of(timed)
        h = scale_held.sweep_figures(f, held0, half - 1)
        if h and out["samples_per_s"]:
            h["steps_per_sweep"] = h["capacity_rows"] / max(h["rows_added_per_step"], 1e-9)
            step_s = args.batch / out["samples_per_s"]
            h["samples_per_s_measured_sweep"] = args.batch / (step_s + h["sweep_s"] / h["steps_per_sweep"])
        out["held"] = h
    finally:
        tr.close()
        shutil.rmtree(cold, ignore_errors=True)
    return {"written": out}
