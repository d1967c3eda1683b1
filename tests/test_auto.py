"""``--mode auto``: the choice logic on fixed hardware figures (golden choices), and ``hotline train`` with no
flags printing and recording its choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_costmodel import HW

from hotline import costmodel as cm
from hotline.costmodel.choose import DEVICE_MEMORY_SHARE, choose

GIB = 1 << 30

# A GPU behind a PCIe-like link: device memory is fast, the link and the host are slow.
GPU = {
    "name": "test GPU",
    "host": {
        "dispatch_ns_per_lookup": {"1": 4.0, "n": 1.5},
        "gather_gbps": {"1": 8.0, "n": 30.0},
        "scatter_gbps": {"1": 6.0, "n": 20.0},
        "memcpy_gbps": 20.0,
        "handover_us": 20.0,
        "threads": 8,
        "cores": 16,
    },
    "device": {
        "kind": "cuda",
        "dense_gflops": 100_000.0,
        "mem_gbps": 3000.0,
        "pass_overhead_us": 100.0,
        "update_ns_per_lookup_float": 0.001,
        "update_ns_per_row_float": 0.001,
    },
    "link": {"h2d_gbps": 25.0, "d2h_gbps": 25.0, "latency_us": 10.0},
}
# This CPU as its own device (the cost model test's host).
CPU = {**HW, "name": "test CPU", "link": {"shared_memory": True}}
W = cm.Workload(4096, 26, 1, 64, (13, 64, 64), (64, 1))
BUDGETS = [1 * GIB, 4 * GIB, 16 * GIB, 64 * GIB]


def skewed(budget: int) -> cm.Stats:
    """A Criteo-like coverage curve: most lookups hit the first GiBs, the working set shrinks with them."""
    coverage = {0: 0.0, 1 * GIB: 0.80, 4 * GIB: 0.92, 16 * GIB: 0.97, 64 * GIB: 0.99}[budget]
    return cm.Stats(coverage, coverage**26, 60_000 * (1 - coverage) + 50, 60_000)


def flat(budget: int) -> cm.Stats:
    """Uniform ids: a hot tier covers its share of the rows and almost no sample is popular."""
    coverage = {0: 0.0, 1 * GIB: 0.01, 4 * GIB: 0.04, 16 * GIB: 0.16, 64 * GIB: 0.6}[budget]
    return cm.Stats(coverage, 0.0, 100_000 * (1 - coverage), 100_000)


def test_tables_that_fit_train_in_device_mode():
    c = choose(40 * GIB, 80 * GIB, GPU, W, skewed, BUDGETS)
    assert (c.mode, c.lookahead, c.hbm_budget) == ("device", 0, None)
    assert c.reason.startswith("all tables fit in device memory")
    assert c.predicted_samples_per_s == pytest.approx(cm.predict("device", W, skewed(0), GPU).samples_per_s)
    assert (
        c.candidates[0].mode == "device" and len(c.candidates) == 2 + 2 * 3
    )  # no budget as big as the tables


def test_tables_too_big_for_the_gpu_take_the_fastest_hot_budget():
    c = choose(500 * GIB, 48 * GIB, GPU, W, skewed, BUDGETS)
    assert (c.mode, c.lookahead, c.hbm_budget) == ("hotline", 2, 16 * GIB)  # golden: 64 GiB does not fit
    assert all(x.mode != "device" for x in c.candidates)
    assert all((x.hbm_budget or 0) <= DEVICE_MEMORY_SHARE * 48 * GIB for x in c.candidates)
    assert "do not fit" in c.reason and "x hybrid" in c.reason
    assert c.predicted_samples_per_s == max(x.prediction.samples_per_s for x in c.candidates)


def test_uniform_ids_gain_from_look_ahead_not_from_the_hot_tier():
    c = choose(500 * GIB, 8 * GIB, GPU, W, flat, BUDGETS)
    # golden: the link hidden by K=2; 4 GiB is predicted fastest, 1 GiB within TIE_SHARE of it: the smaller
    assert (c.mode, c.lookahead, c.hbm_budget) == ("hotline", 2, 1 * GIB)
    assert "hotline K=2 at 4 GiB" in c.reason and "does not tell apart" in c.reason
    k0 = choose(500 * GIB, 8 * GIB, GPU, W, flat, BUDGETS, lookaheads=(0,))
    # without look-ahead the hot tier gains next to nothing over hybrid: the simpler mode, by the tie rule
    assert (k0.mode, k0.lookahead) == ("hybrid", 0) and "does not tell apart" in k0.reason
    best_k0 = max(x.prediction.samples_per_s for x in k0.candidates if x.mode == "hotline")
    assert best_k0 < 1.05 * cm.predict("hybrid", W, flat(0), GPU).samples_per_s  # ~ hybrid


def test_no_budget_fits_hybrid():
    c = choose(500 * GIB, GIB // 2, GPU, W, skewed, BUDGETS)
    assert c.mode == "hybrid" and "no hot budget of the coverage curve fits" in c.reason


def test_on_a_cpu_device_tables_in_memory_train_in_device_mode():
    c = choose(2 * GIB, 16 * GIB, CPU, W, skewed, BUDGETS)
    assert (c.mode, c.lookahead) == ("device", 0)
    assert c.predicted_samples_per_s >= max(x.prediction.samples_per_s for x in c.candidates)


def test_bad_figures_and_rank_agreement():
    with pytest.raises(ValueError, match="must be positive"):
        choose(0, 8 * GIB, GPU, W, skewed, BUDGETS)
    c = choose(500 * GIB, 80 * GIB, GPU, W, skewed, BUDGETS)
    rec = c.record(measured_samples_per_s=c.predicted_samples_per_s / 2)
    assert rec["measured_over_predicted"] == pytest.approx(0.5) and rec["mode"] == "hotline"


def test_train_without_flags_prints_and_records_its_choice(tmp_path, capsys):
    from hotline.cli import main
    from hotline.datasets.synthetic import generate

    ds = generate(tmp_path / "ds", 600, seed=2, table_sizes=[40, 30, 500], zipf=1.2, progress=False)
    arch = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
    assert main(["train", str(ds), *arch, "--num-batches", "3", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    line = next(x for x in err.splitlines() if "--mode auto:" in x)
    assert "predicted" in line and "samples/s" in line
    assert "because all tables fit in device memory" in err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["mode"] == record["auto"]["mode"] == "device"
    assert "priced only" not in err  # the CPU priced is the CPU it trains on
    assert record["auto"]["measured_samples_per_s"] == record["samples_per_s"]
    # this CPU's calibration, with the run's own dense pass timed for it (the compute is priced from it)
    assert "timing this model's dense pass on this CPU" in err
    assert record["auto"]["dense_pass"]["pass_us"] > 0 and record["auto"]["dense_pass"]["batch"] > 0
    # an explicit --mode wins, and says so in the record
    assert main(["train", str(ds), *arch, "--num-batches", "3", "--no-progress", "--mode", "hybrid"]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out.strip().splitlines()[-1])
    assert record["mode"] == "hybrid" and "auto" not in record and "--mode auto" not in err
    # a known GPU by name on a CPU-only machine: priced, and the line says the run trains on the CPU; every
    # line of the choice fits a terminal of 100 columns
    assert main(["train", str(ds), *arch, "--num-batches", "3", "--no-progress", "--hardware", "H100"]) == 0
    err = capsys.readouterr().err
    lines = err[err.index("--mode auto:") :].splitlines()
    choice = lines[: next((i for i, x in enumerate(lines[1:], 1) if not x.startswith("  ")), len(lines))]
    assert "on H100" in choice[0] and "(priced only: this run trains on this machine's CPU)" in " ".join(
        choice
    )
    assert any(x.startswith("  because ") for x in choice) and all(len(x) <= 100 for x in choice), choice


def test_the_library_resolves_auto_itself(tmp_path, capsys):
    """``Trainer(TrainConfig(mode="auto"))`` from Python: the cost model chooses (as ``hotline train`` does),
    the trainer keeps the choice, trains the chosen mode and prints the choice when training starts."""
    from hotline.datasets.synthetic import generate
    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    ds = generate(tmp_path / "ds", 600, seed=2, table_sizes=[40, 30, 500], zipf=1.2, progress=False)
    arch = dict(embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1])
    trainer = Trainer(TrainConfig(mode="auto", num_batches=3, progress=False, **arch), ds)
    try:
        choice = trainer.auto_choice
        assert choice is not None and trainer.config.mode == choice.mode != "auto"
        assert trainer.config.lookahead == choice.lookahead and trainer.config.hbm_budget == choice.hbm_budget
        summary = trainer.fit()
    finally:
        trainer.close()
    assert summary["mode"] == choice.mode and summary["steps"] == 3
    assert "--mode auto: " in capsys.readouterr().err


def _auto_on_a_rank(comm, dataset: str, out: str) -> None:
    """A spawn target: a Trainer in mode auto on this rank; writes what the rank was told to train."""
    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    arch = dict(embedding_dim=8, bottom_mlp=[13, 16, 8], top_mlp=[16, 1])
    trainer = Trainer(
        TrainConfig(mode="auto", num_batches=2, progress=False, quiet=True, **arch), dataset, comm
    )
    try:
        c = trainer.auto_choice
        got = [
            trainer.config.mode,
            trainer.config.lookahead,
            trainer.config.hbm_budget,
            c.predicted_samples_per_s,
        ]
        Path(out, f"rank{comm.rank}.json").write_text(json.dumps([*got, c.reason]))
    finally:
        trainer.close()


def test_ranks_take_rank_0s_choice_whole(tmp_path):
    """On 2 ranks rank 0 chooses and the other rank receives the same choice with its figures (not a code)."""
    from ranks import spawn

    from hotline.datasets.synthetic import generate

    ds = generate(tmp_path / "ds", 600, seed=2, table_sizes=[40, 30, 500], zipf=1.2, progress=False)
    spawn(2, _auto_on_a_rank, str(ds), str(tmp_path))
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first == second and first[0] in ("device", "hybrid", "hotline") and first[3] > 0 and first[4]


def test_a_cpu_is_priced_with_its_cached_calibration(tmp_path, monkeypatch):
    """On a CPU, ``auto`` prices with `hotline calibrate`'s figures, timed once and kept in the cache
    directory per host and thread count: a kept description is read back, not timed again."""
    from hotline.costmodel.machine import cpu_hardware, cpu_hardware_path, hardware_for

    monkeypatch.setenv("HOTLINE_CACHE", str(tmp_path))
    path = cpu_hardware_path(2)
    assert path.parent == tmp_path and path != cpu_hardware_path(1)
    path.write_text(json.dumps({**CPU, "format": "hotline-hardware"}))
    said: list[str] = []
    hw = cpu_hardware(2, say=said.append)
    assert said == [] and hw["name"] == "test CPU" and hw["device"] == CPU["device"]
    assert hardware_for("cpu", None, 2)["name"] == "test CPU"


def test_a_cached_calibration_timed_slow_is_timed_again(tmp_path, monkeypatch):
    """A cached calibration whose reference pass ran 10x slower than this CPU runs it now (timed beside other
    work, or in a slow spell) would price every mode 10x too slow: `--mode auto` times this CPU again, keeps
    the faster calibration and prices with it. One whose reference ran 10x faster is kept as it is (this CPU
    is the slow one now: the run's pass is scaled to the calibration's speed instead)."""
    from hotline.costmodel.dense_timing import time_pass
    from hotline.costmodel.machine import cpu_hardware, cpu_hardware_path, with_timed_pass

    monkeypatch.setenv("HOTLINE_CACHE", str(tmp_path))
    w = cm.Workload(256, 4, 1, 8, (13, 16, 8), (16, 1))
    now = time_pass(w, threads=2, budget_s=0.2)["measured_reference_us"]  # this CPU's reference pass, now
    path = cpu_hardware_path(2)
    key = cm.pass_key(w)
    for factor, retimed in ((0.1, False), (10.0, True)):
        cached = {
            **CPU,
            "format": "hotline-hardware",
            "device": {**CPU["device"], "reference_pass_us": factor * now},
        }
        path.write_text(json.dumps(cached))
        said: list[str] = []
        hw = with_timed_pass(cpu_hardware(2, say=said.append), w, 2, say=said.append, recalibrate=True)
        again = [x for x in said if "timing this CPU again" in x]
        kept = json.loads(path.read_text())
        if not retimed:
            assert again == [] and hw["name"] == "test CPU" and kept == cached
            assert hw["device"]["passes"][key]["reference_scale"] < 1
            continue
        assert len(again) == 1
        assert hw["name"] != "test CPU" and hw["source"].startswith("hotline calibrate")
        assert kept["source"] == hw["source"] and kept["device"]["reference_pass_us"] < factor * now
        assert hw["device"]["passes"][key]["reference_scale"] < 10  # timed beside the new calibration
        # without recalibrate (a --hardware FILE, or a benchmark's own fresh calibration) nothing is timed again
        path.write_text(json.dumps(cached))
        said.clear()
        hw = with_timed_pass(cpu_hardware(2, say=said.append), w, 2, say=said.append)
        assert hw["name"] == "test CPU" and not any("again" in x for x in said)


def test_predictions_closer_than_the_models_error_go_to_the_simpler_configuration():
    """Of configurations predicted within TIE_SHARE of the fastest, the simplest is chosen (device before
    hybrid before hotline; K=0 before K=2; the smaller budget), and the reason says which one was faster."""
    from hotline.costmodel.choose import TIE_SHARE

    free = choose(2 * GIB, 16 * GIB, CPU, W, skewed, BUDGETS)
    fastest = max(free.candidates, key=lambda c: c.prediction.samples_per_s)
    within = [
        c
        for c in free.candidates
        if c.prediction.samples_per_s >= (1 - TIE_SHARE) * fastest.prediction.samples_per_s
    ]
    simplest = min(
        within,
        key=lambda c: ({"device": 0, "hybrid": 1, "hotline": 2}[c.mode], c.lookahead, c.hbm_budget or 0),
    )
    assert (free.mode, free.lookahead, free.hbm_budget) == (
        simplest.mode,
        simplest.lookahead,
        simplest.hbm_budget,
    )
    assert free.candidates[0] is simplest
    # a faster GPU run: hotline clearly ahead of hybrid, tables too big for device mode
    gpu = choose(500 * GIB, 80 * GIB, GPU, W, skewed, BUDGETS)
    top = max(gpu.candidates, key=lambda c: c.prediction.samples_per_s)
    assert (
        gpu.mode == "hotline"
        and gpu.predicted_samples_per_s >= (1 - TIE_SHARE) * top.prediction.samples_per_s
    )
    if gpu.candidates[0] is not top:
        assert "does not tell apart" in gpu.reason and top.label in gpu.reason
