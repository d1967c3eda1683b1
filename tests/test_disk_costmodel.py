"""The disk tier priced: its calibration (random reads, step-shaped reads and write-backs, the probe beside a
run, ``hotline calibrate --disk``) and the cost model's fits and penalties of the I/O beside compute."""

import os

import numpy as np
import pytest

from hotline.cli import main
from hotline.costmodel import STEP_FORMAT

STEP = {"version": STEP_FORMAT, "record_bytes": 256, "rows": [256], "repeats": 1,
        "read": {"fixed_us": 1000.0, "us_per_call": 20.0, "cpu_us_per_call": 5.0},
        "write": {"fixed_us": 500.0, "us_per_call": 25.0, "cpu_us_per_call": 6.0},
        "read_write_penalty": 0.5, "compute_penalty": 0.25}  # fmt: skip
DISK = {"read_iops": {"1": 20_000.0, "depth": 60_000.0}, "write_iops": 40_000.0, "cpu_us_per_read": 5.0,
        "cpu_us_per_write": 5.0, "depth": 32, "seq_write_mbps": 900.0, "step": STEP}  # fmt: skip


def test_cost_model_prices_the_disk_tier():
    """Golden values by hand: 20,000 cold rows of one page each are 20,000 pages, one request each (no two
    neighbours); reads 1 ms + 20 us/request = 401 ms, write-backs 0.5 ms + 25 us/request = 500.5 ms, their CPU
    11 us/request = 220 ms (inside them)."""
    from test_costmodel import HW, W, stats

    from hotline import costmodel as cm

    hw = {**HW, "disk": DISK}
    s = stats(cold=20_000, unique=60_000)
    for mode in ("hybrid", "hotline_k0", "hotline_k1"):
        mem = cm.predict(mode, W, s, hw)
        none = cm.predict(mode, W, s, hw, cm.DiskTier(pages_per_cold_row=0.0))  # no page read: as in memory
        assert none.samples_per_s == pytest.approx(mem.samples_per_s)
        disk = cm.predict(mode, W, s, hw, cm.DiskTier(pages_per_cold_row=1.0))
        assert disk.samples_per_s < mem.samples_per_s
        pages = 60_000 if mode == "hybrid" else 20_000
        assert disk.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * pages)
        assert disk.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * pages)
        assert disk.phases_s["disk_cpu"] == pytest.approx(11e-6 * pages)
        if mode != "hotline_k1":  # sequential: fetch, compute, write-back one after the other (CPU inside)
            assert disk.step_s == pytest.approx(mem.step_s + 1.5e-3 + 45e-6 * pages)
    k1 = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0))
    # the producer's 401 ms of reads beside the writer's 500.5 ms: the longer plus half the shorter
    assert k1.phases_s["lane: disk (reads beside writes)"] == pytest.approx(0.5005 + 0.5 * 0.401)
    shared = k1.phases_s["lane: shared cores"]
    assert shared < 0.7010  # this workload's compute is shorter than the disk's lane
    # that I/O beside the compute on the same cores: the longer plus a quarter of the shorter
    assert k1.phases_s["lane: disk beside compute"] == pytest.approx(0.7010 + 0.25 * shared)
    assert k1.bottleneck == "disk beside compute"
    assert k1.step_s == pytest.approx(0.7010 + 0.25 * shared + HW["host"].get("handover_us", 0.0) * 1e-6)
    # half of the fetched pages read again (write-backs' read-modify-write, stale rows): 10,000 pages at the
    # reads' 20 us/page = 200 ms more on the writer's side; a sequential step reads none again
    again = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, reread_share=0.5))
    assert again.phases_s["disk_reread"] == pytest.approx(0.2)
    assert again.phases_s["lane: disk (reads beside writes)"] == pytest.approx(0.7005 + 0.5 * 0.401)
    seq = cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0, reread_share=0.5))
    assert seq.step_s == pytest.approx(cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0)).step_s)
    # a quarter of the step's pages only stale rows need: the fetch reads 15,000 of the 20,000 pages (1 ms +
    # 300 ms), the write-back still writes all 20,000; a sequential step has no stale rows (the share ignored)
    left = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, reread_share=0.5, skipped_share=0.25))
    assert left.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 15_000)
    assert left.phases_s["disk_write"] == pytest.approx(0.5005) and left.phases_s[
        "disk_reread"
    ] == pytest.approx(0.2)
    assert left.phases_s["lane: disk (reads beside writes)"] == pytest.approx(0.7005 + 0.5 * 0.301)
    seq = cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0, skipped_share=0.25))
    assert seq.phases_s["disk_read"] == pytest.approx(0.401)
    with pytest.raises(ValueError, match="skipped_share"):
        cm.DiskTier(1.0, skipped_share=1.5)
    half = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, cached_share=0.5))  # the DRAM tier serves half
    assert half.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 10_000)
    # neighbouring pages read by one request: 20,000 pages in 15,000 requests, priced per request (reads,
    # write-backs, their CPU and, under look-ahead, the pages read again: their requests alike)
    runs = cm.predict("hotline_k1", W, s, hw, cm.DiskTier(1.0, reread_share=0.5, calls_per_page=0.75))
    assert runs.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 15_000)
    assert runs.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * 15_000)
    assert runs.phases_s["disk_cpu"] == pytest.approx(11e-6 * 15_000)
    assert runs.phases_s["disk_reread"] == pytest.approx(0.5 * 20e-6 * 15_000)
    # a cost per page besides the request's: 20,000 pages at 5 us more on each direction (and the re-reads)
    paged = {**hw, "disk": {**DISK, "step": {**STEP, "read": {**STEP["read"], "us_per_page": 5.0},
                                             "write": {**STEP["write"], "us_per_page": 5.0}}}}  # fmt: skip
    p = cm.predict("hotline_k1", W, s, paged, cm.DiskTier(1.0, reread_share=0.5, calls_per_page=0.75))
    assert p.phases_s["disk_read"] == pytest.approx(1e-3 + 20e-6 * 15_000 + 5e-6 * 20_000)
    assert p.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * 15_000 + 5e-6 * 20_000)
    assert p.phases_s["disk_reread"] == pytest.approx(0.5 * (20e-6 * 15_000 + 5e-6 * 20_000))
    with pytest.raises(ValueError, match=r"calls_per_page must be in \[0, 1\].*got 1.5"):
        cm.DiskTier(1.0, calls_per_page=1.5)
    gpu = {**hw, "link": {"h2d_gbps": 8.0, "d2h_gbps": 8.0}}  # a device of its own: no shared cores
    k1 = cm.predict("hotline_k1", W, s, gpu, cm.DiskTier(1.0))
    assert "lane: disk beside compute" not in k1.phases_s and k1.bottleneck == "disk (reads beside writes)"
    with pytest.raises(ValueError, match="calibrate --disk"):
        cm.predict("hybrid", W, s, HW, cm.DiskTier())
    old = {**hw, "disk": {k: v for k, v in DISK.items() if k != "step"}}  # a calibration from before
    with pytest.raises(ValueError, match="predates step-shaped disk timing.*calibrate --disk DIR` again"):
        cm.predict("hotline_k1", W, s, old, cm.DiskTier())


HELD = {"put": {"fixed_us": 200.0, "us_per_row": 0.5, "cpu_us_per_row": 0.4},
        "sweep": {"us_per_span": 4000.0, "mbps": 500.0}}  # fmt: skip


def test_held_writes_are_priced_as_the_put_and_a_share_of_a_sweep():
    """Golden values by hand, held writes (``--cold-write-buffer``): 20,000 rows written a step into a buffer of
    1,000,000 records of a 10,000,000-record file (256 bytes each: 262,144 records a 64 MiB span, 26,214 held
    ones a span, all but a sliver of the file swept): the put 0.2 ms + 0.5 us/row = 10.2 ms, a sweep of 2.56
    GB at 500 MB/s (each byte read and written) and 38 spans at 4 ms = 5.27 s over the 50 steps that fill the
    buffer, 105 ms a step; the reads and in-place writes as before. A buffer of 0 (or one that a step's rows
    overflow) writes in place as before; a calibration from before held writes prices the sweep at its
    sequential write rate each way and the put as the host's scatter (the write_back phase)."""
    from test_costmodel import HW, W, stats

    from hotline import costmodel as cm
    from hotline.costmodel.phases import sweep_spans

    s = stats(cold=20_000, unique=60_000)
    hw = {**HW, "disk": {**DISK, "step": {**STEP, "held": HELD}}}
    spans, covered = sweep_spans(1_000_000, 10_000_000, 256)
    x = 1_000_000 * 262_144 / 10_000_000
    assert spans == pytest.approx(1_000_000 / (x + 1)) and 38 < spans < 39
    assert covered == pytest.approx(10_000_000 * (x - 1) / (x + 1) + spans) and covered > 0.9999 * 10_000_000
    sweep = spans * 4e-3 + covered * 256 / 500e6
    held = cm.DiskTier(1.0, held_rows=1_000_000, file_rows=10_000_000)
    for mode in ("hybrid", "hotline_k0", "hotline_k1"):
        rows = 60_000 if mode == "hybrid" else 20_000
        place = cm.predict(mode, W, s, hw, cm.DiskTier(1.0))
        got = cm.predict(mode, W, s, hw, held)
        assert got.phases_s["disk_sweep"] == pytest.approx(sweep * rows / 1_000_000)
        assert got.phases_s["disk_write"] == pytest.approx(2e-4 + 0.5e-6 * rows + sweep * rows / 1_000_000)
        assert got.phases_s["disk_read"] == place.phases_s["disk_read"]
        assert got.phases_s["disk_cpu"] == pytest.approx(
            (5.0 + 0.4) * 1e-6 * rows
        )  # the reads' and the put's
        assert place.phases_s["disk_write"] == pytest.approx(0.5e-3 + 25e-6 * rows)  # in place: as before
        assert "disk_sweep" not in place.phases_s
        assert got.samples_per_s > place.samples_per_s
        if mode != "hotline_k1":  # sequential: the sweep's share is inside disk_write, counted once
            assert got.step_s == pytest.approx(
                place.step_s - place.phases_s["disk_write"] + got.phases_s["disk_write"]
            )
    # a step's rows more than the buffer holds: written in place (the store sweeps, then writes in place)
    small = cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0, held_rows=19_999, file_rows=10_000_000))
    assert small.phases_s == cm.predict("hotline_k0", W, s, hw, cm.DiskTier(1.0)).phases_s
    # a buffer of a few records in a large file: nearly a span a record (2.6% of them share one), a sliver swept
    spans, covered = sweep_spans(1000, 10**10, 256)
    assert spans == pytest.approx(1000 / 1.0262144) and covered < 1e-3 * 10**10
    assert sweep_spans(0, 100, 256) == (0.0, 0.0) and sweep_spans(500, 100, 256)[1] <= 100
    # an older calibration (no held figures): the sweep at the sequential write rate (900 MB/s) each way
    old = cm.predict("hotline_k0", W, s, {**HW, "disk": DISK}, held)
    swept = sweep_spans(1_000_000, 10_000_000, 256)[1] * 256 / 450e6
    assert old.phases_s["disk_write"] == pytest.approx(swept * 20_000 / 1_000_000)
    no_rate = {**HW, "disk": {k: v for k, v in DISK.items() if k != "seq_write_mbps"}}
    with pytest.raises(ValueError, match="no sequential write rate.*calibrate --disk DIR` again"):
        cm.predict("hotline_k0", W, s, no_rate, held)
    cm.predict("hotline_k0", W, s, no_rate, cm.DiskTier(1.0))  # in place: not needed
    with pytest.raises(ValueError, match="held_rows and file_rows must be >= 0"):
        cm.DiskTier(1.0, held_rows=-1)


def test_the_expected_sweep_is_what_the_store_sweeps():
    """:func:`sweep_spans` (the spans and records of a sweep, expected of rows spread at random) against the
    exact spans of random draws, as :meth:`HeldRows.sweep` makes them (:func:`swept_spans`), from a few held
    records a span to every record held; and the pricing's span is the store's."""
    import inspect

    from hotline.costmodel.disk_calibrate import swept_spans
    from hotline.costmodel.phases import SWEEP_CHUNK_BYTES, sweep_spans
    from hotline.tiers.held_rows import HeldRows

    assert inspect.signature(HeldRows.sweep).parameters["chunk_bytes"].default == SWEEP_CHUNK_BYTES
    rng = np.random.default_rng(5)
    record, chunk = 4096, SWEEP_CHUNK_BYTES // 4096  # 16,384 records a span: small files, many spans
    for file_rows, held in ((2_000_000, 100), (2_000_000, 2_000), (2_000_000, 20_000), (1_000_000, 300_000),
                            (100_000, 100_000)):  # fmt: skip
        keys = np.sort(rng.choice(file_rows, size=held, replace=False))
        spans, covered = swept_spans(keys, record)
        want_spans, want_covered = sweep_spans(held, file_rows, record)
        assert spans == pytest.approx(want_spans, rel=0.1, abs=2), (file_rows, held)
        assert covered == pytest.approx(want_covered, rel=0.1, abs=chunk), (file_rows, held)
    assert swept_spans(np.array([0, 5, chunk, chunk + 1]), record) == (2, 8)


def test_step_fit_and_penalty():
    """The calibration's fit (medians of each size's timings, then a line) and overlap penalty, on fixed
    timings: 2 ms + 10 us/request with one outlier per size that the median drops, the sizes interleaved as
    the calibration times them (rounds in a random order; a size's requests vary a little from draw to
    draw)."""
    from hotline.costmodel.disk_calibrate import _fit
    from hotline.costmodel.fitting import overlap_penalty as _penalty

    sizes = [1000, 100, 5000, 5000, 1000, 100, 100, 5000, 1000]
    calls = [990, 100, 4990, 5000, 1000, 99, 100, 5010, 1010]
    seconds = [0.5, 0.003, 0.052, 0.052, 0.012, 0.9, 0.003, 0.0, 0.012]
    fit = _fit(calls, seconds, sizes)
    assert fit["fixed_us"] == pytest.approx(2000.0) and fit["us_per_call"] == pytest.approx(10.0)
    assert fit["us_per_page"] == 0.0
    # with the pages each timing read (pairs of neighbouring pages in one request for the odd sizes): 2 ms +
    # 10 us/request + 4 us/page, recovered from the medians of each size
    sizes, calls, pages = [100, 101, 1000, 1001, 5000, 5001] * 2, [100, 50, 1000, 500, 5000, 2500] * 2, [
        100, 100, 1000, 1000, 5000, 5000] * 2  # fmt: skip
    seconds = [2e-3 + 10e-6 * c + 4e-6 * p for c, p in zip(calls, pages)]
    seconds[0] = 9.0  # one outlier: the median of two drops half of it
    seconds[6] = seconds[6] - (9.0 - seconds[6])
    fit = _fit(calls, seconds, sizes, pages)
    assert fit["fixed_us"] == pytest.approx(2000.0, rel=1e-6) and fit["us_per_call"] == pytest.approx(10.0)
    assert fit["us_per_page"] == pytest.approx(4.0)
    assert _penalty(1.0, 1.0, 0.5) == 0.0  # the shorter lane hidden entirely
    assert _penalty(1.5, 1.0, 0.5) == 1.0  # one after the other
    assert _penalty(1.25, 0.5, 1.0) == 0.5 and _penalty(9.0, 1.0, 1.0) == 3.0  # capped


def test_at_probe_scales_the_step_fits():
    """A disk section priced at a probe: each direction's fit scaled by the probe's time over the
    calibration's (golden), the CPU per request and the penalties as calibrated; no probe: unchanged."""
    from hotline.costmodel.disk_calibrate import at_probe

    step = {"read": {"fixed_us": 100.0, "us_per_call": 20.0, "us_per_page": 2.0, "cpu_us_per_call": 25.0},
            "write": {"fixed_us": 50.0, "us_per_call": 30.0, "us_per_page": 0.0, "cpu_us_per_call": 28.0},
            "read_write_penalty": 0.4, "compute_penalty": 0.7,
            "probe": {"rows": 2048, "read_us": 40_000.0, "write_us": 60_000.0}}  # fmt: skip
    disk = {"depth": 32, "step": step}
    got = at_probe(disk, {"rows": 2048, "read_us": 60_000.0, "write_us": 30_000.0})
    assert got["step"]["read"] == {"fixed_us": 150.0, "us_per_call": 30.0, "us_per_page": 3.0,
                                   "cpu_us_per_call": 25.0}  # fmt: skip
    assert got["step"]["write"] == {"fixed_us": 25.0, "us_per_call": 15.0, "us_per_page": 0.0,
                                    "cpu_us_per_call": 28.0}  # fmt: skip
    assert got["step"]["at_probe"] == {"read": 1.5, "write": 0.5} and got["depth"] == 32
    assert got["step"]["compute_penalty"] == 0.7 and got["step"]["probe"] == step["probe"]
    assert disk["step"]["read"]["us_per_call"] == 20.0  # the section given is not changed
    old = {"step": {k: v for k, v in step.items() if k != "probe"}}
    assert at_probe(old, {"read_us": 1.0, "write_us": 1.0}) is old


def test_disk_probe_times_and_cleans_up(tmp_path):
    """The probe beside a run: step-shaped read and write-back times of its rows, on a scratch file in a folder
    of its own that close removes (a user's file of the scratch file's name untouched)."""
    from hotline.costmodel.disk_calibrate import PROBE_ROWS, DiskProbe

    mine = tmp_path / "hotline-disk-calibration-step.bin"
    mine.write_text("user data")
    with DiskProbe(tmp_path, 256, depth=4, file_bytes=4 << 20) as probe:
        assert len(list(tmp_path.glob(".hotline-disk-calibration*"))) == 1
        got = probe(repeats=2)
    assert got["rows"] == PROBE_ROWS and got["read_us"] > 0 and got["write_us"] > 0
    assert not list(tmp_path.glob(".hotline-disk-calibration*")) and mine.read_text() == "user data"


def test_disk_probe_closes_its_file_when_writing_it_fails(tmp_path, monkeypatch):
    """An I/O error while the scratch file is written whole (before any timing): one OSError, and the file's
    descriptors and its folder are gone (a calibration or probe that fails leaks nothing)."""
    import errno

    from hotline.costmodel.disk_calibrate import DiskProbe

    real = os.pwrite

    def failing(
        fd, data, offset
    ):  # the scratch file's 1 MiB sequential chunks; nothing else writes by pwrite
        if len(data) == 1 << 20 and offset >= 2 << 20:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, data, offset)

    def fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    before = fds()
    monkeypatch.setattr(os, "pwrite", failing)
    with pytest.raises(OSError, match="Input/output error"):
        DiskProbe(tmp_path, 256, depth=4, file_bytes=4 << 20)
    monkeypatch.undo()
    assert fds() <= before and not list(tmp_path.glob(".hotline-disk-calibration*"))


def test_calibrate_disk_cli(tmp_path, capsys):
    out = tmp_path / "hw.json"
    out.write_text('{"format": "hotline-hardware", "host": {"x": 1}}')
    # the user's files named as the calibration's scratch files were: never opened, refused or removed
    mine = {tmp_path / n: f"user data {n}" for n in ("hotline-disk-calibration.bin",
                                                     "hotline-disk-calibration-step.bin")}  # fmt: skip
    for p, text in mine.items():
        p.write_text(text)
    assert (
        main(
            [
                "calibrate",
                "--out",
                str(out),
                "--disk",
                str(tmp_path),
                "--disk-only",
                "--disk-depth",
                "4",
                "--disk-record-bytes",
                "128",
            ]
        )  # fmt: skip
        == 0
    )
    import json

    hw = json.loads(out.read_text())
    d = hw["disk"]
    assert hw["host"] == {"x": 1}  # what the file held stays
    assert d["depth"] == 4 and d["io_mode"] in ("direct",) or d["io_mode"].startswith("buffered")
    for v in (d["read_iops"]["1"], d["read_iops"]["depth"], d["write_iops"], d["seq_write_mbps"]):
        assert v > 0
    t = d["step"]  # the step-shaped figures the cost model prices, at the record asked for
    assert t["version"] == STEP_FORMAT and t["record_bytes"] == 128 and t["rows"] and t["repeats"] >= 1
    for k in ("read", "write"):
        assert t[k]["fixed_us"] >= 0 and t[k]["us_per_call"] >= 0 and t[k]["cpu_us_per_call"] >= 0
        assert t[k]["us_per_call"] + t[k]["us_per_page"] > 0
    assert 0 <= t["read_write_penalty"] <= 3 and 0 <= t["compute_penalty"] <= 3
    for name in ("read_write", "compute"):  # what was measured beside what is priced
        got = t["penalties_measured"][name]
        assert got["penalty"] == t[f"{name}_penalty"] and got["se"] >= 0 and 0 <= got["pooled"] <= 3
    # the I/O beside compute timed twice: a compute as long as the I/O (priced alone before) and a quarter as long,
    # each a point (the lanes' ratio as timed, the penalty priced) of what the model interpolates
    (r_short, p_short), (r_long, p_long) = t["compute_penalties"]
    assert 0 < r_short < r_long <= 1 and r_short < 0.6 and p_long == t["compute_penalty"]
    assert p_short == t["penalties_measured"]["compute_at_0.25"]["penalty"] and 0 <= p_short <= 3
    # fitted to timed look-ahead pipelines at the priced compute's penalties
    piped = t["penalties_measured"]["read_write"]
    assert len(piped["pairs"]) >= 2 and all(len(p) == 4 and min(p) > 0 for p in piped["pairs"])
    assert piped["compute_penalty"] == t["compute_penalties"]
    pair = t["penalties_measured"]["read_write_pair"]  # the two-thread pair, kept for the record
    assert len(pair["pairs"]) >= 3 and all(len(p) == 3 for p in pair["pairs"]) and 0 <= pair["pooled"] <= 3
    json.dumps(t, allow_nan=False)  # plain JSON: no Infinity or NaN
    assert t["probe"]["rows"] == 2048 and t["probe"]["read_us"] > 0 and t["probe"]["write_us"] > 0
    # the write-back as the store runs it, writes held (the put), and its sweeps (a span's cost, the bytes a second)
    put, sweep = t["held"]["put"], t["held"]["sweep"]
    assert put["fixed_us"] >= 0 and put["us_per_row"] >= 0 and put["cpu_us_per_row"] > 0
    assert put["fixed_us"] + put["us_per_row"] > 0 and sweep["mbps"] > 0 and sweep["us_per_span"] >= 0
    assert len(sweep["timed"]) == 1 + t["repeats"] and all(s > 0 and c >= s for s, c, _ in sweep["timed"])
    # every row written while timed held: no sweep among the puts
    assert t["held"]["buffer_rows"] >= min((4 << 20) // 128, (1 + t["repeats"]) * sum(t["rows"]))
    printed = capsys.readouterr().out
    assert "random 4 KiB reads" in printed and "a step's I/O (128-byte records)" in printed
    assert f"of the I/O beside compute {p_short:.2f} with the compute {r_short:.2f} of the I/O, " in printed
    assert (
        f"held writes: put {put['fixed_us'] / 1e3:,.2f} ms + {put['us_per_row']:,.2f} us/row; sweep "
        in printed
    )
    assert not list(tmp_path.glob(".hotline-disk-calibration*"))  # its scratch folder is gone
    assert {p: p.read_text() for p in mine} == mine
    assert main(["calibrate", "--out", str(out), "--disk-only"]) == 2
    assert main(["calibrate", "--out", str(out), "--disk", str(tmp_path), "--disk-only",
                 "--disk-record-bytes", "6"]) == 2  # not whole floats  # fmt: skip
    assert "--disk-record-bytes must be a positive multiple of 4, got 6" in capsys.readouterr().err


def test_pooled_penalty_credits_only_the_overlap_its_timings_show():
    """Golden: pooled over pairs (sums, not a vote of each pair); a gain within the pairs' noise is priced as
    none (1); a clear gain, and a loss (worse than one after the other), as measured."""
    from hotline.costmodel.fitting import pooled_penalty

    clear = [(1.5, 1.0, 1.0), (1.52, 1.0, 1.0), (1.48, 1.0, 1.0), (1.5, 1.0, 1.0), (1.5, 1.0, 1.0)]
    got = pooled_penalty(clear)
    assert got["pooled"] == pytest.approx(0.5) and got["penalty"] == got["pooled"] and got["se"] < 0.02
    # pairs as spread as timings on a shared 2-core VM (0.3-1.45 each): pooled 0.8, but not beyond the noise
    noisy = [(1.3, 1.0, 1.0), (2.0, 1.0, 1.0), (1.9, 1.0, 1.0), (1.35, 1.0, 1.0), (2.45, 1.0, 1.0)]
    got = pooled_penalty(noisy)
    assert (
        got["pooled"] == pytest.approx(0.8) and got["pooled"] + 2 * got["se"] >= 1 and got["penalty"] == 1.0
    )
    worse = [(2.2, 1.0, 1.0), (2.3, 1.0, 1.0), (2.1, 1.0, 1.0)]
    assert pooled_penalty(worse)["penalty"] == pytest.approx(1.2)
    # unequal lanes pool by sums: (3.0 + 1.2 - 2.0 - 1.0) / (1.0 + 0.2) = 1.0
    assert pooled_penalty([(3.0, 2.0, 1.0), (1.2, 0.2, 1.0)])["pooled"] == pytest.approx(1.0)
    assert pooled_penalty([])["penalty"] == 1.0  # nothing timed shows no gain: priced as none
    one = pooled_penalty([(1.5, 1.0, 1.0)])  # one pair shows nothing beyond its noise, which it cannot tell
    assert one["penalty"] == 1.0 and one["pooled"] == pytest.approx(0.5) and one["se"] is None


def test_pipeline_penalty_is_the_read_write_penalty_that_prices_the_timed_pipeline():
    """Reads beside write-backs are priced with the penalty at which the cost model's look-ahead step (the disk
    lane, reads beside write-backs, and that beside the compute) takes what the timed pipeline took (golden,
    each branch), and the model's own step at the fitted penalty gives the timing back (property)."""
    import numpy as np

    from hotline.costmodel.disk_overlap import _read_write_fit, pipeline_penalty
    from hotline.costmodel.phases import overlapped

    # the disk lane the longer: 2.0 = disk + 0.5 * 1.0, disk = 1.5 = 1.0 + p * 1.0
    assert _read_write_fit(2.0, 1.0, 1.0, 1.0, 0.5) == pytest.approx(0.5)
    # the compute the longer: 4.5 = 4.0 + 0.5 * disk, disk = 1.0 = 1.0 + p * 0.5
    assert _read_write_fit(4.5, 1.0, 4.0, 0.5, 0.5) == pytest.approx(0.0)
    assert _read_write_fit(4.4, 1.0, 4.0, 0.5, 0.5) == 0.0  # faster than the lanes allow: clipped
    # any disk lane up to 4 s gives that step: the largest, clipped
    assert _read_write_fit(4.0, 1.0, 4.0, 0.5, 0.0) == pytest.approx(3.0)
    assert _read_write_fit(9.0, 1.0, 1.0, 1.0, 1.0) == 3.0
    rng = np.random.default_rng(3)
    for _ in range(200):
        r, c, w = rng.uniform(0.1, 2.0, 3)
        p_rw, p_c = rng.uniform(0.0, 1.5, 2)
        together = overlapped(overlapped(r, w, p_rw), c, p_c)
        got = _read_write_fit(together, r, c, w, p_c)
        assert overlapped(overlapped(r, w, got), c, p_c) == pytest.approx(together)
        if p_c > 0 and overlapped(r, w, p_rw) != c:
            assert got == pytest.approx(p_rw)
    tight = [(2.0, 1.0, 1.0, 1.0), (2.04, 1.0, 1.0, 1.0), (1.96, 1.0, 1.0, 1.0)]
    got = pipeline_penalty(tight, 0.5)
    assert got["penalty"] == got["pooled"] == pytest.approx(0.5)
    assert got["se"] == pytest.approx(0.0231, abs=1e-4)
    assert got["pairs"] == [list(t) for t in tight] and got["compute_penalty"] == 0.5
    noisy = [(1.6, 1.0, 1.0, 1.0), (2.4, 1.0, 1.0, 1.0)]  # 0.1 and 0.9: a gain within the noise
    got = pipeline_penalty(noisy, 0.5)
    assert got["pooled"] == pytest.approx(0.5) and got["penalty"] == 1.0
    assert pipeline_penalty([], 0.5)["penalty"] == 1.0
    assert pipeline_penalty([(2.0, 1.0, 1.0, 1.0)], 0.5)["penalty"] == 1.0  # one pair: no noise known


def _piped(read: float, compute: float, write: float, p_rw: float, curve: list) -> float:
    """The cost model's look-ahead step of a disk lane (reads beside writes at ``p_rw``) beside the compute, at
    the penalty ``curve`` gives their ratio."""
    from hotline.costmodel.phases import overlapped, penalty_at

    disk = overlapped(read, write, p_rw)
    return overlapped(disk, compute, penalty_at(curve, min(disk, compute) / max(disk, compute)))


def test_the_io_beside_compute_is_priced_by_the_lanes_ratio():
    """Timed at two compute lengths, the I/O beside compute is priced at the lanes' ratio: linear between the two
    points, the nearer one's beyond them (golden); the pipeline's fit and the cost model's look-ahead step price
    with the same points, and one figure (an older calibration) prices every ratio alike."""
    from hotline.costmodel.disk_overlap import _lane_ratio, _read_write_fit, pipeline_penalty
    from hotline.costmodel.phases import beside, penalty_at

    points = [[0.25, 0.1], [1.0, 0.85]]
    assert penalty_at(points, 0.25) == pytest.approx(0.1) and penalty_at(points, 1.0) == pytest.approx(0.85)
    assert penalty_at(points, 0.5) == pytest.approx(0.35)  # 0.1 + 0.75 * (0.25 / 0.75)
    assert penalty_at(points, 0.1) == pytest.approx(0.1)  # below the shorter compute timed: its penalty
    assert penalty_at(points[::-1], 0.7) == pytest.approx(0.55)  # the points in any order
    assert penalty_at(0.69, 0.1) == penalty_at(0.69, 1.0) == 0.69
    # a point rising faster than the ratio is taken at that bound, one below the point before at its level
    assert penalty_at([[0.25, 0.0], [0.5, 0.9]], 0.5) == pytest.approx(0.25)
    assert penalty_at([[0.25, 0.4], [1.0, 0.1]], 1.0) == pytest.approx(0.4)
    assert _lane_ratio([(1.2, 1.0, 0.2), (1.1, 1.0, 0.3)]) == pytest.approx(0.25)  # 0.5 s beside 2 s
    # the cost model: 200 ms of I/O beside 40 ms of compute (ratio 0.2: 0.1 of it), and beside 150 ms (0.75: 0.6)
    assert beside(0.2, 0.04, {"compute_penalty": 0.85, "compute_penalties": points}) == pytest.approx(0.204)
    assert beside(0.15, 0.2, {"compute_penalty": 0.85, "compute_penalties": points}) == pytest.approx(0.29)
    assert beside(0.2, 0.04, {"compute_penalty": 0.85}) == pytest.approx(0.234)
    # the fit: a disk lane of 2 s (1 s of reads, 1 s of writes at 1.0) beside 1 s of compute (ratio 0.5: 0.35)
    assert _read_write_fit(2.35, 1.0, 1.0, 1.0, points) == pytest.approx(1.0)
    rng = np.random.default_rng(4)
    for _ in range(200):  # the fitted penalty gives back the pipelined seconds through the model's own step
        r, c, w = rng.uniform(0.1, 2.0, 3)
        p_rw = rng.uniform(0.0, 1.5)
        curve = sorted(
            [[rng.uniform(0.05, 0.5), rng.uniform(0.0, 0.5)], [rng.uniform(0.6, 1.0), rng.uniform(0.3, 1.2)]]
        )

        got = _read_write_fit(_piped(r, c, w, p_rw, curve), r, c, w, curve)
        assert _piped(r, c, w, got, curve) == pytest.approx(_piped(r, c, w, p_rw, curve), rel=1e-9)
    got = pipeline_penalty([(2.35, 1.0, 1.0, 1.0), (2.35, 1.0, 1.0, 1.0)], points)
    assert got["pooled"] == pytest.approx(1.0) and got["compute_penalty"] == points
