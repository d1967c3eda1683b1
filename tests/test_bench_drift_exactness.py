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


def test_bench_drift_exactness_ranks_smoke(tmp_path, monkeypatch):
    """``--ranks 2``: device mode on 2 gloo ranks against one process, a figure at every step."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        bench = importlib.import_module("bench_drift_exactness")
        argv = ["--smoke", "--threads", "1", "--ranks", "2", "--optimizers", "sgd", "--no-independent"]
        report = bench.main(argv)
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    result = report["results"]["sgd"]
    ranks = result["ranks"]
    assert ranks["ranks"] == 2 and len(ranks["max_rel_diff"]) == len(ranks["relu_flips"]) == 6
    # the ranks sum the two halves' dense gradients: reassociation, not a bit-identical run, and not far off
    assert all(0 <= d < 1e-4 for d in ranks["max_rel_diff"]) and max(ranks["max_rel_diff"]) > 0
    curve = result["curves"]["device_r2"]
    assert [c["max_rel_diff"] for c in curve] == [ranks["max_rel_diff"][s - 1] for s in (3, 6)]
    assert "device mode on 2 ranks vs one process, 6 steps" in bench.ranks_summary(ranks)


def test_sign_flips_finds_the_first_relu_input_of_another_sign(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = importlib.import_module("bench_drift_exactness")
    ref = {"a": torch.tensor([[1.0, -2.0], [3.0, 4.0], [-5.0, 6.0], [7.0, 8.0]]), "b": torch.ones(4, 3)}
    same = {k: v[2:].clone() for k, v in ref.items()}  # rank 1 of 2: samples 2 and 3
    assert bench.sign_flips(ref, same, 2) == (0, None)
    got = {"a": torch.tensor([[-5.0, 6.0], [7.0, -1e-9]]), "b": torch.ones(2, 3)}
    got["b"][0, 2] = 0.0  # not > 0: the ReLU passes no gradient, as for a negative input
    n, first = bench.sign_flips(ref, got, 2)
    assert n == 2
    want = {"layer": "a", "sample": 3, "unit": 1, "one_process": 8.0, "unit_scale": 8.0}
    assert first == {**want, "ranks": float(torch.tensor(-1e-9))}  # the value as float32 holds it
