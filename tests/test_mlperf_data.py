"""MLPerf DLRM-DCNv2 data: the synthetic preset's shape, and the Criteo 1TB day-file reader against tiny
hand-written day files (one-hot .npy and multi-hot .npz forms)."""

from __future__ import annotations

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.criteo_days import DayFileError, convert_days
from hotline.datasets.format import FORMAT_TAG, FORMAT_TAG_BAGS, Dataset
from hotline.datasets.mlperf import MLPERF_BAG_SIZES, MLPERF_TABLE_SIZES
from hotline.table_layout import PAD_ID

# The lists as the MLPerf reference README gives them (mlcommons/training recommendation_v2/torchrec_dlrm).
REFERENCE_ROWS = "40000000,39060,17295,7424,20265,3,7122,1543,63,40000000,3067956,405282,10,2209,11938,155,4,976,14,40000000,40000000,40000000,590152,12973,108,36"  # noqa: E501
REFERENCE_BAGS = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1"


def test_mlperf_constants_are_the_reference_lists():
    assert list(MLPERF_TABLE_SIZES) == [int(x) for x in REFERENCE_ROWS.split(",")]
    assert list(MLPERF_BAG_SIZES) == [int(x) for x in REFERENCE_BAGS.split(",")]
    assert sum(MLPERF_BAG_SIZES) == 214


def _bags(ds: Dataset, split: str = "train") -> list[np.ndarray]:
    sp = np.asarray(ds.split(split).sparse)
    s = ds.bags.bag_start
    return [sp[:, s[t] : s[t + 1]] for t in range(ds.num_tables)]


def test_preset_dataset_has_the_mlperf_bag_sizes(tmp_path, capsys):
    out = tmp_path / "mlperf"
    rc = main(["data", "synthetic", "--preset", "mlperf-dcnv2", "--rows", "3000", "--max-rows-per-table", "5000",
               "--out", str(out), "--no-progress"])  # fmt: skip
    assert rc == 0
    assert "214 per sample" in capsys.readouterr().out
    ds = Dataset(out)
    assert ds.meta["format"] == FORMAT_TAG_BAGS and not ds.padded
    assert ds.bag_sizes == list(MLPERF_BAG_SIZES)
    assert ds.table_sizes == [min(n, 5000) for n in MLPERF_TABLE_SIZES]
    assert ds.train.sparse.shape == (len(ds.train), 214)
    for t, bag in enumerate(_bags(ds)):
        assert bag.shape[1] == MLPERF_BAG_SIZES[t]
        assert bag.min() >= 0 and bag.max() < ds.table_sizes[t]  # fixed bags: no padding
    # Skewed: the big tables' top 1 % of rows take far more than 1 % of the lookups.
    shares = ds.meta["synthetic"]["top_hit_share_measured"]
    assert min(shares[t] for t in (0, 9, 19, 20, 21)) > 0.3


def test_variable_bags_are_padded_at_the_tail(tmp_path):
    out = tmp_path / "var"
    rc = main(["data", "synthetic", "--preset", "mlperf-dcnv2", "--variable-bags", "--rows", "3000",
               "--max-rows-per-table", "5000", "--out", str(out), "--no-progress"])  # fmt: skip
    assert rc == 0
    ds = Dataset(out)
    assert ds.padded and ds.bag_sizes == list(MLPERF_BAG_SIZES)
    for t, bag in enumerate(_bags(ds)):
        real = bag != PAD_ID
        lengths = real.sum(axis=1)
        assert lengths.min() >= 1 and lengths.max() <= MLPERF_BAG_SIZES[t]
        # padding only after the real ids: each row is real for its first `length` slots
        np.testing.assert_array_equal(real, np.arange(bag.shape[1])[None, :] < lengths[:, None])
        assert bag[real].max() < ds.table_sizes[t]
        if MLPERF_BAG_SIZES[t] >= 5:
            assert len(np.unique(lengths)) == MLPERF_BAG_SIZES[t]  # lengths vary per sample
    # bags of different lengths in one sample: table 20 (L = 100) and table 21 (L = 27)
    b = _bags(ds)
    assert ((b[20] != PAD_ID).sum(1) != (b[21] != PAD_ID).sum(1)).any()


def test_one_hot_datasets_keep_format_1(tmp_path):
    main(
        [
            "data",
            "synthetic",
            "--rows",
            "500",
            "--table-sizes",
            "10,20",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ]
    )
    ds = Dataset(tmp_path / "o")
    assert ds.meta["format"] == FORMAT_TAG and ds.uniform and ds.bag_sizes == [1, 1]
    assert ds.train.sparse.shape == (len(ds.train), 2, 1)


# -- day files -----------------------------------------------------------------------------------------------
ROWS = (5, 4, 7)  # three days: 0 and 1 train, 2 split val (first ceil(7/2) = 4) / test (3)
SIZES = [7 + t for t in range(26)]


def _write_days(d, multi_hot: bool, rng) -> dict:
    """Tiny day files in torchrec's layout (dense float32 [n,13], labels int32 [n,1], sparse int64 [n,26],
    and with ``multi_hot`` MLPerf's day_N_sparse_multi_hot.npz of [n, L_t] members); returns what was written."""
    bag_sizes = [1 + (t % 3) for t in range(26)]
    days = []
    for i, n in enumerate(ROWS):
        dense = rng.random((n, 13), dtype=np.float32)
        labels = rng.integers(0, 2, (n, 1)).astype(np.int32)
        sparse = rng.integers(0, 1000, (n, 26)).astype(np.int64)  # raw values: the reader takes them mod size
        np.save(d / f"day_{i}_dense.npy", dense)
        np.save(d / f"day_{i}_labels.npy", labels)
        np.save(d / f"day_{i}_sparse.npy", sparse)
        bags = [rng.integers(0, 1000, (n, bag_sizes[t])).astype(np.int64) for t in range(26)]
        if multi_hot:
            np.savez(d / f"day_{i}_sparse_multi_hot.npz", **{str(t): bags[t] for t in range(26)})
        days.append({"dense": dense, "labels": labels, "sparse": sparse, "bags": bags})
    return {"days": days, "bag_sizes": bag_sizes}


@pytest.mark.parametrize("multi_hot", [False, True])
def test_day_file_reader_equals_the_hand_written_files(tmp_path, multi_hot):
    src = tmp_path / "days"
    src.mkdir()
    written = _write_days(src, multi_hot, np.random.default_rng(3))
    ds = Dataset(convert_days(src, tmp_path / "out", SIZES, progress=False))
    days = written["days"]
    if multi_hot:
        ids = [
            np.concatenate([b[t] % SIZES[t] for t in range(26)], axis=1) for b in (d["bags"] for d in days)
        ]
        assert ds.bag_sizes == written["bag_sizes"] and ds.meta["source"]["multi_hot"]
    else:
        ids = [d["sparse"] % np.asarray(SIZES)[None, :] for d in days]
        assert ds.uniform and ds.bag_sizes == [1] * 26
    half = (ROWS[2] + 1) // 2
    expect = {
        "train": (np.concatenate([days[0]["dense"], days[1]["dense"]]), np.concatenate(ids[:2]),
                  np.concatenate([days[0]["labels"], days[1]["labels"]])[:, 0]),
        "val": (days[2]["dense"][:half], ids[2][:half], days[2]["labels"][:half, 0]),
        "test": (days[2]["dense"][half:], ids[2][half:], days[2]["labels"][half:, 0]),
    }  # fmt: skip
    for name, (dense, sparse, labels) in expect.items():
        split = ds.split(name)
        np.testing.assert_array_equal(split.dense, dense)
        np.testing.assert_array_equal(np.asarray(split.sparse).reshape(len(split), -1), sparse)
        np.testing.assert_array_equal(split.labels, labels.astype(np.float32))
    assert ds.table_sizes == SIZES


def test_day_files_cli_and_its_errors(tmp_path, capsys):
    src = tmp_path / "days"
    src.mkdir()
    _write_days(src, True, np.random.default_rng(0))
    sizes = ",".join(map(str, SIZES))
    rc = main(["data", "criteo", "--day-files", str(src), "--table-sizes", sizes, "--out", str(tmp_path / "o"),
               "--no-progress"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "3 day files, multi-hot" in out and "train 9  val 4  test 3" in out
    (src / "day_1_sparse_multi_hot.npz").unlink()
    rc = main(["data", "criteo", "--day-files", str(src), "--table-sizes", sizes, "--out", str(tmp_path / "p"),
               "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "day_1_sparse_multi_hot.npz is missing" in err and "Traceback" not in err
    (src / "day_1_dense.npy").unlink()
    with pytest.raises(DayFileError, match="missing day 1"):
        convert_days(src, tmp_path / "q", SIZES, progress=False)
    assert main(["data", "criteo", "--out", str(tmp_path / "r")]) == 2
    assert "--day-files" in capsys.readouterr().err


# -- hotline train --preset mlperf-dcnv2 ---------------------------------------------------------------------
def _preset_config(argv):
    from hotline.cli import build_parser
    from hotline.cli.train import config_from_args

    args = build_parser().parse_args(argv)
    return config_from_args(args)


def test_scaled_batch_size_golden():
    from hotline.training.presets import scaled_batch_size

    # 214 ids of 128 floats, 16 bytes per float held: 438,272 bytes a sample; 1/8 of 16 GiB holds 4096 samples
    assert scaled_batch_size(65536, 214, 128, 16 << 30) == 4096
    assert scaled_batch_size(65536, 214, 128, 1 << 50) == 65536  # a machine that holds it: MLPerf's batch
    assert scaled_batch_size(65536, 214, 128, 1 << 20) == 128  # never below 128


def test_train_preset_sets_mlperf_dcnv2_and_flags_override(tmp_path):
    from hotline.training.presets import PRESETS

    ds = tmp_path / "ds"
    main(["data", "synthetic", "--preset", "mlperf-dcnv2", "--rows", "700", "--max-rows-per-table", "300",
          "--out", str(ds), "--no-progress"])  # fmt: skip
    cfg = _preset_config(["train", str(ds), "--preset", "mlperf-dcnv2"])
    assert (cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp) == (
        128,
        [13, 512, 256, 128],
        [1024, 1024, 512, 256, 1],
    )
    assert (cfg.interaction, cfg.optimizer, cfg.learning_rate) == ("dcn", "rowwise-adagrad", 0.005)
    assert (cfg.lr_warmup_steps, cfg.lr_decay_start_step, cfg.lr_decay_steps) == (0, 0, 0)
    assert cfg.lr_schedule.constant
    assert 128 <= cfg.mini_batch_size <= 65536 and cfg.mini_batch_size & (cfg.mini_batch_size - 1) == 0
    for field in ("dcn_num_layers", "dcn_low_rank_dim"):  # set once the dcn flags exist
        if hasattr(cfg, field):
            assert getattr(cfg, field) == PRESETS["mlperf-dcnv2"][field]
    cfg = _preset_config(["train", str(ds), "--preset", "mlperf-dcnv2", "--optimizer", "sgd", "--mini-batch-size",
                          "128", "--arch-sparse-feature-size=64", "--arch-mlp-bot", "13-64", "--learning-rate", "0.1",
                          "--lr-num-warmup-steps", "5"])  # fmt: skip
    assert (cfg.optimizer, cfg.mini_batch_size, cfg.embedding_dim, cfg.bottom_mlp) == (
        "sgd",
        128,
        64,
        [13, 64],
    )
    assert (cfg.learning_rate, cfg.lr_warmup_steps, cfg.top_mlp[0]) == (0.1, 5, 1024)


def test_train_preset_runs_on_the_mlperf_shape(tmp_path, capsys):
    """The MLPerf configuration trains in hotline mode on multi-hot MLPerf-shaped data (interaction dot until
    the dcn op is there)."""

    ds = tmp_path / "ds"
    main(["data", "synthetic", "--preset", "mlperf-dcnv2", "--variable-bags", "--rows", "1400",
          "--max-rows-per-table", "400", "--out", str(ds), "--no-progress"])  # fmt: skip
    capsys.readouterr()
    extra = [] if _has_dcn() else [
        "--arch-interaction-op", "dot"]  # fmt: skip
    rc = main(["train", str(ds), "--preset", "mlperf-dcnv2", "--mode", "hotline", "--hbm-budget", "64KiB",
               "--mini-batch-size", "256", "--num-batches", "3", "--eval-max-samples", "200", "--no-progress",
               *extra])  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert '"steps": 3' in out.out


def _has_dcn() -> bool:
    from hotline.models import dlrm

    return "dcn" in getattr(dlrm, "INTERACTIONS", ())
