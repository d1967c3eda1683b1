"""Sizes of the dense model that cannot be built are one line before any allocation: the dense model's
parameters (with gradients and optimizer state) and a batch's activations are in the memory preflight like
the tables, and a cross net of more layers than can run is refused by its flag."""

from __future__ import annotations

import pytest

from hotline import TrainConfig
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.models.dlrm import DLRM, MAX_DCN_LAYERS
from hotline.training.preflight import MemoryShortfall, check_dense_memory, dense_model_bytes


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return Dataset(generate(tmp_path_factory.mktemp("dense") / "ds", 600, seed=1, table_sizes=[20, 30, 9],
                            progress=False))  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [["--arch-interaction-op", "dcn", "--dcn-low-rank-dim", "100000000"],
     ["--arch-mlp-bot", "13-1000000000-16"], ["--arch-mlp-top", "2000000000-1"]],
)  # fmt: skip
@pytest.mark.parametrize("mode", ["hybrid", "auto"])
def test_a_dense_model_too_large_for_memory_is_one_line_before_it_is_built(ds, capsys, flags, mode):
    assert main(["train", str(ds.path), "--mode", mode, "--num-batches", "1", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the dense model's parameters, gradients and optimizer state take" in err[0], err


def test_too_many_cross_layers_is_refused_by_its_flag(ds, capsys):
    argv = ["train", str(ds.path), "--mode", "hybrid", "--arch-interaction-op", "dcn", "--no-progress"]
    assert main([*argv, "--dcn-num-layers", "1000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--dcn-num-layers must be at most {MAX_DCN_LAYERS}, got 1000000" in err[0]


@pytest.mark.parametrize("interaction", ["dot", "cat", "dcn"])
@pytest.mark.parametrize("optimizer,state", [("sgd", 0), ("adam", 2), ("rowwise-adagrad", 1)])
def test_the_parameter_count_is_the_built_models(ds, interaction, optimizer, state):
    cfg = TrainConfig(mode="device", optimizer=optimizer, embedding_dim=8, bottom_mlp=[13, 24, 8], top_mlp=[32, 16, 1],
                      interaction=interaction, dcn_num_layers=2, dcn_low_rank_dim=5, mini_batch_size=50)  # fmt: skip
    model = DLRM(cfg.model_config(ds.table_sizes))
    params, activations = dense_model_bytes(cfg, ds)
    assert params == sum(p.numel() for p in model.parameters()) * 4 * (2 + state)
    assert activations > 0
    check_dense_memory(cfg, ds)  # fits: no error
    with pytest.raises(MemoryShortfall, match="the dense model's parameters"):
        check_dense_memory(cfg, ds, available=params)
