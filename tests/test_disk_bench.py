"""The disk tier's benchmarks (benchmarks/bench_disk_tier.py, bench_disk_io_shape.py): prices, pooled
calibrations and rounds paired with auto's choice (golden), and their smoke runs."""

import pytest
import torch


def test_bench_disk_tier_prices_a_row_where_both_probes_agree(monkeypatch):
    """A disk row is priced at the median of the two probes beside it and the calibration's (golden): a stall
    in one probe does not move the price; both slower (or both faster) moves it by the nearer of the two."""
    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    hw = {"disk": {"step": {"probe": {"rows": 2048, "read_us": 40.0, "write_us": 50.0}}}}

    def row(before, after):
        return {"disk_probe": {"before": {"read_us": before[0], "write_us": before[1]},
                               "after": {"read_us": after[0], "write_us": after[1]}}}  # fmt: skip

    assert bench_disk_tier.row_probe(row((36.0, 55.0), (240.0, 60.0)), hw) == {
        "read_us": 40.0,
        "write_us": 55.0,
    }
    assert bench_disk_tier.row_probe(row((44.0, 45.0), (48.0, 40.0)), hw) == {
        "read_us": 44.0,
        "write_us": 45.0,
    }
    assert bench_disk_tier.row_probe({}, hw) is None
    assert bench_disk_tier.row_probe(row((1.0, 1.0), (1.0, 1.0)), {"disk": {"step": {}}}) is None


def test_bench_disk_tier_keeps_each_rows_median_round(monkeypatch):
    """Of a disk row's rounds the median by samples/s stands for it (a round that raised left out), every
    round's samples/s and predicted/measured beside it; a row whose every round raised: its first error."""
    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    def rnd(n, sps, ratio):
        return {"mode": "hotline_k2_disk", "round": n, "samples_per_s": sps, "predicted_ratio": ratio}

    got = bench_disk_tier.typical([rnd(1, 900.0, 1.4), rnd(2, 1200.0, 1.05), {"error": "x", "round": 3},
                                   rnd(4, 1000.0, 1.1)])  # fmt: skip
    assert got["round"] == 4 and got["samples_per_s"] == 1000.0 and got["predicted_ratio"] == 1.1
    assert got["rounds_samples_per_s"] == [900.0, 1200.0, 1000.0]
    assert got["rounds_predicted_ratio"] == [1.4, 1.05, 1.1]
    failed = [{"mode": "hybrid_disk", "error": "first"}, {"mode": "hybrid_disk", "error": "second"}]
    assert bench_disk_tier.typical(failed)["error"] == "first"


def test_bench_disk_tier_smoke(tmp_path, monkeypatch):
    import json

    import numba

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        report = bench_disk_tier.main(["--smoke", "--threads", "1", "--json", str(tmp_path / "r.json")])
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["benchmark"] == report["benchmark"] == "bench_disk_tier"
    modes = [r["mode"] for r in written["results"]]
    assert modes == ["device", "mmap", "mmap_dram", "hybrid_disk", "hotline_k0_disk", "hotline_k2_disk"]
    for r in written["results"]:
        assert r["samples_per_s"] > 0
        if r["mode"].endswith("_disk"):
            assert r["io_mode"] == "direct" or r["io_mode"].startswith("buffered")
            assert r["disk_bytes_per_step"] > 0 and r["cold_rows_per_step"] > 0 and r["exposed_read_ms"] >= 0
            assert r["coverage"] is not None and r["popular_share"] is not None
            # two rounds in --smoke: the slower (the lower middle) stands for the row, both kept beside it
            assert len(r["rounds_samples_per_s"]) == 2 and r["samples_per_s"] == min(
                r["rounds_samples_per_s"]
            )
            pr = r["disk_probe"]  # the disk beside the run: before its clock, after it, and their mean
            assert pr["before"]["read_us"] > 0 and pr["after"]["write_us"] > 0
            assert pr["read_us"] == pytest.approx((pr["before"]["read_us"] + pr["after"]["read_us"]) / 2)
    mmap, held = written["results"][1], written["results"][2]
    assert mmap["page_cache_dropped_by"] and mmap["page_cache"] == "used (mmap), the machine's memory"
    # the same baseline with its page cache held to the disk store's DRAM budget, or the reason it could not be
    limited = held["page_cache_limit_bytes"] is not None
    assert held["page_cache"].startswith("used (mmap), held to" if limited else "used (mmap), not limited: ")
    if limited:
        assert held["cgroup_cache_bytes"] <= held["page_cache_limit_bytes"]
    assert mmap["readahead"] == "kernel default" and held["readahead"] == "off (MADV_RANDOM)"
    # what it really read, counted per timed step by the kernel (3 steps in --smoke)
    assert len(mmap["os_read_bytes_by_step"]) == len(mmap["major_faults_by_step"]) == 3
    assert all(f >= 0 for f in mmap["major_faults_by_step"]) and mmap["table_bytes"] > 0
    if mmap["os_read_bytes_per_step"] is not None:  # /proc/self/io where the kernel has it
        assert all(b >= 0 for b in mmap["os_read_bytes_by_step"])
    for r in written["results"][3:]:
        assert r["page_cache"] in ("bypassed (O_DIRECT)", "used (buffered I/O)")
        assert r["os_read_bytes_per_step"] is None or r["os_read_bytes_per_step"] >= 0
    for v in written["targets"].values():  # a missed target says why, in the run's figures
        assert v["met"] or "MiB" in v["why"] or "ms/step" in v["why"]
    assert set(written["targets"]) == {
        "hotline_k2_disk/hybrid_disk",
        "hotline_k2_disk/mmap_dram" if limited else "hotline_k2_disk/mmap",
        "hotline_k2_disk/device",
    }
    assert isinstance(written["target_met"], bool)


def test_bench_disk_io_shape_smoke(tmp_path, monkeypatch):
    """The paired probe of the I/O after a compute pass against after a pause runs and writes both medians
    and their ratio per direction (its figures are for a person to read: no time bound here)."""
    import json

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_io_shape
    import numba

    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        report = bench_disk_io_shape.main(["--smoke", "--threads", "1", "--buffered", "--dir", str(tmp_path),
                                           "--json", str(tmp_path / "r.json")])  # fmt: skip
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    written = json.loads((tmp_path / "r.json").read_text())
    assert written == json.loads(json.dumps(report)) and written["pairs"] == 2
    for what in ("read", "write_back"):
        r = written[what]
        assert r["after_pause_ms"] > 0 and r["after_compute_ms"] > 0 and r["ratio_median"] > 0
        assert r["ratio_iqr"][0] <= r["ratio_median"] <= r["ratio_iqr"][1]
    assert written["io_mode"].startswith("buffered") and not list(tmp_path.glob("tmp*"))  # scratch removed


def test_bench_disk_tier_pools_the_two_calibrations_pairs(monkeypatch):
    """The benchmark's disk figures are the mean of a calibration before its rows and one after; the overlap
    penalties are pooled from both calibrations' pairs (golden), not averaged: a gain within the pooled noise is
    priced as none even where one calibration alone showed it."""
    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    from hotline.costmodel.disk_overlap import pipeline_penalty
    from hotline.costmodel.fitting import pooled_penalty

    clear = [(1.5, 1.0, 1.0), (1.52, 1.0, 1.0), (1.48, 1.0, 1.0)]  # 0.5, tight: shown alone
    # look-ahead pipelines (pipelined, reads, compute, write-backs) at a compute penalty of 0.5: the disk lane
    # is together - 0.5 s, the reads-beside-writes penalty its excess over 1 s
    piped = [(2.0, 1.0, 1.0, 1.0), (2.02, 1.0, 1.0, 1.0), (1.98, 1.0, 1.0, 1.0)]  # 0.5, tight: shown alone
    spread = [(2.8, 1.0, 1.0, 1.0), (2.2, 1.0, 1.0, 1.0), (2.5, 1.0, 1.0, 1.0)]  # 1.3, 0.7, 1.0
    a = {"penalties_measured": {"read_write": pipeline_penalty(piped, 0.5), "compute": pooled_penalty(clear),
                                "read_write_pair": pooled_penalty(clear)}}  # fmt: skip
    b = {"penalties_measured": {"read_write": pipeline_penalty(spread, 0.5), "compute": pooled_penalty(clear),
                                "read_write_pair": pooled_penalty(clear)}}  # fmt: skip
    assert a["penalties_measured"]["read_write"]["penalty"] == pytest.approx(0.5)
    step = bench_disk_tier.mean_of(a, b) | {"read_write_penalty": 0.75, "compute_penalty": 0.5}
    bench_disk_tier.pool_penalties(step, a, b)
    rw = step["penalties_measured"]["read_write"]
    assert rw["pooled"] == pytest.approx(0.75) and len(rw["pairs"]) == 6 and rw["compute_penalty"] == 0.5
    # the six pairs' own fits: 0.5, 0.52, 0.48, 1.3, 0.7 and 1
    assert rw["se"] == pytest.approx(0.1361, abs=1e-4)
    assert step["read_write_penalty"] == 1.0  # 0.75 + 2 se >= 1: not the mean, 0.75
    assert step["compute_penalty"] == pytest.approx(0.5)  # both show it: pooled, as each
    assert step["penalties_measured"]["read_write_pair"]["penalty"] == pytest.approx(0.5)  # kept, not priced
    # calibrations that also timed a compute a quarter of the I/O: both points pooled, the pipeline fitted at them
    short = [(1.0, 1.0, 0.25), (1.05, 1.0, 0.25)]  # 0 and 0.2 of the compute: 0.1 pooled, ratio 0.25
    a["penalties_measured"]["compute_at_0.25"] = b["penalties_measured"]["compute_at_0.25"] = pooled_penalty(
        short
    )
    step = bench_disk_tier.mean_of(a, b) | {
        "compute_penalty": 0.5,
        "compute_penalties": [[0.3, 0.2], [1.0, 0.5]],
    }
    bench_disk_tier.pool_penalties(step, a, b)
    assert step["compute_penalties"] == [[pytest.approx(0.25), pytest.approx(0.1)], [1.0, pytest.approx(0.5)]]
    assert step["penalties_measured"]["read_write"]["compute_penalty"] == step["compute_penalties"]
    # the six pipelines' sums: 13.5 s, 6 s of each lane; the disk lane D beside 6 s of compute at ratio r = 6 / D:
    # D + 6 (0.1 + 0.4 (r - 0.25) / 0.75) = 13.5, so D^2 - 13.7 D + 19.2 = 0, D = 12.115, (D - 6) / 6 = 1.019
    # (at one figure, 0.5, it was 0.75)
    assert step["penalties_measured"]["read_write"]["pooled"] == pytest.approx(1.0192, abs=1e-4)
    old = {"penalties_measured": {"read_write": {"penalty": 0.6, "pooled": 0.6, "se": 0.1}}}
    step = {"read_write_penalty": 0.8}
    bench_disk_tier.pool_penalties(step, old, b)  # one without pairs: the mean stands
    assert step == {"read_write_penalty": 0.8}


def test_bench_disk_tier_pairs_autos_choice_with_each_row_round_by_round(monkeypatch):
    """Auto's paired margin: within each round every row over the chosen row, a geometric mean per row over
    the rounds both ran (golden); a round the choice lost (raised) pairs nothing, and an unmeasured choice gives
    None. The rows' median rounds can put the choice far below a row that, round by round, it ties."""
    import math

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    def row(mode, target, budget, speeds):
        return [
            {"mode": mode, "target": target, "budget_bytes": budget, "round": n + 1, "samples_per_s": v}
            if v is not None
            else {"mode": mode, "round": n + 1, "error": "raised"}
            for n, v in enumerate(speeds)
        ]

    k0 = row("hotline_k0_disk", 0.95, 64, [100.0, 130.0, 100.0, None])
    k2 = row("hotline_k2_disk", 0.95, 64, [75.0, 133.0, 130.0, 500.0])
    hybrid = row("hybrid_disk", None, None, [50.0, 65.0, 60.0, 40.0])
    got = bench_disk_tier.paired_margin([hybrid, k0, k2], "hotline_k0_disk", 64)
    assert got["choice"] == "hotline_k0_disk at 95%"
    k2_mean = (0.75 * 133.0 / 130.0 * 1.3) ** (1 / 3)  # round 4 has no K=0 to pair with
    by = {t["configuration"]: t for t in got["rows"]}
    assert by["hotline_k2_disk at 95%"]["mean_over_choice"] == pytest.approx(k2_mean)
    assert by["hotline_k2_disk at 95%"]["draws"] == 3 and by["hybrid_disk"]["lowest"] == pytest.approx(0.5)
    # K=2: 0.997 of K=0 round by round, where the median rounds (100 against 130) put K=0 23% below it
    assert got["fastest"] == "hotline_k0_disk at 95%" and got["margin"] == 0.0
    faster = bench_disk_tier.paired_margin([k0, row("hotline_k2_disk", 0.95, 64, [110.0, 143.0, 110.0])],
                                           "hotline_k0_disk", 64)  # fmt: skip
    assert faster["fastest"] == "hotline_k2_disk at 95%"
    assert faster["margin"] == pytest.approx(1 - 1 / 1.1) and math.isclose(faster["rows"][0]["lowest"], 1.1)
    assert bench_disk_tier.paired_margin([k0, k2], "hotline_k2_disk", 128) is None
