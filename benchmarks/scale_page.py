"""The performance page's scale section, from ``benchmarks/results/scale.json`` (``benchmarks/bench_scale.py``:
the MLPerf table sizes on the disk store inside a memory cgroup, each command in its own process)."""

from __future__ import annotations

import json
from pathlib import Path

GIB = 1 << 30


def section(json_dir: Path) -> list[str]:
    """The section's lines, or none where the benchmark has not written its JSON."""
    path = json_dir / "scale.json"
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    m, b = d["measured"], d["baseline"]
    out = [
        "## scale", "",
        "```bash", d.get("command", "python benchmarks/bench_scale.py"), "```", "",
        f"MLPerf's tables on the disk store, each command in its own process: {d['rows']:,} rows at dim "
        f"{d['dim']}, row-wise Adagrad ({d['table_bytes'] / GIB:.2f} GiB of rows and state) inside a "
        f"{d['limit']['bytes'] / GIB:.0f} GiB {' '.join(d['limit']['how'].split(' ')[:2])} limit. Coverage "
        f"{m['hot_lookup_share']:.3f}, popular share {m['popular_sample_share']:.3f}, "
        f"{m['cold_rows_per_step']:,.0f} cold rows per step. {d.get('note', '')}".rstrip(), "",
        "| stage | exit | seconds | peak RSS GiB |", "|---|---|---|---|",
    ]  # fmt: skip
    for name, s in d["stages"].items():
        out.append(f"| {name} | {s['exit']} | {s['seconds']:.0f} | {s['peak_rss_bytes'] / GIB:.2f} |")
    ratio = d["samples_per_s"] / b["samples_per_s"] if b.get("samples_per_s") else float("nan")
    out += [
        "", "| figure | value |", "|---|---|",
        f"| per-row host bytes | {d['per_row_host_bytes']:.2f} |",
        f"| first step s (hotline / baseline with its files' writing) | {d['first_step_s']:.1f} / "
        f"{b.get('fill_s', 0) + b['first_step_s']:.1f} |",
        f"| samples/s (hotline early in a run / baseline) | {d['samples_per_s']:,.0f} / {b['samples_per_s']:,.0f} ({ratio:.2f}x) |",
        *([f"| hotline, sweeps at their bound | {held:,.0f} ({held / b['samples_per_s']:.2f}x) |"]
          if (held := (d.get("held") or {}).get("samples_per_s_sweep_bound")) and b.get("samples_per_s") else []),
        *([f"| hotline, every row written first | {w['samples_per_s']:,.0f} "
           f"({w['samples_per_s'] / b['samples_per_s']:.2f}x) |"]
          if (w := d.get("written")) and b.get("samples_per_s") else []),
        f"| checkpoint s, MB written (the disk's sequential MB/s) | {d['checkpoint_s']:.1f}, "
        f"{d['checkpoint_bytes'] / 1e6:,.0f} ({d['disk_write_mb_per_s']:,.0f}) |",
        f"| resumed bit-identically | {d['resume_exact']} |", "",
        "Baseline: device mode with its tables and their state in memory-mapped files.", "",
    ]  # fmt: skip
    return out
