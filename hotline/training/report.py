"""Pictures of training runs from their ``--metrics`` files (``hotline report``): loss and validation AUC
against step, the tier figures (hit rate, popular-sample share, overlap) over time, and per run the time of
an average step split by phase (stacked). Several runs share the curves' axes and get a phase panel each.

Where a run's rows are gathered ahead (``stall`` recorded), the worker's row movement (dispatch, gather,
copy, write-back) overlaps compute: the stack then shows where the main thread's time goes (compute phases
and the ``stall`` waiting for rows), and the movement is drawn as a dashed line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hotline import _io
from hotline._paths import check_file

MOVEMENT = ("dispatch", "gather", "h2d", "write_back")
RATE_SERIES = (  # record key, legend name, line style
    ("hot_lookup_share", "hit rate (hot lookups)", "-"),
    ("popular_sample_share", "popular-sample share", "--"),
    ("overlap_ratio", "overlap ratio", ":"),
)
TITLES = ("training loss", "validation AUC", "hit rate / popular share / overlap")
PHASES = ("dispatch", "gather", "h2d", "popular_compute", "non_popular_compute", "forward_backward",
          "sparse_update", "dense_allreduce", "dense_update", "write_back", "stall")  # fmt: skip
"""Known phases in step order; each keeps one colour in every panel."""


NUMBERS = ("loss", "auc", "val_auc", "ms_per_step", "window_steps", *(k for k, _, _ in RATE_SERIES))
"""Record fields the report draws: each a number (or null) where present."""
STEPS = ("step", "steps")
"""Record fields that count steps: each a whole number >= 0 where present."""


def _check_record(path: Path, i: int, rec) -> None:
    """Raises ValueError naming the file, line and field of a record the report cannot draw."""
    where = f"{path}, line {i}"
    if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
        raise ValueError(f"{where}: not a Hotline metrics record (no 'kind')")
    for key in STEPS:
        v = rec.get(key)
        if key in rec and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{where}: {key!r} is {v!r}, not a step count (a whole number >= 0)")
    if rec["kind"] == "train" and "step" not in rec:
        raise ValueError(f"{where}: a training record without its 'step'")
    for key in NUMBERS:
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{where}: {key!r} is {v!r}, not a number")
    for key in ("time_s", "phase_ms_per_step"):
        v = rec.get(key)
        if v is None:
            continue
        if not isinstance(v, dict) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values()
        ):
            raise ValueError(f"{where}: {key!r} is not an object of phase names and numbers")
    if "mode" in rec and not isinstance(rec["mode"], str):
        raise ValueError(f"{where}: 'mode' is {rec['mode']!r}, not a name")


def read_metrics(path: str | os.PathLike, warn=None) -> list[dict]:
    """The records of a ``--metrics`` .jsonl file: ValueError naming the file, the line and the field of a
    bad one (not JSON, not text, a field of the wrong type). A last line cut short (a run stopped while
    writing it: no newline after it, not JSON) is skipped and named through ``warn`` (default: a line on
    stderr)."""
    path = Path(path)
    check_file(path, "metrics file")  # missing, a directory, a FIFO, /dev/null: named
    records = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last = i == len(lines)  # no newline after it
        try:
            rec = json.loads(raw.decode())
        except UnicodeDecodeError:
            if last:
                _skipped(path, i, warn)
                continue
            raise ValueError(
                f"{path}, line {i}: not text (a metrics file holds JSON records, one a line)"
            ) from None
        except json.JSONDecodeError as e:
            if last:
                _skipped(path, i, warn)
                continue
            raise ValueError(f"{path}, line {i}: not a JSON record ({e.msg})") from None
        _check_record(path, i, rec)
        records.append(rec)
    if not any(r["kind"] == "train" for r in records):
        raise ValueError(
            f"{path} has no training records (kind 'train'): was it written by `hotline train --metrics`?"
        )
    return records


def _skipped(path: Path, i: int, warn) -> None:
    line = f"{path}, line {i}: its last line is cut short (the run was stopped while writing it?): skipped"
    if warn is None:
        import sys

        print(f"hotline report: warning: {line}", file=sys.stderr)
    else:
        warn(line)


def run_label(path: str | os.PathLike, records: list[dict]) -> str:
    """``stem (mode)``: the file's name and the mode its summary names."""
    modes = [r["mode"] for r in records if r.get("kind") == "summary" and "mode" in r]
    stem = Path(path).stem
    return f"{stem} ({modes[-1]})" if modes and modes[-1] not in stem else stem


def phase_ms(records: list[dict]) -> tuple[list[int], dict[str, list[float]], list[float]]:
    """Steps, milliseconds per step by phase, and wall-clock ms per step of the training records (older
    records without ``window_steps`` use the step difference to the previous record)."""
    train = [r for r in records if r["kind"] == "train"]
    steps, wall, rows = [], [], []
    prev = 0
    for r in train:
        n = r.get("window_steps") or max(r["step"] - prev, 1)
        prev = r["step"]
        per = r.get("phase_ms_per_step") or {k: 1e3 * v / n for k, v in r.get("time_s", {}).items()}
        rows.append(per)
        steps.append(r["step"])
        wall.append(float(r.get("ms_per_step", float("nan"))))  # older records: not known
    names = sorted({k for per in rows for k in per}, key=_phase_order)
    return steps, {k: [per.get(k, 0.0) for per in rows] for k in names}, wall


def _phase_order(name: str) -> tuple[int, str]:
    return (PHASES.index(name) if name in PHASES else len(PHASES), name)


def phase_colour(name: str):
    """The colour of a phase: the same in every panel and every figure (report, notebooks)."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"].colors
    i = PHASES.index(name) if name in PHASES else len(PHASES) + sum(map(ord, name))
    return colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20]


def report_figure(runs: list[tuple[str, list[dict]]]):
    """The figure of ``runs`` (label, records): a row of curves shared by all runs, a row of phase panels."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    if not runs:
        raise ValueError("no runs to report")
    n = len(runs)
    fig = Figure(figsize=(max(15, 5 * n), 9), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1.1])
    ax_loss, ax_auc, ax_rate = top.subplots(1, 3, sharex=True)
    phase_axes = bottom.subplots(1, n, sharey=True, squeeze=False)[0]
    colours = matplotlib.colormaps["tab10"].colors
    top_ms = 0.0  # one scale for every run's phase panel (shared y), the warm-up windows left out of it

    for i, (label, records) in enumerate(runs):
        c = colours[i % len(colours)]
        lw = 1.5 + 2.0 * (n - 1 - i) / max(
            n - 1, 1
        )  # earlier runs wider: equal curves (exact modes) stay visible
        train = [r for r in records if r["kind"] == "train"]
        ax_loss.plot(
            [r["step"] for r in train], [r["loss"] for r in train], color=c, lw=lw, marker=".", label=label
        )
        evals = [(r["step"], r["auc"]) for r in records if r["kind"] == "eval" and "auc" in r]
        evals += [(r["steps"], r["val_auc"]) for r in records if r["kind"] == "summary" and "val_auc" in r]
        if evals:
            xs, ys = zip(*sorted(evals))
            ax_auc.plot(xs, ys, color=c, lw=lw, marker="o", ms=2 + lw, label=label)
        modes = {r.get("mode") for r in records if r["kind"] == "summary"}
        for key, name, style in RATE_SERIES:
            if key == "popular_sample_share" and modes & {"hybrid", "device"}:
                continue  # no popular micro-batch in these modes: their 0 says nothing
            pts = [(r["step"], r[key]) for r in train if key in r]
            if pts:
                xs, ys = zip(*pts)
                ax_rate.plot(xs, ys, color=c, lw=lw, linestyle=style, label=f"{label}: {name}")
        top_ms = max(top_ms, _phase_panel(phase_axes[i], label, records))

    ax_loss.set(title=TITLES[0], xlabel="step", ylabel="log-loss (mean over the report window)")
    ax_auc.set(title=TITLES[1], xlabel="step", ylabel="ROC AUC on the validation split")
    ax_rate.set(title=TITLES[2], xlabel="step", ylabel="share of the report window", ylim=(-0.02, 1.02))
    for ax in (ax_loss, ax_auc, ax_rate):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not ax_auc.lines:
        ax_auc.text(0.5, 0.5, "no validation records", ha="center", va="center", transform=ax_auc.transAxes)
    if not ax_rate.lines:
        ax_rate.text(
            0.5, 0.5, "no tier figures (device mode)", ha="center", va="center", transform=ax_rate.transAxes
        )
    phase_axes[0].set_ylabel("ms per step (mean over the report window)")
    if top_ms > 0:
        phase_axes[0].set_ylim(0, 1.15 * top_ms)
    return fig


def _phase_panel(ax, label: str, records: list[dict]) -> float:
    """Draws a run's phases; returns the largest ms per step after its warm-up window (0 if none)."""
    steps, phases, wall = phase_ms(records)
    overlapped = "stall" in phases
    stacked = {k: v for k, v in phases.items() if not (overlapped and k in MOVEMENT)}
    if stacked:
        colours = [phase_colour(k) for k in stacked]
        ax.stackplot(steps, *stacked.values(), labels=list(stacked), colors=colours, alpha=0.9)
    if overlapped:
        movement = [sum(phases[k][j] for k in MOVEMENT if k in phases) for j in range(len(steps))]
        ax.plot(steps, movement, "k--", label="row movement (worker, overlapped)")
    if any(w == w for w in wall):  # not all NaN
        ax.plot(steps, wall, color="black", linewidth=1.5, label="wall clock")
    if len(steps) > 1:  # the first window compiles and warms the caches: marked, and kept out of the scale
        ax.axvspan(0, steps[0], color="0.85", zorder=0, label="warm-up window (compile, caches)")
        later = [w for w in wall[1:] if w == w] + [
            sum(v[j] for v in stacked.values()) for j in range(1, len(steps))
        ]
        if later:
            ax.set_ylim(0, 1.15 * max(later))
    ax.set(title=f"{label}: time per step by phase", xlabel="step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # records without phases: nothing to name (no warning line)
        ax.legend(fontsize=7, loc="upper right")
    totals = [sum(v[j] for v in stacked.values()) for j in range(len(steps))]
    later = [x for x in [*wall[1:], *totals[1:]] if x == x]
    return max(later, default=0.0)


def write_report(
    paths: list[str | os.PathLike], out: str | os.PathLike, dpi: int = 110, force: bool = False
) -> Path:
    """Reads every metrics file, draws :func:`report_figure` and writes it to ``out`` (.png, .svg or .pdf, by
    the name given: a link's target gets that format; atomically). An existing ``out`` is replaced only with
    ``force``; a metrics file never (:func:`hotline.outputs.guard`)."""
    from hotline.outputs import guard

    fmt = Path(out).suffix.lstrip(".").lower()
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"--out {out}: expected a .png, .svg or .pdf file name")
    out = guard("write_report out", out, [("metrics file", p) for p in paths], force=force)
    runs = []
    for p in paths:
        records = read_metrics(p)
        runs.append((run_label(p, records), records))
    labels = [label for label, _ in runs]
    for i, (label, records) in enumerate(runs):  # two files of one name: tell them apart by their folder
        if labels.count(label) > 1:
            runs[i] = (f"{Path(paths[i]).parent.name}/{label}", records)
    fig = report_figure(runs)
    return _io.atomic_write(out, lambda f: fig.savefig(f, format=fmt, dpi=dpi))
