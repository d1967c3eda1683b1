"""The pipeline and GPU benchmarks run (tiny --smoke sizes on the CPU) and report what they promise."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.parametrize("script", ["bench_pipeline", "gpu_bench"])
def test_smoke(script, tmp_path):
    module = __import__(script)
    out = tmp_path / "r.json"
    payload = module.main(["--smoke", "--json", str(out)])
    assert out.is_file()
    for mode in ("device", "hybrid", "hotline_k0", "hotline_k2"):
        assert payload[mode]["samples_per_s"] > 0
    assert 0 <= payload["hotline_k2"]["stall_share"] <= 1
    assert payload["ratios"]
    if script == "bench_pipeline":
        # every configuration auto priced, beside its measured run: the choice first, its figure the margin's
        auto = payload["auto"]
        assert auto["measured"]
        first, *rest = auto["candidates"]
        assert first["predicted_samples_per_s"] == auto["predicted_samples_per_s"]
        assert first["measured_samples_per_s"] == auto["measured_samples_per_s"] and rest
        assert 0 <= auto["margin"] < 1 and 0 <= auto["margin_median_rounds"] < 1


def test_pipeline_sweep_runs_the_cold_path(tmp_path):
    """Budgets come from coverage targets of the run's own lookups; every hotline run measures its coverage,
    popular share and cold rows, and none of the smoke sweep is saturated."""
    payload = __import__("bench_pipeline").main(
        ["--smoke", "--modes", "hotline_k0", "--coverages", "0.7,0.85,1"]
    )
    runs = payload["sweep"]
    assert [r["target"] for r in runs] == [0.7, 0.85, 1.0]
    for r in runs[:2]:
        assert abs(r["coverage"] - r["target"]) < 0.03 and not r["saturated"] and r["note"] == ""
        assert r["cold_rows_per_step"] > 0 and 0 <= r["popular_share"] < 1
    assert runs[2]["saturated"] and runs[2]["note"].startswith("SATURATED")
    assert runs[0]["budget_bytes"] < runs[1]["budget_bytes"] < runs[2]["budget_bytes"]
    assert payload["hotline_k0"]["target"] == 0.85  # the headline: the middle unsaturated budget


def test_gpu_bench_smoke_checks_exactness_and_records_what_the_gpu_run_needs(tmp_path):
    """The same code paths as the GPU run: exactness against device mode on probe rows and dense parameters,
    the plain nn.EmbeddingBag baseline, phase times on the device's clock, versions, the zero-copy probe;
    the JSON is rewritten after every mode (a timeout still returns what finished)."""
    import json

    out = tmp_path / "g.json"
    payload = __import__("gpu_bench").main(
        ["--smoke", "--json", str(out), "--modes", "device,hotline_k2,torch_embeddingbag"]
    )
    smoke = payload["stages"]["smoke"]
    assert smoke["exact"] is True
    modes = [r["mode"] for r in smoke["sweep"]]
    # budgets: three coverage targets and one share of the table bytes (--smoke's)
    assert modes[0] == "device" and "torch_embeddingbag" in modes and modes.count("hotline_k2") == 4
    assert [r.get("table_share") for r in smoke["sweep"] if r["mode"] == "hotline_k2"].count(0.02) == 1
    for r in smoke["sweep"][1:]:
        assert r["diff_dense"] <= 1e-4 and r["diff_probe_rows"] <= 1e-4, r["mode"]
    k2 = next(r for r in smoke["sweep"] if r["mode"] == "hotline_k2")
    assert 0 < k2["device_busy_share"] <= 1 and k2["dev_h2d_ms"] >= 0 and "stale_rows_per_step" in k2
    assert payload["versions"]["numba_threading_layer"] in ("omp", "tbb") and "triton" in payload["zero_copy"]
    written = json.loads(out.read_text())
    assert [r["mode"] for r in written["stages"]["smoke"]["sweep"]] == modes


def _report(config, choice, rounds):
    """A bench_pipeline JSON of ``rounds`` ({(mode, target): [samples/s per round]}) whose auto chose ``choice``."""
    sweep = [{"mode": m, "target": t, "budget_mib": None if t is None else t * 10, "saturated": False,
              "rounds_samples_per_s": v, "samples_per_s": max(v)} for (m, t), v in rounds.items()]  # fmt: skip
    m, t = choice
    return {
        "config": config,
        "sweep": sweep,
        "auto": {"choice": m, "budget_mib": None if t is None else t * 10},
    }


def test_pool_runs_weighs_the_choice_against_each_configuration_over_runs(tmp_path, capsys):
    """Golden: per run, each configuration's median round over the choice's; per configuration the geometric
    mean over the runs; the pooled margin from the highest mean. A lucky round of one run moves nothing."""
    import json
    import math

    bench, results = __import__("bench_pipeline"), __import__("pipeline_results")
    a = _report("kaggle", ("device", None), {("device", None): [100.0, 90.0, 80.0],
                                             ("hotline_k0", 0.7): [130.0, 99.0, 81.0]})  # fmt: skip
    b = _report("kaggle", ("device", None), {("device", None): [100.0, 100.0, 100.0],
                                             ("hotline_k0", 0.7): [90.0, 100.0, 92.0]})  # fmt: skip
    got = results.pool_runs([a, b])
    k0 = next(c for c in got["configurations"] if c["configuration"] == "hotline_k0 at 70%")
    assert k0["mean_over_choice"] == pytest.approx(math.sqrt(99.0 / 90.0 * 92.0 / 100.0))
    assert (k0["lowest"], k0["highest"], k0["runs"]) == (pytest.approx(0.92), pytest.approx(1.1), 2)
    assert got["fastest"] == "hotline_k0 at 70%" and got["choices"] == ["device", "device"]
    assert got["pooled_margin"] == pytest.approx(1 - 1 / k0["mean_over_choice"]) and got["pooled_margin_met"]
    # through the command line, with one JSON out
    files = []
    for i, rep in enumerate((a, b)):
        files.append(tmp_path / f"r{i}.json")
        files[-1].write_text(json.dumps(rep))
    out = bench.main(["--pool", *map(str, files), "--json", str(tmp_path / "pooled.json")])
    assert json.loads((tmp_path / "pooled.json").read_text())["pooled_margin"] == pytest.approx(
        out["pooled_margin"]
    )
    assert "pooled: fastest configuration hotline_k0 at 70%" in capsys.readouterr().out


def test_pool_runs_refuses_runs_of_different_configs(tmp_path, capsys):
    import json

    bench, results = __import__("bench_pipeline"), __import__("pipeline_results")
    a = _report("kaggle", ("device", None), {("device", None): [1.0]})
    b = _report("emb-heavy", ("device", None), {("device", None): [1.0]})
    with pytest.raises(ValueError, match="different configs"):
        results.pool_runs([a, b])
    with pytest.raises(SystemExit) as e:
        bench.main(["--pool", str(tmp_path / "missing.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--pool" in err[-1] and "missing.json" in err[-1]
    # the JSON out is never one of the runs pooled: refused before anything is read or written
    run = tmp_path / "run.json"
    run.write_text(json.dumps(a))
    with pytest.raises(SystemExit) as e:
        bench.main(["--pool", str(run), "--json", str(run)])
    assert e.value.code == 2 and json.loads(run.read_text()) == a
    assert "an input of this command" in capsys.readouterr().err.strip().splitlines()[-1]


def test_budget_ratios_pair_rounds_and_bound_what_lookahead_can_gain():
    """Golden, worked by hand: the paired ratio is the median of each round's K=2 / K=0; the ceiling is K=0's
    step over the same step less its exposed movement (60 / (60 - 3) = 1.0526...); a run that lost a round
    does not pair up; the 1.05x target counts as above the ceiling only where it is."""
    bench = __import__("pipeline_results")

    def run(mode, budget, rounds, **extra):
        return {"mode": mode, "budget_bytes": budget, "budget_mib": budget and budget / 2**20, "target": 0.7,
                "coverage": 0.7, "samples_per_s": max(rounds), "rounds_samples_per_s": rounds, **extra}  # fmt: skip

    rows = [
        run("hybrid", None, [100.0, 80.0, 90.0]),
        run("hotline_k0", 1 << 20, [100.0, 50.0, 90.0], step_ms=60.0, stall_ms=3.0),
        run("hotline_k2", 1 << 20, [95.0, 60.0, 99.0]),
        run("hotline_k0", 2 << 20, [100.0, 100.0, 100.0], step_ms=50.0, stall_ms=1.0),
        run("hotline_k2", 2 << 20, [90.0, 110.0]),  # lost a round: no pairing
    ]
    got = bench.budget_ratios(rows)
    assert got[0]["k2_over_k0"] == pytest.approx(99.0 / 100.0)  # fastest rounds: 99 over 100
    assert got[0]["k2_over_k0_paired"] == pytest.approx(1.1)  # median of 0.95, 1.2, 1.1
    assert got[0]["k2_over_hybrid_paired"] == pytest.approx(0.95)  # median of 0.95, 0.75, 1.1
    assert got[0]["lookahead_ceiling"] == pytest.approx(60.0 / 57.0)
    assert got[1]["k2_over_k0_paired"] is None and got[1]["k2_over_hybrid_paired"] is None
    assert got[1]["lookahead_ceiling"] == pytest.approx(50.0 / 49.0)
    met = bench.targets_met(got)
    assert met["k2_over_k0_paired_min"] == pytest.approx(1.1)
    assert (met["budgets"], met["budgets_ceiling_below_target"]) == (2, 1)
    assert bench.lookahead_ceiling({"step_ms": 10.0}) is None  # K=0 without its stall measured: no bound


def test_timing_warms_every_stale_kernel_signature_first():
    """Before timing a look-ahead run, the stale-row kernel is compiled for every number of live steps (one
    signature each), not inside the timed steps; the steps a run timed are in its record."""
    import argparse

    from numba import types

    from hotline.kernels import gather

    bench = __import__("bench_pipeline")
    payload = bench.main(["--smoke", "--modes", "hotline_k2", "--coverages", "0.85"])
    sigs = gather._stale_holders.signatures
    counts = {len(a) for sig in sigs for a in sig if isinstance(a, types.UniTuple)}
    assert counts >= {1, 2, 3, 4, 5}  # K = 2: K + 3 staging slots, so up to 5 live steps
    assert payload["hotline_k2"]["steps"] == 4  # --smoke's steps, no window asked for
    window = argparse.Namespace(steps=3, min_seconds=0.5, max_steps=10_000)
    assert bench.max_steps(window) == 10_000 and bench.max_steps(argparse.Namespace(steps=3)) == 3
