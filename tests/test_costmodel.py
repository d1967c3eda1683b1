"""The cost model: phases add up (sequential) or overlap (pipelined), bottlenecks are named, hardware loads."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hotline import costmodel as cm

HW = {
    "name": "test host",
    "host": {
        "dispatch_ns_per_lookup": {"1": 10.0, "n": 5.0},
        "gather_gbps": {"1": 2.0, "n": 4.0},
        "scatter_gbps": {"1": 2.0, "n": 4.0},
        "memcpy_gbps": 8.0,
        "handover_us": 50.0,
        "threads": 2,
        "cores": 2,
    },
    "device": {
        "kind": "cpu",
        "dense_gflops": 50.0,
        "mem_gbps": 5.0,
        "pass_overhead_us": 200.0,
        "update_ns_per_lookup_float": 1.0,
        "update_ns_per_row_float": 0.5,
    },
    "link": {"shared_memory": True, "h2d_gbps": 8.0, "d2h_gbps": 8.0},
}
W = cm.Workload(4096, 26, 1, 64, (13, 64, 64), (64, 1))


def stats(coverage=0.85, popular=0.2, cold=20_000, unique=60_000):
    return cm.Stats(coverage, popular, cold, unique)


def test_sequential_modes_add_their_phases():
    for mode in ("device", "hybrid", "hotline_k0"):
        p = cm.predict(mode, W, stats(), HW)
        assert p.step_s == pytest.approx(sum(p.phases_s.values()))
        assert p.samples_per_s == pytest.approx(4096 / p.step_s)
        assert p.bottleneck == max(p.phases_s, key=p.phases_s.get)
    hybrid = cm.phases("hybrid", W, stats(), HW)
    hotline = cm.phases("hotline_k0", W, stats(), HW)
    assert hybrid["gather"] == pytest.approx(60_000 * 256 / 4e9)  # unique rows at the gather bandwidth
    assert hotline["gather"] == pytest.approx(20_000 * 256 / 4e9)  # only the cold ones
    assert hybrid["h2d"] == 0.0  # the CPU is its own device: nothing is copied
    # K=0 computes two micro-batches: one more pass overhead than hybrid's single pass
    assert hotline["compute"] - hybrid["compute"] == pytest.approx(200e-6)


def test_pipelined_step_is_the_slowest_lane_plus_handover():
    gpu = {**HW, "link": {"h2d_gbps": 1.0, "d2h_gbps": 1.0}}  # a slow link, not shared memory
    p = cm.predict("hotline_k1", W, stats(cold=2_000_000), gpu)
    lanes = {k: v for k, v in p.phases_s.items() if k.startswith("lane: ") and k != "lane: hand-over"}
    assert p.step_s == pytest.approx(max(lanes.values()) + 50e-6)
    assert p.bottleneck == "link (h2d + d2h)"
    seq = cm.predict("hotline_k0", W, stats(cold=2_000_000), gpu)
    assert p.samples_per_s > seq.samples_per_s  # overlap hides the smaller lanes
    # On a CPU device the lanes share the cores: at least the CPU-seconds over the cores.
    shared = cm.predict("hotline_k1", W, stats(), HW)
    assert shared.phases_s["lane: shared cores"] >= shared.phases_s["lane: device (compute + updates)"]


def test_stale_rows_are_read_again_on_the_step_critical_path():
    """Under look-ahead the producer skips the stale rows and the main thread reads them before the step
    computes, at the one-thread gather bandwidth, in the device lane; the sequential modes have none."""
    fresh = replace(stats(), stale_rows_per_batch=0.0)
    stale = replace(stats(), stale_rows_per_batch=5_000.0)
    w = replace(W, worker_threads=2)
    p0, p1 = cm.phases("hotline_k1", w, fresh, HW), cm.phases("hotline_k1", w, stale, HW)
    assert p0["refresh"] == 0.0 and p0["gather"] == pytest.approx(20_000 * 256 / 4e9)
    assert p1["gather"] == pytest.approx(15_000 * 256 / 4e9)  # the producer's threads: "n"
    assert p1["refresh"] == pytest.approx(5_000 * 256 / 2e9)  # one thread: "1"
    k1 = cm.predict("hotline_k1", w, stale, HW).phases_s
    lane = "lane: device (compute + updates)"
    assert k1[lane] - cm.predict("hotline_k1", w, fresh, HW).phases_s[lane] == pytest.approx(p1["refresh"])
    for mode in ("hybrid", "hotline_k0"):  # a sequential step has no stale rows
        assert cm.phases(mode, W, stale, HW) == cm.phases(mode, W, fresh, HW)
    gpu = {**HW, "link": {"h2d_gbps": 1.0, "d2h_gbps": 1.0}}  # a GPU: the rows come over the link
    assert cm.phases("hotline_k1", w, stale, gpu)["refresh"] == pytest.approx(5_000 * 256 / 1e9)
    everything = replace(stats(), stale_rows_per_batch=1e9)  # never more than the cold rows
    assert cm.phases("hotline_k1", w, everything, HW)["gather"] == 0.0


def test_more_coverage_predicts_less_cold_work():
    low = cm.predict("hotline_k0", W, stats(coverage=0.7, cold=40_000), HW)
    high = cm.predict("hotline_k0", W, stats(coverage=0.95, cold=5_000), HW)
    assert high.phases_s["gather"] < low.phases_s["gather"] and high.samples_per_s > low.samples_per_s


def test_dispatch_interaction_and_assembly_terms():
    """The dispatch pays per lookup and again per cold lookup; the interaction's FLOPs run at their own rate;
    the tiered modes assemble their looked-up rows, device mode reads them (its lookup), never both."""
    hw = {**HW, "host": {**HW["host"], "dispatch_ns_per_cold_lookup": {"1": 4.0, "n": 2.0}}}
    N = W.lookups
    hybrid = cm.phases("hybrid", W, stats(coverage=0.8), hw)
    k0 = cm.phases("hotline_k0", W, stats(coverage=0.8), hw)
    assert hybrid["dispatch"] == pytest.approx(N * (5.0 + 2.0) * 1e-9)  # nothing hot: every lookup is cold
    assert k0["dispatch"] == pytest.approx(N * (5.0 + 0.2 * 2.0) * 1e-9)
    assert cm.phases("hybrid", W, stats(), HW)["dispatch"] == pytest.approx(N * 5.0 * 1e-9)  # older files
    mlp, inter, nbytes = cm.compute_terms(W, W.batch_size)
    assert inter == pytest.approx(6.0 * 4096 * 27 * 27 * 64) and mlp > 0
    slow = {**HW, "device": {**HW["device"], "interaction_gflops": 10.0}}
    gap = cm.phases("hybrid", W, stats(), slow)["compute"] - hybrid["compute"]
    assert gap == pytest.approx(inter / 10e9 - inter / 50e9)
    assert "assemble" in hybrid and "lookup" not in hybrid
    device = cm.phases("device", W, stats(), HW)
    assert "lookup" in device and "assemble" not in device
    assert hybrid["assemble"] == pytest.approx(N * 4 * 64 / 5e9)  # at the memory bandwidth without its own


def test_known_gpus_have_sources_and_load():
    gpus = cm.known_gpus()
    assert {"H100", "H200"} <= set(gpus)
    for g in gpus.values():
        assert g["sources"] and g["device"]["mem_gbps"] > 0 and g["link"]["h2d_gbps"] > 0
    assert gpus["H200"]["device"]["mem_gbps"] > gpus["H100"]["device"]["mem_gbps"]
    hw = cm.load_hardware("h200", HW)  # case-insensitive; host side from a calibration
    assert hw["host"] == HW["host"] and hw["device"]["kind"] == "cuda" and hw["sources"]
    p = cm.predict("hotline_k1", W, stats(), hw)
    assert p.phases_s["h2d"] > 0 and p.samples_per_s > 0
    with pytest.raises(ValueError, match="known GPU"):
        cm.load_hardware("A123")


def test_gpu_table_ships_as_package_data():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "gpus.json" in pyproject["tool"]["setuptools"]["package-data"]["hotline.costmodel"]


def test_stats_come_from_heldout_figures(tmp_path):
    import hotline
    from hotline.datasets.synthetic import generate

    path = generate(tmp_path / "d", 8000, max_rows_per_table=3000, progress=False)
    prof = hotline.profile(path, mini_batch_size=256, progress=False)
    s = cm.Stats.from_profile(prof, "64KiB")
    h = prof.summary("64KiB")["heldout"]
    assert s.hot_lookup_share == pytest.approx(h["access_coverage"])
    assert s.cold_rows_per_batch == pytest.approx(h["unique_cold_rows_per_batch"])
    curve = cm.speedup_curve(prof, HW, budgets=["0", "16KiB", "64KiB"])
    assert list(curve.heldout_coverage) == sorted(curve.heldout_coverage)
    assert (curve.speedup_vs_hybrid > 0).all()


def test_calibrate_cli_writes_and_refuses_existing_files(tmp_path, monkeypatch, capsys):
    from hotline.cli import main
    from hotline.costmodel import calibrate

    fake = {"format": "hotline-hardware", "name": "x", "calibration_s": 1.0, **HW}
    fake["host"] = {**HW["host"], "dispatch_ns_per_lookup": {"1": 1.0, "n": 1.0}}
    fake["device"] = {**HW["device"], "dense_fit_max_rel_error": 0.1}
    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: fake)
    out = tmp_path / "host.json"
    assert main(["calibrate", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["host"]["cores"] == 2
    assert main(["calibrate", "--out", str(out)]) == 2  # an existing file: --force, as in every command
    assert "exists: pass --force" in capsys.readouterr().err
    assert main(["calibrate", "--out", str(out), "--force"]) == 0
    mine = tmp_path / "mine.json"
    mine.write_text('{"not": "hotline"}')
    assert main(["calibrate", "--out", str(mine)]) == 2
    assert mine.read_text() == '{"not": "hotline"}'
    assert "exists: pass --force" in capsys.readouterr().err


def test_calibrate_times_this_host():
    """The real calibration (small): every figure positive and finite. How long it took is not asserted: a
    busy machine makes any wall-clock bound fail (timing belongs to benchmarks/)."""
    from hotline.costmodel.calibrate import calibrate

    hw = calibrate(threads=1)
    assert hw["calibration_s"] > 0
    for section in ("host", "device"):
        for k, v in hw[section].items():
            values = v.values() if isinstance(v, dict) else [v]
            assert all(not isinstance(x, (int, float)) or x >= 0 for x in values), k
    assert hw["device"]["dense_gflops"] > 0 and hw["host"]["gather_gbps"]["1"] > 0
    assert hw["device"]["reference_pass_us"] > 0  # what a later timing of a run's pass is scaled against
    # every figure timed in each of the rounds, its median round kept, and how far the rounds moved
    assert hw["rounds"] == 3 and set(hw["rounds_spread"]) >= {"dispatch_n", "update", "dense", "overlap"}
    assert all(v >= 0 for v in hw["rounds_spread"].values())
    # the overlap priced from the three rounds' timings pooled (a gain within their noise priced as none)
    assert len(hw["host"]["overlap"]["pairs"]) == 3
    assert hw["host"]["overlap_penalty"] in (1.0, hw["host"]["overlap"]["pooled"])
    p = cm.predict("hotline_k1", W, stats(), hw)
    assert p.samples_per_s > 0


def test_the_cpu_overlap_is_pooled_over_the_rounds_and_a_gain_within_their_noise_is_not_credited():
    """Golden values: (together, device alone, host alone) per round; the penalty (together - longer) /
    shorter of the sums, priced where the rounds show it (a loss, or a gain beyond 2 standard errors of the
    rounds' own penalties), else 1."""
    from hotline.costmodel.calibrate import _pooled_overlap

    noisy = _pooled_overlap([(1.0, 1.0, 0.5), (1.5, 1.0, 0.5), (1.25, 1.0, 0.5)])  # 0, 1 and 0.5
    assert noisy["pooled"] == pytest.approx(0.5) and noisy["se"] == pytest.approx(0.5 / 3**0.5)
    assert noisy["penalty"] == 1.0  # 0.5 + 2 x 0.289 >= 1: within the noise
    steady = _pooled_overlap([(1.1, 1.0, 0.5), (1.12, 1.0, 0.5), (1.08, 1.0, 0.5)])  # 0.2, 0.24 and 0.16
    assert steady["penalty"] == pytest.approx(0.2) and steady["pooled"] == pytest.approx(0.2)
    worse = _pooled_overlap([(1.8, 1.0, 0.5), (1.6, 1.0, 0.5), (1.7, 1.0, 0.5)])  # a loss is priced as timed
    assert worse["penalty"] == pytest.approx(1.4)
    assert [list(p) for p in worse["pairs"]] == [[1.8, 1.0, 0.5], [1.6, 1.0, 0.5], [1.7, 1.0, 0.5]]


def test_a_speed_probe_times_the_reference_or_the_runs_own_pass():
    """The probe a benchmark times beside each row: the calibration's reference pass, or the pass of the model
    a workload prices (the shape time_pass times); each call gives the median of its calls, in microseconds."""
    from hotline.costmodel.dense_timing import speed_probe

    small = cm.Workload(batch_size=64, num_tables=4, embedding_dim=8, bottom_mlp=(13, 16, 8), top_mlp=(16, 1))
    for probe in (speed_probe(threads=1, calls=1), speed_probe(threads=1, calls=3, workload=small)):
        first, second = probe(), probe()
        assert first > 0 and second > 0


def test_costmodel_benchmarks_smoke(tmp_path, monkeypatch):
    """bench_costmodel (given a hardware file: no calibration) and predict_h200 run and report ratios."""
    import sys
    from pathlib import Path

    import numba
    import torch

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    threads = (torch.get_num_threads(), numba.get_num_threads())
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(HW))
    try:
        import bench_costmodel
        import predict_h200

        r = bench_costmodel.main(
            ["--smoke", "--threads", "1", "--configs", "emb-heavy", "--hardware", str(hw)]
        )
        assert len(r["results"]) == 2 + 2 * 3  # device, hybrid, and both hotline modes at three budgets
        assert all(x["predicted"] > 0 and x["measured"] > 0 and x["ratio"] > 0 for x in r["results"])
        assert isinstance(r["target_met"], bool)
        assert all(x["cpu_scale"] is None and x["ratio_at_probe"] == x["ratio"] for x in r["results"])
        # with a reference pass: each row priced at the speed probed beside it (the median of its two probes
        # and the calibration's). A reference of 1 us: the probes' own times, so the price moves as far as the
        # nearer of the two says
        hw.write_text(json.dumps({**HW, "device": {**HW["device"], "reference_pass_us": 1.0}}))
        r = bench_costmodel.main(
            ["--smoke", "--threads", "1", "--configs", "emb-heavy", "--hardware", str(hw)]
        )
        for x in r["results"]:
            before, after = x["cpu_probe_us"]["before"], x["cpu_probe_us"]["after"]
            assert before > 1.0 and after > 1.0 and x["cpu_scale"] == pytest.approx(min(before, after))
            assert x["ratio_at_probe"] == pytest.approx(x["ratio"] / x["cpu_scale"])
            assert x["in_target"] == (0.8 <= x["ratio_at_probe"] <= 1.25)
        p = predict_h200.main(["--smoke", "--threads", "1"])
        assert {x["mode"] for x in p["results"]} == set(cm.PRICED_MODES) and len(p["results"]) == 12
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
        sys.modules.pop("bench_costmodel", None)


def test_nonnegative_fit_recovers_and_clamps():
    import numpy as np

    from hotline.costmodel.fitting import nnls as _nnls

    x = np.array([[1e9, 1e6, 1.0], [4e9, 2e6, 1.0], [2e8, 8e6, 1.0], [3e9, 3e7, 1.0]])
    truth = np.array([2e-11, 5e-10, 3e-4])
    np.testing.assert_allclose(_nnls(x.tolist(), (x @ truth).tolist()), truth, rtol=1e-6)
    y = x @ np.array([2e-11, 0.0, 3e-4]) - 1e-4 * x[:, 1] / 3e7  # a negative pull on the middle column
    assert (_nnls(x.tolist(), y.tolist()) >= 0).all()


def test_a_timed_pass_anchors_the_compute_and_the_assembly():
    """Where the description timed the model's own dense pass (``device.passes``), every mode's compute is the
    fitted formula scaled to give that timing at the timed batch (micro-batches keep the formula's shape and
    its cost per pass), and the row assembly scales with lookups from the timed one; another model keeps the
    fit alone."""
    from hotline.costmodel.phases import _compute_s

    key = cm.pass_key(W)
    timed = {"batch": 2048, "pooling_factor": 1, "pass_us": 30_000.0, "assemble_us": 3_000.0}
    hw = {**HW, "device": {**HW["device"], "passes": {key: timed}}}
    at = cm.Workload(2048, 26, 1, 64, (13, 64, 64), (64, 1))
    scale = 30e-3 / _compute_s(at, HW["device"], 2048)
    for mode in ("device", "hybrid"):
        fit = cm.phases(mode, W, stats(), HW)["compute"]
        assert cm.phases(mode, W, stats(), hw)["compute"] == pytest.approx(fit * scale)
    assert _compute_s(at, hw["device"], 2048) == pytest.approx(30e-3)  # the timing itself, at its batch
    k0, fit_k0 = cm.phases("hotline_k0", W, stats(), hw), cm.phases("hotline_k0", W, stats(), HW)
    assert k0["compute"] == pytest.approx(fit_k0["compute"] * scale)
    assert k0["assemble"] == pytest.approx(3e-3 * 4096 / 2048)  # twice the lookups of the timed pass
    other = cm.Workload(4096, 26, 1, 32, (13, 128, 32), (128, 1))
    assert cm.pass_key(other) != key
    assert cm.phases("hybrid", other, stats(), hw) == cm.phases("hybrid", other, stats(), HW)
    # the key holds what a pass's cost depends on, never the batch size or the producer's threads
    assert cm.pass_key(cm.Workload(512, 26, 1, 64, (13, 64, 64), (64, 1), worker_threads=3)) == key
    dcn = cm.Workload(1024, 26, 1, 16, (13, 64, 16), (64, 1), interaction="dcn", dcn_low_rank_dim=64)
    assert "dcn 3x64" in cm.pass_key(dcn)


@pytest.mark.parametrize(
    "passes, message",
    [
        ([1, 2], "device.passes is list, not an object"),
        ({"k": 3}, "device.passes['k'] is int, not an object"),
        (
            {"k": {"batch": 8, "pooling_factor": 1, "pass_us": 5.0}},
            "device.passes['k'].assemble_us is missing",
        ),
        ({"k": {"batch": 8, "pooling_factor": 1, "pass_us": 0.0, "assemble_us": 1.0}}, "a rate must be > 0"),
    ],
)
def test_malformed_timed_passes_are_named(passes, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cm.load_hardware({**HW, "device": {**HW["device"], "passes": passes}})


def test_time_pass_times_the_models_pass_on_this_cpu():
    """The real timing of a small model's pass: positive figures, the batch and bag size it ran, and a
    description holding it prices that model's compute from it."""
    import torch

    from hotline.costmodel.dense_timing import time_pass

    before = torch.get_num_threads()
    w = cm.Workload(64, 3, 2.4, 8, (13, 8), (8, 1))
    timed = time_pass(w, threads=1, budget_s=0.05)
    assert torch.get_num_threads() == before  # threads restored
    assert timed["batch"] == 64 and timed["pooling_factor"] == 2 and timed["threads"] == 1
    assert timed["pass_us"] > 0 and timed["assemble_us"] > 0
    hw = cm.load_hardware({**HW, "device": {**HW["device"], "passes": {cm.pass_key(w): timed}}})
    uniform = cm.Workload(64, 3, 2, 8, (13, 8), (8, 1))  # the bags it timed: the same key
    assert cm.phases("hybrid", uniform, stats(), hw)["compute"] == pytest.approx(timed["pass_us"] * 1e-6)
    # beside the calibration's reference pass: the run's pass scaled by the reference's calibrated / timed
    scaled = time_pass(uniform, threads=1, budget_s=0.05, reference_us=2 * timed["measured_reference_us"])
    assert 0 < scaled["reference_scale"] and scaled["pass_us"] == pytest.approx(
        (scaled["measured_pass_us"] - scaled["assemble_us"] / scaled["reference_scale"])
        * scaled["reference_scale"]
    )
    # 2.4 lookups a bag, not 2: more bytes than the timed pass
    assert cm.phases("hybrid", w, stats(), hw)["compute"] > timed["pass_us"] * 1e-6
