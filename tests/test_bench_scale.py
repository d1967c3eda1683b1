"""benchmarks/bench_scale.py runs every stage (``--smoke``: tiny sizes, each stage its own process under the
memory limit where a cgroup can be made): the train stage draws rows never written, the ``written`` stage
(``--no-cold-lazy``) reads every disk row it asks for, the resume ends bit-identical, and the report prints the
side-by-side table with both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def test_every_stage_runs_and_the_written_stage_reads_what_the_lazy_one_draws(tmp_path, capsys):
    import bench_scale

    out = tmp_path / "scale.json"
    assert bench_scale.main(["--smoke", "--work", str(tmp_path / "w"), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [k for k, v in r["stages"].items() if v["exit"] != 0] == [], r["stages"]
    assert set(r["stages"]) == {"train", "resume", "evaluate", "predict", "export", "baseline", "written"}
    assert r["resume_exact"] is True
    lazy, eager = r["phases"]["counters_per_step"], r["written"]["phases"]["counters_per_step"]
    assert 0 < lazy["drawn_rows"] <= lazy["disk_rows"]  # never written: drawn, not read
    assert eager["drawn_rows"] == 0 and eager["disk_rows"] > 0 and eager["disk_reads"] > 0
    assert r["written"]["startup_s"]["fill_s"] > 0 and r["written"]["samples_per_s"] > 0
    assert r["faults_per_step"]["minor"] >= 0 and set(r["cpu_in_steps"]) >= {
        "user",
        "system",
        "idle",
        "steal",
    }
    printed = capsys.readouterr().out
    assert "rows written first" in printed and "hotline/baseline" in printed
    assert "rows written first (--no-cold-lazy): first step after" in printed
