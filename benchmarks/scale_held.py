"""bench_scale's figures of the held writes (:mod:`hotline.tiers.held_rows`): a run of a few dozen steps fills a
small part of the write buffer and never sweeps, so the sweep a long run makes is measured here (forced once,
after the timed steps) and bounded (the whole file read and written at the disk's sequential rate), and the
samples/s are given with it spread over the steps that fill the buffer."""

from __future__ import annotations

import time


def sweep_figures(f, held_before: int, steps: int) -> dict | None:
    """The held writes of the RowFile ``f`` after ``steps`` timed steps (``held_before``: rows held or swept before
    them), and the seconds of one sweep of them, forced now (the writer is idle: the look-ahead has drained)."""
    held = f.held
    if held is None:
        return None
    added = held.swept_rows + held.count - held_before
    out = {"bytes": held.nbytes, "capacity_rows": held.capacity, "rows_held": held.count,
           "sweeps_in_run": held.sweeps, "rows_added_per_step": added / max(steps, 1)}  # fmt: skip
    t = time.perf_counter()
    with f._write_lock:
        held.sweep(f)
    out["sweep_s"] = time.perf_counter() - t
    return out


def amortized(out: dict, batch: int) -> None:
    """Adds to ``out["held"]``: the steps a buffer's fill takes, the long-run sweep's bound and the samples/s with
    the measured sweep and with the bound spread over those steps."""
    h = out.get("held")
    if not h or not out.get("samples_per_s"):
        return
    step_s = batch / out["samples_per_s"]
    h["steps_per_sweep"] = h["capacity_rows"] / max(h["rows_added_per_step"], 1e-9)
    h["sweep_bound_s"] = 2 * out["file_bytes"] / (out["disk_write_mb_per_s"] * 1e6)
    for key, sweep in (("samples_per_s_measured_sweep", h["sweep_s"]), ("samples_per_s_sweep_bound",
                                                                          h["sweep_bound_s"])):  # fmt: skip
        h[key] = batch / (step_s + max(sweep, h["sweep_s"]) / h["steps_per_sweep"])
