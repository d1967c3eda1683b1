"""``hotline train`` end to end through ``main([...])``: learning, metrics, exports, checkpoints."""

import json

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.synthetic import generate

ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-32-8", "--arch-mlp-top", "32-1"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    sizes = [200, 50, 1000, 30, 500, 8, 300, 100]
    return str(generate(root / "ds", 40_000, seed=2, table_sizes=sizes, zipf=1.1, progress=False))


def _records(path):
    return [json.loads(line) for line in open(path)]


def test_training_learns_and_reports(dataset, tmp_path):
    metrics = tmp_path / "m.jsonl"
    argv = [
        "train",
        dataset,
        *ARCH,
        "--mini-batch-size",
        "128",
        "--learning-rate",
        "0.2",
        "--print-freq",
        "50",
        "--test-freq",
        "100",
        "--metrics",
        str(metrics),
        "--dump-params",
        str(tmp_path / "p.npz"),
        "--no-progress",
    ]
    assert main(argv) == 0
    recs = _records(metrics)
    summary = recs[-1]
    assert summary["kind"] == "summary" and summary["steps"] == 40_000 * 6 // 7 // 128 + 1
    assert (
        summary["val_auc"] > 0.65 and summary["test_auc"] > 0.65
    )  # well above chance: the signal was learned
    assert summary["samples_per_s"] > 0
    train = [r for r in recs if r["kind"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert any(r["kind"] == "eval" for r in recs)
    params = np.load(tmp_path / "p.npz")
    assert params["embedding.table_2"].shape == (1000, 8)
    assert "model.over_arch.mlp.0.weight" in params.files


def test_hotline_metrics_have_the_pipeline_figures(dataset, tmp_path):
    metrics = tmp_path / "m.jsonl"
    argv = [
        "train",
        dataset,
        *ARCH,
        "--mode",
        "hotline",
        "--hbm-budget",
        "64KiB",
        "--num-batches",
        "60",
        "--print-freq",
        "20",
        "--metrics",
        str(metrics),
        "--no-progress",
        "--eval-max-samples",
        "500",
    ]
    assert main(argv) == 0
    rec = [r for r in _records(metrics) if r["kind"] == "train"][-1]
    assert 0 < rec["popular_sample_share"] < 1
    assert 0 <= rec["overlap_ratio"] <= 1
    assert rec["working_set_rows"] > 0 and rec["bytes_gathered"] > 0
    for phase in ("dispatch", "gather", "h2d", "non_popular_compute", "sparse_update", "write_back", "stall"):
        assert phase in rec["time_s"], phase


def test_save_then_load_continues(dataset, tmp_path):
    common = ["train", dataset, *ARCH, "--no-progress", "--eval-max-samples", "200"]
    assert main([*common, "--num-batches", "30", "--save", str(tmp_path / "a.pt")]) == 0
    assert (
        main(
            [
                *common,
                "--num-batches",
                "60",
                "--load",
                str(tmp_path / "a.pt"),
                "--dump-params",
                str(tmp_path / "resumed.npz"),
            ]
        )
        == 0
    )
    assert main([*common, "--num-batches", "60", "--dump-params", str(tmp_path / "straight.npz")]) == 0
    a, b = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "straight.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k


def test_default_dataset_is_built_in(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOTLINE_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--num-batches", "20", "--no-progress", "--eval-max-samples", "1000"]) == 0
    captured = capsys.readouterr()
    assert "built-in synthetic dataset" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["steps"] == 20
