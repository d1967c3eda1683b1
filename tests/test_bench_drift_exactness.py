"""benchmarks/bench_drift_exactness.py runs (``--smoke``) and reports what it promises."""

import importlib
import json
import math
from pathlib import Path

import numba
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_bench_drift_exactness_smoke(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        bench = importlib.import_module("bench_drift_exactness")
        report = bench.main(["--smoke", "--threads", "1", "--json", str(tmp_path / "r.json")])
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    assert json.loads((tmp_path / "r.json").read_text())["results"].keys() == {"sgd", "rowwise-adagrad"}
    for result in report["results"].values():
        assert 0 < result["popular_share"] < 1  # both micro-batches occur: the split path is exercised
        curves = result["curves"]
        assert set(curves) == {"device_t2", "split_t1", "split_t2", "fused_k2_t1", "independent_t1"}
        assert [c["step"] for c in curves["split_t1"]] == [3, 6]
        assert all(c["max_rel_diff"] == 0.0 for c in curves["fused_k2_t1"])  # one fused pass: bit-identical
        for name in ("device_t2", "split_t1", "split_t2", "independent_t1"):
            assert all(
                math.isfinite(c["max_rel_diff"]) and 0 <= c["max_rel_diff"] < 1e-4 for c in curves[name]
            )
