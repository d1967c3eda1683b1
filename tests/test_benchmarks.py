"""The benchmarks run: each in its tiny ``--smoke`` mode, in-process, writing JSON with sane figures.

These check that the scripts work and report what they promise (every figure present, finite, positive);
they do not check speed: speed is what the benchmarks themselves show on a real run.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """Imports a benchmark script by name (``bench_x``) with benchmarks/ on the path; restores threads."""
    import numba

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = (torch.get_num_threads(), numba.get_num_threads())
    yield lambda name: importlib.import_module(name)
    torch.set_num_threads(threads[0])
    numba.set_num_threads(threads[1])


def positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def run_smoke(module, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "result.json"
    report = module.main(["--smoke", "--threads", "1", "--json", str(out), *extra])
    written = json.loads(out.read_text())
    assert written["benchmark"] == report["benchmark"]
    assert written["machine"]["threads"] == 1 and written["machine"]["cpu_count"] >= 1
    if "target_met" in written:
        assert isinstance(written["target_met"], bool)
    return written


def test_common_timeit_and_table(bench, capsys):
    common = bench("common")
    calls = []
    t = common.timeit(lambda: calls.append(1), repeats=3, warmup=2, setup=lambda: calls.append(0))
    assert calls == [0, 1] * 5  # setup before every call, warm-up calls included but not timed
    assert len(t.runs_s) == 3 and t.min_s <= t.median_s and all(x >= 0 for x in t.runs_s)
    with pytest.raises(ValueError, match="repeats"):
        common.timeit(lambda: None, repeats=0)
    text = common.print_table(
        [{"a": "x", "b": 1.234}, {"a": "yy", "b": None}], [("a", "A", ""), ("b", "B", ".1f")]
    )
    assert text == capsys.readouterr().out.rstrip("\n")
    assert text.splitlines() == ["A     B", "--  ---", "x   1.2", "yy    -"]


def test_bench_sparse_update_smoke(bench, tmp_path):
    r = run_smoke(bench("bench_sparse_update"), tmp_path)
    methods = {(x["method"], x["optimizer"]) for x in r["results"]}
    assert methods == {
        ("index_add", "sgd"),
        ("torch-unique", "sgd"),
        ("numba", "sgd"),
        ("torch-unique", "rowwise-adagrad"),
        ("numba", "rowwise-adagrad"),
    }
    for x in r["results"]:
        for key in (
            "median_ms",
            "min_ms",
            "mlookups_per_s",
            "speedup_vs_index_add",
            "lookups",
            "unique_rows",
        ):
            assert positive(x[key]), (key, x)
    assert positive(r["numba_sgd_speedup_min"])


def test_bench_dispatcher_smoke(bench, tmp_path):
    r = run_smoke(bench("bench_dispatcher"), tmp_path)
    assert {(x["pooling"], x["method"]) for x in r["results"]} == {
        (1, "hotline"),
        (1, "numpy"),
        (4, "hotline"),
        (4, "numpy"),
    }
    for x in r["results"]:
        for key in ("ms_per_batch", "mlookups_per_s", "speedup_vs_numpy", "lookups_per_batch"):
            assert positive(x[key]), (key, x)
        assert 0.0 <= x["popular_share"] <= 1.0
        if x["method"] == "hotline":  # beside the memory-limit probe of the same lookups
            assert positive(x["probe_mlookups_per_s"]) and positive(x["limit_share"])
    assert set(r["phases_ms"]) == {"L=1", "L=4"}
    for phases in r["phases_ms"].values():
        assert {"glue (Python)", "split_batch (all)"} < set(phases)  # and one entry per kernel called
        assert all(positive(v) for v in phases.values())
    assert positive(r["hot_rows"])


def test_bench_omp_wait_smoke(bench, tmp_path):
    """The three wait-policy settings run in fresh processes, each under its own policy; only torch first is
    flagged (figures: >= 0, and the main job trained)."""
    r = run_smoke(bench("bench_omp_wait"), tmp_path)
    spins = str(r["spin_count"])
    assert [(x["setting"], x["policy"], x["warns"]) for x in r["results"]] == [
        ("torch first", [None, None], True),
        ("passive, no spin", ["PASSIVE", None], False),
        ("hotline first", ["PASSIVE", spins], False),
    ]
    for x in r["results"]:
        assert 0.0 <= x["cpu_ms_in_pause"] <= x["max_cpu_ms"]
        assert positive(x["numba_region_us"]) and positive(x["torch_region_us"])
        assert positive(x["main_job_samples_per_s"])


def test_bench_gather_smoke(bench, tmp_path):
    r = run_smoke(bench("bench_gather"), tmp_path)
    assert {(x["op"], x["dim"], x["method"]) for x in r["results"]} == {
        (op, dim, m) for op in ("gather", "write-back") for dim in (8, "state") for m in ("hotline", "torch")
    }
    for x in r["results"]:
        for key in ("median_ms", "mrows_per_s", "gb_per_s", "ratio_vs_torch", "rows"):
            assert positive(x[key]), (key, x)
    assert positive(r["gather_ratio_min"])


def test_bench_train_smoke(bench, tmp_path):
    r = run_smoke(bench("bench_train"), tmp_path, "--configs", "emb-heavy", "--lookahead", "0", "2")
    (cfg,) = r["results"]
    assert cfg["config"] == "emb-heavy" and positive(cfg["hot_rows"])
    assert [m["mode"] for m in cfg["modes"]] == ["device", "hybrid", "hotline", "hotline_k2"]
    for m in cfg["modes"]:
        for key in ("samples_per_s", "step_ms", "compute_ms", "sparse_update_ms"):
            assert positive(m[key]), (key, m)
        assert math.isfinite(m["loss"]) and m["loss"] > 0
    tiered = [m for m in cfg["modes"] if m["mode"] != "device"]
    assert all(positive(m["dispatch_ms"]) and positive(m["gather_ms"]) for m in tiered)
    assert all(0.0 <= m["overlap"] <= 1.0 for m in cfg["modes"] if m["mode"].startswith("hotline"))
    assert set(cfg["ratios"]) == {
        "hotline/hybrid",
        "hotline/device",
        "hotline_k2/hybrid",
        "hotline_k2/device",
    }
    assert all(positive(v) for v in cfg["ratios"].values())
    assert not r["data"]["reused"] and positive(r["data"]["train_rows"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
