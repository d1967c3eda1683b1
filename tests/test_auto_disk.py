"""``--mode auto`` and the disk cold store: golden choices priced with a fixed disk section, the disk's timing
kept once per filesystem, ``hotline train --cold-store disk`` choosing on a tiny dataset, and tables the
memory store cannot hold refused before any long work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_auto import BUDGETS, CPU, GIB, GPU, W, skewed
from test_disk_costmodel import DISK

from hotline import costmodel as cm
from hotline.costmodel import STEP_FORMAT
from hotline.costmodel.choose import ColdDisk, choose

CPU_DISK = {**CPU, "name": "test CPU with a disk", "disk": DISK}
GPU_DISK = {**GPU, "disk": DISK}
COLD = ColdDisk("cold")
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]


def smooth(budget: int) -> cm.Stats:
    """A coverage curve defined at every budget (the DRAM tier prices the budget plus its bytes)."""
    coverage = 1.0 - math.exp(-budget / (2 * GIB))
    return cm.Stats(coverage, coverage**26, 60_000 * (1 - coverage) + 50, 60_000)


def kind(c) -> str:
    """The cost model's mode of a candidate."""
    return c.mode if c.mode != "hotline" else ("hotline_k1" if c.lookahead else "hotline_k0")


def test_tables_larger_than_memory_train_from_disk():
    """500 GiB of tables on a CPU with 16 GiB: the memory store cannot hold them (one line naming the flags);
    with the disk store the fastest disk-priced configuration is chosen and the reason names the disk."""
    with pytest.raises(
        ValueError, match=r"exceed this machine's memory \(16 GiB\).*--cold-store disk --cold-dir DIR"
    ):
        choose(500 * GIB, 16 * GIB, CPU, W, skewed, BUDGETS)
    c = choose(500 * GIB, 16 * GIB, CPU_DISK, W, skewed, BUDGETS, disk=COLD)
    # golden: 16 GiB and 64 GiB do not fit 80% of 16 GiB; 4 GiB with look-ahead is the fastest
    assert (c.mode, c.lookahead, c.hbm_budget) == ("hotline", 2, 4 * GIB)
    assert c.reason.startswith("cold rows on disk in cold (1 page of 4 KiB read per cold row")
    assert "do not fit in" in c.reason and "device mode" not in c.reason  # nor would they fit the device
    assert c.cold_store == "disk" and c.cold_dir == "cold"
    # the prediction is the cost model's with the disk tier: a 256-byte record (dim 64, SGD) is one page
    want = cm.predict("hotline_k1", W, skewed(4 * GIB), CPU_DISK, cm.DiskTier(pages_per_cold_row=1.0))
    assert c.predicted_samples_per_s == pytest.approx(want.samples_per_s)
    assert c.predicted_samples_per_s < cm.predict("hotline_k1", W, skewed(4 * GIB), CPU).samples_per_s
    assert "lane: disk beside compute" in c.candidates[0].prediction.phases_s  # the disk lanes priced
    rec = c.record(measured_samples_per_s=100.0)
    assert rec["cold_store"] == "disk" and rec["cold_dir"] == "cold" and rec["disk_pages_per_cold_row"] == 1.0
    assert (
        rec["measured_samples_per_s"] == 100.0 and rec["predicted_samples_per_s"] == c.predicted_samples_per_s
    )


def test_the_disk_store_given_prices_every_candidate_with_the_disk():
    """tables that fit: on a CPU device mode is not considered (its memory is the host memory the disk store
    keeps the rows out of), every candidate is priced with the disk; on a GPU that holds them, device mode,
    the disk store unused."""
    c = choose(2 * GIB, 16 * GIB, CPU_DISK, W, skewed, BUDGETS, disk=COLD)
    assert all(x.mode != "device" for x in c.candidates)
    assert all(x.disk == cm.DiskTier(1.0, 0.0) for x in c.candidates)
    for x in c.candidates:  # each one the model's disk prediction of its own stats
        s = skewed(x.hbm_budget or 0)
        assert x.prediction.samples_per_s == pytest.approx(
            cm.predict(kind(x), W, s, CPU_DISK, cm.DiskTier(1.0)).samples_per_s
        )
    assert "device mode not considered: on this CPU" in c.reason
    mem = choose(2 * GIB, 16 * GIB, CPU, W, skewed, BUDGETS)
    assert mem.mode == "device" and mem.cold_store == "memory" and "disk" not in mem.reason
    gpu = choose(40 * GIB, 80 * GIB, GPU_DISK, W, skewed, BUDGETS, disk=COLD)
    assert gpu.mode == "device" and "--cold-store disk (cold) is not used: no row is cold" in gpu.reason
    from hotline.costmodel.auto import choice_fields

    assert choice_fields(gpu) == {"mode": "device", "lookahead": 0, "hbm_budget": None, "cold_store": "memory",
                                  "cold_dir": None, "cold_cache": 0}  # fmt: skip
    big = choose(500 * GIB, 48 * GIB, GPU_DISK, W, skewed, BUDGETS, disk=COLD)
    assert big.mode == "hotline" and big.reason.startswith("cold rows on disk in cold")
    assert choice_fields(big)["mode"] == "hotline" and "cold_store" not in choice_fields(big)
    with pytest.raises(ValueError, match="no disk section.*calibrate --disk DIR"):
        choose(2 * GIB, 16 * GIB, CPU, W, skewed, BUDGETS, disk=COLD)
    with pytest.raises(ValueError, match="cache_bytes >= 0"):
        ColdDisk("cold", -1)


def test_the_dram_tier_serves_the_next_rows_by_popularity():
    """``--cold-cache C``: the DRAM tier holds the C bytes of rows after the hot ones by popularity, so the
    share of a step's cold rows it serves is what a hot budget C larger would make hot."""
    dram = ColdDisk("cold", cache_bytes=GIB)
    c = choose(500 * GIB, 16 * GIB, CPU_DISK, W, smooth, [GIB, 2 * GIB], disk=dram)
    hybrid = next(x for x in c.candidates if x.mode == "hybrid")
    assert hybrid.disk.cached_share == pytest.approx(1 - smooth(GIB).cold_rows_per_batch / 60_000)
    for x in (x for x in c.candidates if x.mode == "hotline"):
        b = x.hbm_budget
        share = 1 - smooth(b + GIB).cold_rows_per_batch / smooth(b).cold_rows_per_batch
        assert x.disk.cached_share == pytest.approx(share) and 0 < share < 1
        tier = cm.DiskTier(1.0, cached_share=share)
        assert x.prediction.samples_per_s == pytest.approx(
            cm.predict(kind(x), W, smooth(b), CPU_DISK, tier).samples_per_s
        )
    assert f"its DRAM tier (1 GiB) serving {c.candidates[0].disk.cached_share:.0%} of them" in c.reason
    none = choose(500 * GIB, 16 * GIB, CPU_DISK, W, smooth, [GIB, 2 * GIB], disk=COLD)
    assert c.predicted_samples_per_s > none.predicted_samples_per_s  # fewer pages read per step


def test_held_writes_price_every_disk_candidate():
    """``--cold-write-buffer``: every disk candidate is priced with the writes held (the buffer's records, by
    :func:`hotline.kernels.held_rows.sized`, in a file of the tables' rows), each the cost model's prediction
    of that tier; the choice is one of them and the reason says so. 8 GiB of tables: faster than with writes
    in place; 500 GiB: slower (a 256 MiB buffer's sweep reads and writes the whole file, 2,000 times the
    buffer's bytes)."""
    from test_disk_costmodel import HELD

    from hotline.kernels.held_rows import sized

    hw = {**CPU_DISK, "disk": {**DISK, "step": {**DISK["step"], "held": HELD}}}
    held = ColdDisk("cold", held_bytes=256 << 20)
    rows = sized(256 << 20, 256)[1]
    for tables, faster in ((8 * GIB, True), (500 * GIB, False)):
        c = choose(tables, 4 * GIB, hw, W, skewed, BUDGETS, disk=held)
        assert rows > 0 and {(x.disk.held_rows, x.disk.file_rows) for x in c.candidates} == {
            (rows, tables // 256)
        }
        for x in c.candidates:
            want = cm.predict(kind(x), W, skewed(x.hbm_budget or 0), hw, x.disk)
            assert x.prediction.samples_per_s == pytest.approx(want.samples_per_s)
            assert x.prediction.phases_s["disk_sweep"] > 0
        best = max(x.prediction.samples_per_s for x in c.candidates)
        assert (
            c.candidates[0].prediction.samples_per_s >= (1 - 0.1) * best
        )  # the fastest, or one within a tie
        place = choose(tables, 4 * GIB, hw, W, skewed, BUDGETS, disk=COLD)
        assert all(
            x.disk.held_rows == 0 and "disk_sweep" not in x.prediction.phases_s for x in place.candidates
        )
        assert (c.predicted_samples_per_s > place.predicted_samples_per_s) == faster, tables
        assert "written rows held in 256 MiB and swept to the file in order" in c.reason
        assert "held" not in place.reason and c.record()["disk_held_rows"] == rows
    with pytest.raises(ValueError, match="held_bytes >= 0"):
        ColdDisk("cold", held_bytes=-1)


def test_auto_prices_the_runs_write_buffer(tmp_path):
    """A run's ``--cold-write-buffer`` (auto: an eighth of the rows and state) is what auto prices; 0: in place."""
    from dataclasses import replace

    from hotline import TrainConfig
    from hotline.costmodel.auto import choose_for_run
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.kernels.held_rows import sized
    from hotline.profiling.profiler import profile
    from hotline.tiers.held_rows import write_buffer_bytes

    data = Dataset(
        generate(tmp_path / "ds", 2000, seed=2, table_sizes=[40, 300, 50000], zipf=1.2, progress=False)
    )
    (tmp_path / "cold").mkdir()
    cfg = TrainConfig(mode="auto", embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1], progress=False,
                      cold_store="disk", cold_dir=str(tmp_path / "cold"))  # fmt: skip
    prof = profile(data, embedding_dim=8, mini_batch_size=cfg.mini_batch_size, progress=False)
    c = choose_for_run(cfg, data, CPU_DISK, prof=prof, available=1 << 40)
    rows = sized(write_buffer_bytes(cfg, data.total_rows), 36)[1]  # dim 8 and row-wise Adagrad: 36 bytes
    assert rows > 0 and {x.disk.held_rows for x in c.candidates} == {rows}
    # on 4 ranks each holds a quarter of the rows and the buffer auto gives a quarter of them (an eighth of its
    # rows and state), not the buffer of the whole table
    four = choose_for_run(cfg, data, CPU_DISK, prof=prof, available=1 << 40, ranks=4)
    quarter = sized(write_buffer_bytes(cfg, data.total_rows, 4), 36)[1]
    assert 0 < quarter < rows and {x.disk.held_rows for x in four.candidates} == {quarter}
    zero = choose_for_run(replace(cfg, cold_write_buffer=0), data, CPU_DISK, prof=prof, available=1 << 40)
    assert {x.disk.held_rows for x in zero.candidates} == {0}


# -- the disk's timing, kept once per filesystem ---------------------------------------------------------
def test_the_disk_is_timed_once_per_filesystem_and_record(tmp_path, monkeypatch):
    """The first run times the disk of the cold dir (said once, on scratch files in a directory of its own,
    removed: the user's files stay as they were) and keeps the figures in the cache; the next reads them."""
    from hotline.costmodel.machine import disk_hardware, disk_hardware_path, filesystem_of

    monkeypatch.setenv("HOTLINE_CACHE", str(tmp_path / "cache"))
    cold = tmp_path / "cold"
    cold.mkdir()
    (cold / "notes.txt").write_text("mine")
    (cold / "hotline-disk-calibration.bin").write_text("also mine")  # the calibration's own scratch name
    said: list[str] = []
    d = disk_hardware(cold, 256, depth=4, say=said.append, file_bytes=4 << 20, repeats=1)
    assert len(said) == 1 and said[0].startswith(f"timing the disk of {cold} once for --mode auto (")
    assert "256-byte records, depth 4" in said[0]
    assert sorted(p.name for p in cold.iterdir()) == ["hotline-disk-calibration.bin", "notes.txt"]
    assert (cold / "hotline-disk-calibration.bin").read_text() == "also mine"
    assert d["step"]["version"] == STEP_FORMAT and d["step"]["record_bytes"] == 256 and d["path"] == str(cold)
    path = disk_hardware_path(cold, 256, 4)
    assert path.parent == tmp_path / "cache" and json.loads(path.read_text()) == d
    assert disk_hardware(cold, 256, depth=4, say=said.append) == d and len(said) == 1  # read back
    # the same filesystem, another directory on it: the same figures; another record or depth: timed anew
    (tmp_path / "other").mkdir()
    assert filesystem_of(tmp_path / "other") == filesystem_of(cold)
    assert disk_hardware_path(tmp_path / "other", 256, 4) == path
    assert disk_hardware_path(cold, 1540, 4) != path and disk_hardware_path(cold, 256, 32) != path
    assert "compute_penalties" in d["step"]  # the I/O beside compute at each length timed
    # a timing kept before the I/O beside compute was timed at these lengths is not read: timed anew
    import hotline.costmodel.disk_overlap as dc

    with monkeypatch.context() as m:
        m.setattr(dc, "BESIDE_SHARES", (1.0,))
        assert disk_hardware_path(cold, 256, 4) != path
    with pytest.raises(
        ValueError, match=r"could not time the disk of --cold-dir .*missing.*--hardware FILE"
    ) as e:
        disk_hardware(tmp_path / "missing", 256, depth=2, say=said.append, file_bytes=4 << 20, repeats=1)
    assert f"--disk {tmp_path}" not in str(
        e.value
    )  # names the flag the user passed, not `hotline calibrate`'s
    # a timing kept from before held writes were timed: timed again (it prices them), and kept
    kept = json.loads(path.read_text())
    del kept["step"]["held"]
    path.write_text(json.dumps(kept))
    again = disk_hardware(cold, 256, depth=4, say=said.append, file_bytes=4 << 20, repeats=1)
    assert said[-1].startswith("timing the disk of") and "held" in again["step"]
    assert json.loads(path.read_text()) == again


# -- hotline train --cold-store disk with --mode auto ---------------------------------------------------
def _choice(err: str) -> tuple[str, str]:
    """The choice ``hotline train`` printed, as its two paragraphs (each wrapped to 100 columns): the choice,
    and the reason (from ``  because``)."""
    lines = err[err.index("--mode auto:") :].splitlines()
    end = next((i for i, x in enumerate(lines[1:], 1) if not x.startswith("  ")), len(lines))
    at = next(i for i in range(end) if lines[i].startswith("  because "))
    return " ".join(x.strip() for x in lines[:at]), "  " + " ".join(x.strip() for x in lines[at:end])


def test_train_with_the_disk_store_chooses_with_the_disk_and_records_it(tmp_path, capsys):
    from hotline.cli import main
    from hotline.datasets.synthetic import generate

    ds = generate(tmp_path / "ds", 2000, seed=2, table_sizes=[40, 300, 5000], zipf=1.2, progress=False)
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({**CPU_DISK, "format": "hotline-hardware"}))
    cold = tmp_path / "cold"
    cold.mkdir()
    argv = ["train", str(ds), *ARCH, "--num-batches", "3", "--no-progress", "--hardware", str(hw)]
    assert main([*argv, "--cold-store", "disk", "--cold-dir", str(cold)]) == 0
    out, err = capsys.readouterr()
    first, because = _choice(err)
    assert "on test CPU with a disk" in first and "samples/s" in first
    assert because.startswith(f"  because cold rows on disk in {cold} (1 page of 4 KiB read per cold row")
    assert "device mode not considered" in because
    assert "timing the disk" not in err  # --hardware has a disk section: used as is
    record = json.loads(out.strip().splitlines()[-1])
    auto = record["auto"]
    assert record["mode"] == auto["mode"] in ("hybrid", "hotline")
    assert auto["cold_store"] == "disk" and auto["cold_dir"] == str(cold)
    assert auto["measured_samples_per_s"] == record["samples_per_s"] and auto["predicted_samples_per_s"] > 0
    assert f"cold store {cold}/hotline-cold-rows.bin" in err  # the run kept its cold rows there
    # the memory store: priced without the disk, and recorded so
    assert main(argv) == 0
    out, err = capsys.readouterr()
    auto = json.loads(out.strip().splitlines()[-1])["auto"]
    assert auto["cold_store"] == "memory" and auto["cold_dir"] is None and "on disk" not in err
    # the Python API alike: TrainConfig(mode="auto", cold_store="disk") is priced with the disk
    from hotline import TrainConfig
    from hotline.costmodel.auto import choose_for_run

    cfg = TrainConfig(mode="auto", embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1], progress=False,
                      cold_store="disk", cold_dir=str(cold))  # fmt: skip
    c = choose_for_run(cfg, ds, str(hw))
    assert c.cold_store == "disk" and all(x.disk is not None for x in c.candidates)
    with pytest.raises(ValueError, match="not --mode device"):
        TrainConfig(mode="device", cold_store="disk", cold_dir=str(cold))


# -- tables the memory store cannot hold ----------------------------------------------------------------
def _dataset(path, sizes):
    """A few hundred samples over tables of ``sizes`` rows, never allocated (the ids are written, not the
    tables)."""
    from hotline.datasets.format import Dataset, DatasetWriter

    rng = np.random.default_rng(0)
    with DatasetWriter(path, sizes) as w:
        for name, n in (("train", 256), ("val", 64), ("test", 64)):
            dense, sparse, labels = w.create_split(name, n)
            dense[:] = rng.random(dense.shape, np.float32)
            sparse[:] = rng.integers(0, min(sizes), sparse.shape)
            labels[:] = rng.integers(0, 2, n)
        w.finish(source={"kind": "test", "seed": 0})
    return Dataset(path)


def test_check_memory_names_the_tables_the_memory_and_the_flags(tmp_path):
    """The figure checked is MemAvailable (what a run can get now without swapping), less a margin for what
    the up-front count leaves out."""
    from hotline import TrainConfig
    from hotline.training.preflight import (
        MEMORY_HEADROOM,
        MEMORY_MARGIN,
        MemoryShortfall,
        check_memory,
        memory_needed,
        usable_memory,
    )

    tables = _dataset(tmp_path / "ten-million", [10_000_000])  # 2.38 GiB at dim 64 with SGD
    arch = {"embedding_dim": 64, "bottom_mlp": [13, 64], "top_mlp": [64, 1], "mini_batch_size": 128}
    hybrid = TrainConfig(mode="hybrid", **arch)
    need = memory_needed(hybrid, tables)
    check_memory(hybrid, tables, available=2 * need + MEMORY_HEADROOM)
    assert usable_memory(need) < need  # available just what it needs: refused, the margin not left
    with pytest.raises(MemoryShortfall) as e:
        check_memory(hybrid, tables, available=need)
    line = str(e.value)
    assert "\n" not in line and "2.38 GiB of embedding rows and optimizer state" in line  # 10M x 256 bytes
    assert f"MemAvailable, less {MEMORY_MARGIN:.0%}" in line
    assert "keep the cold rows on disk with --cold-store disk --cold-dir DIR (DIR on local disk)" in line
    assert isinstance(e.value, MemoryError) and isinstance(e.value, ValueError)  # one line in the CLI
    with pytest.raises(
        MemoryShortfall, match=r"--cold-store disk --cold-dir DIR \(--mode hybrid or hotline\)"
    ):
        check_memory(TrainConfig(mode="device", **arch), tables, available=need)
    disk = TrainConfig(mode="hybrid", cold_store="disk", cold_dir=".", cold_cache=4 * GIB, **arch)
    with pytest.raises(MemoryShortfall, match="the rows are on disk.*smaller --cold-cache"):
        check_memory(disk, tables, available=need)


@pytest.mark.parametrize("mode", [[], ["--mode", "hybrid"], ["--mode", "hotline", "--hbm-budget", "1MiB"]])
def test_tables_larger_than_memory_are_refused_before_profiling(tmp_path, capsys, mode):
    """Three tables of 2**31 - 1 rows with the memory store: one line naming the bytes, the memory and the flags, exit 2,
    before the profiling (which would count every row) and before any allocation."""
    from hotline.cli import main

    ds = _dataset(tmp_path / "huge", [2**31 - 1] * 3).path  # 1.5 TiB of rows at dim 64
    arch = ["--arch-sparse-feature-size", "64", "--arch-mlp-bot", "13-16-64", "--arch-mlp-top", "16-1"]
    assert main(["train", str(ds), *arch, "--num-batches", "2", "--no-progress", *mode]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hotline train: error: this run needs about 1.5 TiB")
    assert (
        "1.5 TiB of embedding rows and optimizer state" in lines[0] and "available (MemAvailable" in lines[0]
    )
    assert "--cold-store disk --cold-dir DIR" in lines[0] and out == ""


def test_bench_disk_tier_prints_autos_choice_from_its_calibration(tmp_path, monkeypatch, capsys):
    """The benchmark prices ``--mode auto`` with the hardware it prices its rows with (here a fixed one): the
    choice is one of its measured rows, with its margin to the fastest disk row."""
    import numba
    import torch

    monkeypatch.syspath_prepend(
        str(__import__("pathlib").Path(__file__).resolve().parent.parent / "benchmarks")
    )
    import bench_disk_tier

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({**CPU_DISK, "format": "hotline-hardware"}))
    threads = (torch.get_num_threads(), numba.get_num_threads())
    try:
        report = bench_disk_tier.main(
            ["--smoke", "--threads", "1", "--hardware", str(hw), "--json", str(tmp_path / "r.json")]
        )
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    auto = json.loads((tmp_path / "r.json").read_text())["auto"]
    assert auto == json.loads(json.dumps(report["auto"])) and auto["measured"]
    disk_rows = [r for r in report["results"] if r["mode"].endswith("_disk")]
    chosen = next(
        r for r in disk_rows if r["mode"] == auto["choice"] and r.get("budget_bytes") == auto["hbm_budget"]
    )
    fastest = max(r["samples_per_s"] for r in disk_rows)
    for r in disk_rows:  # every round priced at the probes beside it; the row's own ratio among them
        assert len(r["rounds_predicted_ratio"]) == 2 and r["predicted_ratio"] in r["rounds_predicted_ratio"]
    assert auto["margin"] == pytest.approx(1 - chosen["samples_per_s"] / fastest)
    assert auto["reason"].startswith("cold rows on disk in")
    # the rows train on the batches after the profiled ones: their coverage is the held-out curve's, which
    # the budget was chosen on (here 90%), not the profiled batches' (deterministic data: a fixed figure)
    first = report["profile"]["train_batches"][1]
    assert (
        report["profile"]["runs_train_batches"][0] == first
        and "validation split" in report["profile"]["heldout"]
    )
    assert all(abs(r["coverage"] - 0.9) < 0.03 for r in disk_rows if r["mode"] != "hybrid_disk")
    assert (
        f"--mode auto (the same calibration, the disk store) chose {auto['choice']}"
        in capsys.readouterr().out
    )


def test_auto_prices_only_the_hot_budgets_that_fit_in_memory(tmp_path):
    """With the disk store the hot rows and the DRAM tier are host memory too: of the coverage curve's budgets
    auto prices only those the check training makes would let run, from the same memory figure."""
    from dataclasses import replace

    from hotline import TrainConfig
    from hotline.costmodel.auto import choose_for_run
    from hotline.costmodel.choose import LOOKAHEAD
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.profiling.profiler import profile
    from hotline.training.preflight import MEMORY_HEADROOM, MEMORY_MARGIN, memory_needed

    ds = generate(tmp_path / "ds", 3000, seed=2, table_sizes=[40, 300, 20000], zipf=1.2, progress=False)
    (tmp_path / "cold").mkdir()
    cfg = TrainConfig(mode="auto", embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1], progress=False,
                      cold_store="disk", cold_dir=str(tmp_path / "cold"))  # fmt: skip
    data = Dataset(ds)
    prof = profile(data, embedding_dim=8, mini_batch_size=cfg.mini_batch_size, progress=False)
    curve = sorted(int(b) for b in prof.curve().budget_bytes if b > 0)
    cut = curve[len(curve) // 2]  # room for the budgets up to here, not the next
    need = memory_needed(replace(cfg, mode="hotline", hbm_budget=cut, lookahead=LOOKAHEAD), data)
    available = int((need + MEMORY_HEADROOM) / (1 - MEMORY_MARGIN)) + 2
    c = choose_for_run(cfg, data, CPU_DISK, prof=prof, available=available)
    priced = {x.hbm_budget for x in c.candidates if x.mode == "hotline"}
    assert priced == {b for b in curve if b <= cut} and max(curve) > cut
    everything = choose_for_run(cfg, data, CPU_DISK, prof=prof, available=1 << 40)
    assert {x.hbm_budget for x in everything.candidates if x.mode == "hotline"} == {
        b for b in curve if b < c.table_bytes
    }


def test_device_mode_only_where_training_would_let_it_hold_the_tables(tmp_path):
    """Tables within 80% of the device's memory, but not within the host memory available now, which
    training checks before it makes device mode's tables: device mode is not priced, and the reason says why."""
    from dataclasses import replace

    from hotline import TrainConfig
    from hotline.costmodel.auto import choose_for_run
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.training.preflight import MEMORY_HEADROOM, MEMORY_MARGIN, memory_needed

    c = choose(2 * GIB, 16 * GIB, CPU, W, skewed, BUDGETS, device_in_memory=False)
    assert all(x.mode != "device" for x in c.candidates)
    assert "device mode not considered: the tables do not fit in the host memory available now" in c.reason
    data = Dataset(
        generate(tmp_path / "ds", 3000, seed=2, table_sizes=[40, 300, 20000], zipf=1.2, progress=False)
    )
    cfg = TrainConfig(mode="auto", embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1], progress=False)
    hybrid = memory_needed(replace(cfg, mode="hybrid"), data)
    device = memory_needed(replace(cfg, mode="device"), data)
    assert hybrid < device  # the update's scratch (4 bytes a row) against one ring slot of buffers
    available = int((hybrid + MEMORY_HEADROOM) / (1 - MEMORY_MARGIN)) + 2  # room for hybrid alone
    c = choose_for_run(cfg, data, CPU, available=available)
    assert c.mode == "hybrid" and [x.mode for x in c.candidates] == [
        "hybrid"
    ]  # K=2's ring does not fit either
    assert "device mode not considered" in c.reason
    assert choose_for_run(cfg, data, CPU, available=1 << 40).mode == "device"  # golden: fits, and is fastest


def test_auto_reads_the_profiled_sample_once(tmp_path, monkeypatch):
    """The profile auto prices the hot budgets with is the one the run's placement (and the disk file's order)
    is made from: the real Profiler's counting passes over the sample, counted, are one, whichever of hybrid
    and hotline wins (the disk store: device mode is not a candidate)."""
    from hotline import TrainConfig
    from hotline.datasets.synthetic import generate
    from hotline.profiling.profiler import Profiler
    from hotline.training.trainer import Trainer

    passes = []
    for name in ("profile", "count"):  # the two passes that read the sample: a whole profile, or its counts
        real = getattr(Profiler, name)

        def counted(self, dataset, _real=real, _name=name):
            passes.append(_name)
            return _real(self, dataset)

        monkeypatch.setattr(Profiler, name, counted)
    ds = generate(tmp_path / "ds", 2000, seed=2, table_sizes=[40, 300, 5000], zipf=1.2, progress=False)
    (tmp_path / "cold").mkdir()
    cfg = TrainConfig(mode="auto", embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1], num_batches=2,
                      progress=False, quiet=True, cold_store="disk", cold_dir=str(tmp_path / "cold"))  # fmt: skip
    trainer = Trainer(cfg, ds, hardware=CPU_DISK)
    try:
        assert trainer.config.mode in ("hybrid", "hotline")
        trainer.fit()
    finally:
        trainer.close()
    assert passes == ["profile"], f"{trainer.config.mode}: {passes}"
