"""The profile's figures (matplotlib, imported only here): rank-frequency per table, what an HBM budget buys
(held-out and in-sample, optionally the cost model's predicted speed-up) and the working set per mini-batch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hotline.units import format_size, parse_size


def profile_figures(
    prof,
    budget: int | str | None = None,
    batch_sizes: Sequence[int] | None = None,
    hardware: dict | str | None = None,
    label_tables: int = 5,
    workload=None,
) -> dict:
    """The figures of :meth:`hotline.profiling.profile.Profile.plot` for ``prof`` (``workload``: the model the
    speed-up panel prices)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    figs = {}
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    largest = set(np.argsort(-np.asarray(prof.table_sizes), kind="stable")[:label_tables].tolist())
    grouped = 0
    for t, ids in enumerate(prof._ranked_by_table(prof.order)):
        if ids.size == 0:
            continue
        c = prof.table_counts(t)[ids]
        pick = np.unique(np.geomspace(1, c.size, min(c.size, 400)).astype(np.int64)) - 1
        if t in largest:
            ax.loglog(pick + 1, c[pick], lw=1.5, label=f"table {t} ({prof.table_sizes[t]:,} rows)", zorder=3)
        else:
            label = f"other {prof.num_tables - len(largest)} tables" if grouped == 0 else None
            ax.loglog(pick + 1, c[pick], lw=0.7, color="0.7", label=label, zorder=2)
            grouped += 1
    ax.set(xlabel="rank within table", ylabel="accesses in sample", title="Rank-frequency per table")
    ax.legend(fontsize="small")
    figs["rank_frequency"] = fig

    curve = prof.curve()
    curve = curve[curve.budget_bytes > 0]
    panels = 2 if hardware is not None else 1
    fig = Figure(figsize=(7, 4.5 * panels))
    ax = fig.add_subplot(panels, 1, 1)
    if "heldout_access_coverage" in curve:
        ax.semilogx(
            curve.budget_bytes,
            curve.heldout_access_coverage,
            color="C0",
            label="access coverage (held-out)",
        )
        ax.semilogx(curve.budget_bytes, curve.heldout_popular_sample_share, color="C1",
                    label="popular-sample share (held-out)")  # fmt: skip
    ax.semilogx(curve.budget_bytes, curve.access_coverage, "--", color="C0", lw=1,
                label="access coverage (in-sample, optimistic)")  # fmt: skip
    ax.semilogx(curve.budget_bytes, curve.popular_sample_share, "--", color="C1", lw=1,
                label="popular-sample share (in-sample, optimistic)")  # fmt: skip
    sizes = FuncFormatter(lambda x, _: format_size(int(round(x))) if x >= 1 else "")
    chosen = parse_size(budget) if budget is not None else None

    lo, hi = max(1, int(curve.budget_bytes.min())), max(2, int(curve.budget_bytes.max()))
    base = 2 ** max(1, math.ceil(math.log2(hi / lo) / 7))  # powers of two, at most ~8 labelled ticks

    def mark(a) -> None:
        a.xaxis.set_major_locator(LogLocator(base=base))
        a.xaxis.set_minor_locator(LogLocator(base=base, subs=()))
        a.xaxis.set_major_formatter(sizes)
        if chosen:
            a.axvline(chosen, color="k", lw=1, ls=":", label=f"chosen: {format_size(chosen)}")

    mark(ax)
    ax.set(xlabel="HBM budget", ylabel="share", ylim=(0, 1.02), title="What an HBM budget buys")
    ax.legend(fontsize="small")
    if hardware is not None:
        from hotline import costmodel

        hw = costmodel.load_hardware(hardware) if not isinstance(hardware, dict) else hardware
        sp = costmodel.speedup_curve(prof, hw, workload, budgets=list(curve.budget_bytes))
        ax2 = fig.add_subplot(2, 1, 2)
        ax2.semilogx(sp.budget_bytes, sp.k1_vs_hybrid, color="C2", label="hotline K>=1 / hybrid")
        ax2.semilogx(sp.budget_bytes, sp.k0_vs_hybrid, color="C4", label="hotline K=0 / hybrid")
        ax2.semilogx(sp.budget_bytes, sp.share_of_device, "--", color="C3", label="best hotline / device")
        ax2.axhline(1.0, color="0.6", lw=0.8)
        mark(ax2)
        ax2.set(
            xlabel="HBM budget",
            ylabel="predicted speed-up",
            title=f"Predicted on {hw['name']} (cost model)",
        )
        ax2.legend(fontsize="small")
    fig.tight_layout()
    figs["budget"] = fig

    sizes_b = batch_sizes or [2**i for i in range(0, 17)]
    ws = prof.working_set(0 if budget is None else budget, sizes_b)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    ax.loglog(ws.batch_size, ws.looked_up_rows, "--", label="looked-up rows (B*T*L)")
    ax.loglog(ws.batch_size, ws.expected_unique_rows, label="unique rows (hybrid)")
    label = "unique cold rows (Hotline)" + ("" if budget is None else f", {format_size(parse_size(budget))}")
    ax.loglog(ws.batch_size, np.maximum(ws.expected_cold_rows, 1e-3), label=label)
    ax.set(xlabel="mini-batch size", ylabel="rows per mini-batch", title="Working set per mini-batch")
    ax.legend()
    figs["working_set"] = fig
    return figs
