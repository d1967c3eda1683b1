"""The cost model prices the model a run trains (dot, cat or DCN-v2), counted against the real torch models of
hotline.models, and every caller hands it that model: ``--mode auto`` and ``hotline profile --predict``."""

from __future__ import annotations

import pytest
from test_costmodel import HW

from hotline import costmodel as cm
from hotline.models.dlrm import DLRM, DLRMConfig

TABLES = (50, 40, 30, 20)
D = 8
BOTTOM, TOP = (13, 16, D), (32, 16, 1)
DCN_LAYERS, DCN_RANK = 2, 5
SAMPLES = 100
# FLOPs and passes only: bytes (an infinite bandwidth) and the per-pass cost priced at nothing, so that a
# compute phase is the GEMMs at the dense rate plus the dot interaction at its own.
RATES = {"dense_gflops": 50.0, "interaction_gflops": 10.0, "mem_gbps": float("inf"), "pass_overhead_us": 0.0,
         "update_ns_per_lookup_float": 1.0, "update_ns_per_row_float": 0.5}  # fmt: skip


def _model(interaction: str) -> DLRM:
    cfg = DLRMConfig(table_sizes=list(TABLES), embedding_dim=D, bottom_mlp=list(BOTTOM), top_mlp=list(TOP),
                     interaction=interaction, dcn_num_layers=DCN_LAYERS, dcn_low_rank_dim=DCN_RANK)  # fmt: skip
    return DLRM(cfg, seed=0)


def _workload(model: DLRM, batch: int = 64) -> cm.Workload:
    c = model.config
    return cm.Workload(batch, c.num_tables, 1, c.embedding_dim, **cm.arch_of(c))


def _weights(model: DLRM) -> int:
    """Elements of the weight matrices the model multiplies by: every Linear's, each cross layer's W and V."""
    return sum(p.numel() for p in model.parameters() if p.dim() == 2)


@pytest.mark.parametrize("interaction", ["dot", "cat", "dcn"])
def test_gemms_and_parameters_are_those_of_the_built_model(interaction):
    model = _model(interaction)
    w = _workload(model)
    gemm, inter, _ = cm.compute_terms(w, SAMPLES)
    assert gemm == 6 * SAMPLES * _weights(model)  # forward + two backward products, 2 FLOPs a multiply-add
    # every GEMM, shape for shape: a weight is [out, in] (Linear's, and F.linear's of the cross net's W and V)
    assert sorted(w.mlp_layers()) == sorted(
        (p.shape[1], p.shape[0]) for p in model.parameters() if p.dim() == 2
    )
    params = list(model.parameters())
    assert sorted(w.param_tensors()) == sorted(p.numel() for p in params)  # biases too: the dense update
    assert w.dense_params() == sum(p.numel() for p in params)
    assert w.interaction_width == model.over_arch.mlp[0].in_features
    F = len(TABLES) + 1
    assert inter == (6 * SAMPLES * F * F * D if interaction == "dot" else 0)  # batched products: dot only


def test_dcn_costs_more_than_dot_by_its_cross_layers():
    """Same tables, dim, MLPs and batch: the DCN run's compute exceeds the dot run's by what its GEMMs add (the
    cross layers, and the over-arch's wider input) less the dot interaction it does not run; on the MLPerf
    shape (dim 128, 3 cross layers of rank 512) every mode's step is slower."""
    from hotline.training.presets import PRESETS

    hw, s = {**HW, "device": RATES}, cm.Stats(0.8, 0.1, 50, 200)
    models = {i: _model(i) for i in cm.INTERACTIONS}
    compute = {i: cm.phases("hybrid", _workload(m, SAMPLES), s, hw)["compute"] for i, m in models.items()}
    F = len(TABLES) + 1
    added = (
        6 * SAMPLES * (_weights(models["dcn"]) - _weights(models["dot"])) / 50e9
        - 6 * SAMPLES * F * F * D / 10e9
    )
    assert compute["dcn"] - compute["dot"] == pytest.approx(added, rel=1e-12)
    # against cat (the over-arch of DCN's width, no cross layers): the cross layers' weights alone
    cross = sum(p.numel() for p in models["dcn"].inter_arch.crossnet.parameters() if p.dim() == 2)
    assert cross == 2 * DCN_LAYERS * DCN_RANK * F * D
    assert compute["dcn"] - compute["cat"] == pytest.approx(6 * SAMPLES * cross / 50e9, rel=1e-12)

    arch = cm.arch_of(PRESETS["mlperf-dcnv2"])
    big = {i: cm.Workload(1024, 26, 1, 128, **{**arch, "interaction": i}) for i in ("dot", "dcn")}
    s = cm.Stats(0.8, 0.1, 5000, 20_000)
    for mode in cm.PRICED_MODES:
        p = {i: cm.predict(mode, w, s, HW) for i, w in big.items()}
        assert p["dcn"].phases_s["compute"] > p["dot"].phases_s["compute"]
        assert p["dcn"].samples_per_s < p["dot"].samples_per_s


def test_workload_refuses_a_model_that_cannot_be_built():
    from hotline.models import dlrm

    assert cm.INTERACTIONS == dlrm.INTERACTIONS  # the cost model prices every interaction the models build
    with pytest.raises(ValueError, match="interaction must be one of"):
        cm.Workload(64, 4, 1, 8, (13, 8), (4, 1), interaction="dcnv3")
    with pytest.raises(ValueError, match="dcn_num_layers and dcn_low_rank_dim must be >= 1"):
        cm.Workload(64, 4, 1, 8, (13, 8), (4, 1), interaction="dcn", dcn_low_rank_dim=0)
    with pytest.raises(ValueError, match="must end with the embedding dim 8"):
        cm.Workload(64, 4, 1, 8, (13, 16), (4, 1))
    assert cm.arch_of({"bottom_mlp": [13, 8], "interaction": "cat"}) == {
        "bottom_mlp": (13, 8),
        "interaction": "cat",
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from hotline.datasets.synthetic import generate

    path = tmp_path_factory.mktemp("costmodel_models") / "ds"
    return generate(path, 600, seed=2, table_sizes=[40, 30, 500], zipf=1.2, progress=False)


def test_auto_prices_a_dcn_run_as_dcn(small):
    """``--mode auto`` (choose_for_run, the code path ``hotline train`` takes) prices each run's own model: the
    hybrid candidate's compute of a DCN config exceeds a dot config's by the FLOPs counted in the two models."""
    from hotline.costmodel.auto import choose_for_run
    from hotline.training.config import TrainConfig
    from hotline.training.placing import profile_for

    # bytes all but free (a description needs finite rates)
    hw = {**HW, "device": {**RATES, "mem_gbps": 1e15}}
    arch = {"embedding_dim": 8, "bottom_mlp": [13, 16, 8], "top_mlp": [16, 1], "mini_batch_size": 64}
    compute, weights = {}, {}
    for inter in ("dot", "dcn"):
        config = TrainConfig(mode="auto", interaction=inter, dcn_num_layers=2, dcn_low_rank_dim=6, **arch)
        prof = profile_for(config, small, progress=False)
        choice = choose_for_run(config, small, hw, prof=prof)
        hybrid = next(c for c in choice.candidates if c.mode == "hybrid")
        compute[inter] = hybrid.prediction.phases_s["compute"]
        weights[inter] = _weights(DLRM(config.model_config([40, 30, 500])))
    F = 4
    expected = 6 * 64 * (weights["dcn"] - weights["dot"]) / 50e9 - 6 * 64 * F * F * 8 / 10e9
    assert compute["dcn"] - compute["dot"] == pytest.approx(expected, rel=1e-6)
    assert weights["dcn"] > weights["dot"]


def test_profile_predicts_the_mlperf_model(tmp_path, capsys):
    """``hotline profile --predict --preset mlperf-dcnv2`` on an MLPerf-shaped dataset prices DLRM-DCNv2 (its
    dim, optimizer, MLPs and cross layers): what it prints is the cost model's table for that workload."""
    from hotline.cli import main
    from hotline.profiling.profiler import profile
    from hotline.table_layout import bytes_per_row
    from hotline.training.presets import PRESETS

    ds = tmp_path / "mlperf"
    assert main(["data", "synthetic", "--preset", "mlperf-dcnv2", "--rows", "700", "--max-rows-per-table", "300",
                 "--out", str(ds), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    argv = ["profile", str(ds), "--preset", "mlperf-dcnv2", "--mini-batch-size", "64", "--sample-fraction", "0.5",
            "--hbm-budget", "256KiB", "--predict", "--hardware", "H200", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"at {bytes_per_row(128, 'rowwise-adagrad')} B/row" in out  # the preset's dim and optimizer
    assert (
        "bottom MLP 13-512-256-128, dcn (3 cross layers of rank 512) interaction, top 1024-1024-512-256-1"
        in out
    )
    prof = profile(ds, embedding_dim=128, optimizer="rowwise-adagrad", mini_batch_size=64, sample_fraction=0.5,
                   progress=False)  # fmt: skip
    hw = cm.load_hardware("H200")
    stats = cm.Stats.from_profile(prof, "256KiB")
    preset = PRESETS["mlperf-dcnv2"]
    w = cm.workload_for(prof, **cm.arch_of(preset))
    assert cm.prediction_table(cm.predict_all(w, stats, hw)) in out
    as_dot = cm.workload_for(prof, **{**cm.arch_of(preset), "interaction": "dot"})
    assert cm.prediction_table(cm.predict_all(as_dot, stats, hw)) not in out


def test_profile_names_a_wrong_model_flag_before_profiling(small, capsys):
    from hotline.cli import main

    argv = [
        "profile",
        str(small),
        "--hbm-budget",
        "16KiB",
        "--predict",
        "--hardware",
        "H200",
        "--no-progress",
    ]
    assert main([*argv, "--arch-mlp-bot", "13-64-32"]) == 2
    out, err = capsys.readouterr()
    assert (
        "--arch-mlp-bot 13-64-32 must end with the embedding dim 16" in err and "samples of split" not in out
    )
    assert main([*argv, "--arch-interaction-op", "dcn", "--dcn-low-rank-dim", "0"]) == 2
    out, err = capsys.readouterr()
    assert "--dcn-low-rank-dim must be >= 1" in err and "samples of split" not in out


def test_benchmarks_price_the_model_they_run(small, monkeypatch, capsys):
    """gpu_bench and bench_pipeline price their MLPerf workload as DCN-v2, and predict_h200 predicts it."""
    import argparse
    from pathlib import Path

    import numba
    import torch

    from hotline.profiling.profiler import profile

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_pipeline
    import gpu_bench
    import mlperf
    import predict_h200

    prof = profile(small, embedding_dim=128, mini_batch_size=64, progress=False)
    args = argparse.Namespace(
        max_rows_per_table=0, modes="device,torch_embeddingbag", worker_threads=2, dim=64
    )
    w = gpu_bench._workload(gpu_bench.WORKLOADS[mlperf.NAME](args), args, prof)
    assert (w.interaction, w.dcn_num_layers, w.dcn_low_rank_dim, w.top_mlp) == (
        "dcn",
        3,
        512,
        (1024, 1024, 512, 256, 1),
    )
    assert cm.arch_of(bench_pipeline.config(mlperf.NAME))["interaction"] == "dcn"
    assert cm.arch_of(bench_pipeline.config("kaggle")) == {
        "bottom_mlp": (13, 512, 256, 64, 16),
        "top_mlp": (512, 256, 1),
    }
    threads = (torch.get_num_threads(), numba.get_num_threads())  # the script sets both: restored after it
    try:
        p = predict_h200.main(["--smoke", "--threads", "1", "--workload", mlperf.NAME])
    finally:
        torch.set_num_threads(threads[0])
        numba.set_num_threads(threads[1])
    assert (
        p["workload"] == mlperf.NAME
        and len(p["results"]) == 12
        and all(r["samples_per_s"] > 0 for r in p["results"])
    )
    assert "mlperf-dcnv2 (dcn interaction), " in capsys.readouterr().out
