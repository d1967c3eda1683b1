"""The performance page's GPU section, from the JSON a ``benchmarks/gpu_bench.py`` run on a lent GPU wrote
(``benchmarks/results/gpu-*.json``, copied there from the device's ``$OUT``; GPU.md gives the command)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

COLUMNS = [
    ("mode", "mode"), ("budget_mib", "budget MiB"), ("budget_for", "budget for"), ("coverage", "coverage"),
    ("popular_share", "popular"), ("cold_rows_per_step", "cold rows/step"), ("samples_per_s", "samples/s"),
    ("stall_share", "stall"), ("device_busy_share", "dev busy"), ("steps", "steps"),
    ("peak_allocated_gib", "peak GiB"), ("note", "note"),
]  # fmt: skip
"""The sweep's columns on the page (a step's time is the inverse of samples/s: the JSON has it)."""


def _budget_for(r: dict) -> str | None:
    """What a hotline run's budget was chosen for: a coverage target, or a share of the tables' bytes."""
    if r.get("target") is not None:
        return f"{r['target']:.0%} coverage"
    if r.get("table_share") is not None:
        return f"{r['table_share']:.0%} of tables"
    return None


# the command of the first run (its JSON predates the ``command`` field)
RUN_WITHOUT_COMMAND = "python benchmarks/gpu_bench.py --no-smoke --budget-s 520 --hardware-out h200.json"


def _sweep(rows: list[dict], cell: Callable[[object], str]) -> list[str]:
    out = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        r = {**r, "budget_for": _budget_for(r)}
        out.append("| " + " | ".join(cell(r.get(k)) for k, _ in COLUMNS) + " |")
    return out


def _exact_line(stage: dict) -> str:
    rows = stage.get("sweep", [])
    compared = [r for r in rows if "diff_dense" in r]
    if not compared:
        return (
            "Exactness: not compared in this part (timed for different step counts; the smoke part compares)."
        )
    steps = {r["steps"] for r in rows if r.get("steps") is not None}
    worst = max(max(r.get("diff_probe_rows", 0.0), r.get("diff_dense", 0.0)) for r in compared)
    if len(steps) > 1:  # a run from before the comparison was limited to equal step counts
        return (f"Exactness: not meaningful here (modes ran {min(steps)} to {max(steps)} steps; the largest "
                f"difference from device mode, {worst:.1e}, compares different training lengths).")  # fmt: skip
    return f"Exactness against device mode on {len(compared)} runs: largest relative difference {worst:.1e}."


def section(json_dir: Path, cell: Callable[[object], str]) -> list[str]:
    """The GPU section: each ``gpu-*.json`` in ``json_dir`` (a full run) and its ``-smoke`` part, if any; table
    cells written by ``cell`` (the page's own formatter, :func:`run_all._cell`)."""
    lines: list[str] = []
    for path in sorted(json_dir.glob("gpu-*.json")):
        if path.stem.endswith(("-smoke", ".hardware")):
            continue
        data = json.loads(path.read_text())
        v, m = data.get("versions", {}), data.get("machine", {})
        lines += [f"## GPU: {v.get('gpu', '?')} ({path.name})", "",
                  "```bash", data.get("command", RUN_WITHOUT_COMMAND), "```", "",
                  f"torch {v.get('torch')} (CUDA {v.get('cuda')}), driver {v.get('driver')}, numba {v.get('numba')} "
                  f"({v.get('numba_threading_layer')}), {m.get('cpu_count')} host cores, {m.get('threads')} torch "
                  f"threads; the whole run {data.get('total_s', 0):.0f} s of its {data.get('budget_s', 0):.0f} s "
                  "budget. Each mode timed for at least 3 s and 50 steps after 20 warm-up steps.", ""]  # fmt: skip
        for name in ("full", "dcnv2"):
            stage = data.get("stages", {}).get(name)
            if not stage or "sweep" not in stage:
                continue
            a = stage.get("args", {})
            lines += [
                f"### {name}: batch {a.get('batch')}, dim {a.get('dim')}, {a.get('workload', 'kaggle')}",
                "",
            ]
            lines += [*_sweep(stage["sweep"], cell), ""]
            ratios = stage.get("ratios") or {}
            if ratios:
                lines += ["Ratios (best unsaturated hotline at the middle budget): "
                          + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) + ".", ""]  # fmt: skip
            lines += [_exact_line(stage), ""]
        smoke_path = path.with_name(path.stem + "-smoke.json")
        if smoke_path.exists():
            smoke = json.loads(smoke_path.read_text())
            stage = smoke.get("stages", {}).get("smoke", smoke)
            lines += ["### smoke part (small tables, every mode for the same steps)", "",
                      "```bash", "python benchmarks/gpu_bench.py --part smoke --json smoke.json", "```", "",
                      _exact_line(stage), ""]  # fmt: skip
    return lines
