"""The adversarial pass of ``tests/test_bad_input_pass.py`` over the commands other than ``train`` (data,
profile, plan, calibrate, evaluate, predict, export, report): each case exit 2, one line naming what is wrong
and where, nothing written."""

from __future__ import annotations

import pytest

from tests.test_bad_input_pass import one_line_and_nothing_written, work  # noqa: F401  (work: the fixture)

CASES = [
    (
        ["data", "synthetic", "--out", "p0", "--rows", "0", "--preset", "mlperf-dcnv2", "--no-progress"],
        "--rows must be >= 1 (a dataset needs rows to train on), got 0",
    ),
    (
        ["data", "criteo", "--day-files", "days1", "--out", "d1", "--no-progress"],
        "days1: one day file only; the last day is val/test, so at least 2 are needed",
    ),
    (
        ["data", "criteo", "--day-files", "daysmis", "--out", "d2", "--no-progress"],
        "daysmis/day_0: dense (5, 13) and labels (4, 1) do not match (expected [n, 13] and [n] or [n, 1])",
    ),
    (
        ["data", "criteo", "--day-files", "days26", "--out", "d3", "--no-progress"],
        "days26/day_0_sparse.npy has shape (5, 25), expected [n, 26]",
    ),
    (
        ["data", "criteo", "--day-files", "afile", "--out", "d4", "--no-progress"],
        "day-file directory afile does not exist",
    ),
    (
        ["data", "criteo", "--day-files", "days26", "--multi-hot", "yes", "--out", "d5", "--no-progress"],
        "days26/day_0_sparse_multi_hot.npz is missing (day_0 has the multi-hot form)",
    ),
    (
        ["data", "criteo", "--day-files", "empty_dir_nonexist", "--out", "d6", "--no-progress"],
        "day-file directory empty_dir_nonexist does not exist",
    ),
    (["calibrate", "--out", "dirout"], "--out dirout is a directory: give a file name"),
    (
        ["calibrate", "--out", "hw2.json", "--disk", "afile", "--disk-only"],
        "--disk afile exists and is not a directory: refusing to replace it",
    ),
    (
        ["calibrate", "--out", "hw3.json", "--disk", ".", "--disk-only", "--disk-record-bytes", "0"],
        "--disk-record-bytes must be a positive multiple of 4, got 0",
    ),
    (
        ["calibrate", "--out", "exists.txt", "--disk", ".", "--disk-only"],
        "--out exists.txt exists: pass --force to replace it, or choose another name",
    ),
    (
        ["calibrate", "--out", "ds/meta.json", "--disk", ".", "--disk-only", "--force"],
        "--out ds/meta.json is a file of dataset",
    ),
    (
        ["evaluate", "ds", "--load", "ck.pt", "--eval-max-samples", "-1"],
        "--eval-max-samples must be >= 0, got -1",
    ),
    (
        ["evaluate", "other", "--load", "ck.pt"],
        "ck.pt was made for 3 tables of sizes [20, 30, 9]..., this dataset has [20, 31, 9]...: a checkpoint o",
    ),
    (["evaluate", "ds", "--load", "ds"], "checkpoint ds is a directory, not a file"),
    (
        ["evaluate", "ds", "--load", "m.jsonl"],
        "checkpoint m.jsonl cannot be loaded: the safe loader refuses it (Unsupported operand 123): unsafe (a",
    ),
    (
        ["evaluate", "ds", "--load", "ck.pt", "--device", "tpu"],
        "--device 'tpu' is not a device: Expected one of cpu, cuda, ipu, xpu, mkldnn, opengl, opencl, ideep,",
    ),
    (
        ["evaluate", "ds", "--load", "ck.pt", "--threads", "-1"],
        "--threads must be >= 0 (0: all cores), got -1",
    ),
    (
        ["evaluate", "ds", "--load", "ck.pt", "--arch-sparse-feature-size", "8"],
        "checkpoint ck.pt was trained with embedding_dim = 4, the flags ask for 8: leave the --arch-* flags o",
    ),
    (
        ["predict", "ds", "--load", "ck.pt", "--out", "p.csv"],
        "--out p.csv: expected a .parquet or .npy file name",
    ),
    (
        ["predict", "ds", "--load", "ck.pt", "--out", "ds/train_dense.npy"],
        "--out ds/train_dense.npy is inside DATASET ds, an input of this command: refused even with --force (",
    ),
    (
        ["predict", "ds", "--load", "ck.pt", "--out", "dirout"],
        "--out dirout is a directory: give a file name",
    ),
    (
        ["export", "ck.pt", "--load", "ck.pt", "--force"],
        "OUT ck.pt is --load ck.pt, an input of this command: refused even with --force (it would be destroye",
    ),
    (["export", "dirout", "--load", "ck.pt"], "OUT dirout is a directory: give a file name"),
    (
        ["export", "e.pt", "--load", "m.jsonl"],
        "checkpoint m.jsonl cannot be loaded: the safe loader refuses it (Unsupported operand 123): unsafe (a",
    ),
    (
        ["export", "ds/train_dense.npy", "--load", "ck.pt", "--force"],
        "OUT ds/train_dense.npy is a file of dataset",
    ),
    (
        ["report", "m.jsonl", "--out", "exists.txt"],
        "--out exists.txt exists: pass --force to replace it, or choose another name",
    ),
    (
        ["report", "m.jsonl", "--out", "m.jsonl", "--force"],
        "--out m.jsonl is METRICS.jsonl m.jsonl, an input of this command: refused even with --force (it woul",
    ),
    (["profile", "ds", "--sample-fraction", "2"], "sample_fraction must be in (0, 1], got 2.0"),
    (
        ["profile", "ds", "--hbm-budget", "1KiB", "--always-hot", "7"],
        "always-hot table 7 does not exist (tables are 0..2)",
    ),
    (["plan", "ds", "--world-size", "0"], "world_size must be at least 1, got 0"),
    (
        ["data", "synthetic", "--out", "s1", "--rows", "-5", "--no-progress"],
        "--rows must be >= 1 (a dataset needs rows to train on), got -5",
    ),
    (
        ["data", "synthetic", "--out", "s2", "--rows", "100", "--table-sizes", "0,5", "--no-progress"],
        "table_sizes[0] must be an integer in [1, 2**31), got 0",
    ),
    (
        "data synthetic --out s3 --rows 100 --table-sizes 5,5 --zipf -1 --no-progress".split(),
        "zipf exponent of table 0 must be in [0, 10], got -1.0",
    ),
    (
        "data synthetic --out s4 --rows 100 --table-sizes 5,5 --bag-sizes 2 --no-progress".split(),
        "bag_sizes must be 2 integers >= 1 (one per table), got (2,)",
    ),
    (
        "data synthetic --out s5 --rows 100 --table-sizes 5,5 --drift-days 0 --no-progress".split(),
        "drift_days must be an integer >= 1, got 0",
    ),
    (
        "data synthetic --out s6 --rows 100 --table-sizes 5,5 --pooling-factor 2 --bag-sizes 1,2 --no-progress".split(),
        "give bag_sizes or pooling_factor, not both",
    ),
    (
        ["report", "m.jsonl", "--out", "ds/val_labels.npy", "--force"],
        "--out ds/val_labels.npy is a file of dataset",
    ),
    (
        ["profile", "ds", "--hbm-budget", "1KiB", "--always-hot", "7", "--no-progress"],
        "always-hot table 7 does not exist (tables are 0..2)",
    ),
    (
        ["report", "empty.json", "--out", "r1.png"],
        "empty.json has no training records (kind 'train'): was it written by `hotline train --metrics`?",
    ),
    (["report", "nonexist.jsonl", "--out", "r2.png"], "metrics file nonexist.jsonl does not exist"),
    (
        ["report", "obj.jsonl", "--out", "r3.png"],
        "obj.jsonl, line 1: not a Hotline metrics record (no 'kind')",
    ),
    (
        ["report", "ck.pt", "--out", "r4.png"],
        "ck.pt, line 1: not text (a metrics file holds JSON records, one a line)",
    ),
    (["report", "ds", "--out", "r5.png"], "metrics file ds is a directory, not a file"),
    (["report", "m.jsonl", "--out", "r6.txt"], "--out r6.txt: expected a .png, .svg or .pdf file name"),
    (["report", "m.jsonl", "--out", "dirout"], "--out dirout is a directory: give a file name"),
    (
        ["data", "synthetic", "--out", "afile", "--rows", "100", "--table-sizes", "5,5", "--no-progress"],
        "--out afile exists and is not a dataset directory: refusing to replace it",
    ),
    (
        ["data", "synthetic", "--out", "ds", "--rows", "100", "--table-sizes", "5,5", "--no-progress"],
        "--out ds: output directory already holds a Hotline dataset: pass --force to replace it",
    ),
    (
        "data synthetic --out p1 --rows 100 --table-sizes 5,5 --raw-tsv ds/meta.json --no-progress --force".split(),
        "--raw-tsv ds/meta.json is a file of dataset",
    ),
    (
        ["profile", "ds", "--predict", "--hbm-budget", "1KiB", "--hardware", "empty.json", "--no-progress"],
        "hardware file empty.json is not valid JSON: Expecting value: line 1 column 1 (char 0)",
    ),
    (
        ["profile", "ds", "--predict", "--hbm-budget", "1KiB", "--arch-mlp-bot", "13-8-5", "--no-progress"],
        "--arch-mlp-bot 13-8-5 must end with the embedding dim 16 (--embedding-dim)",
    ),
    (
        "profile ds --predict --hbm-budget 1KiB --arch-interaction-op dcn --dcn-low-rank-dim 0 --no-progress".split(),
        "--dcn-num-layers and --dcn-low-rank-dim must be >= 1, got 3 and 0",
    ),
    (
        ["profile", "ds", "--hbm-budget", "1KiB", "--out", "ck.pt", "--no-progress"],
        "--out ck.pt exists: pass --force to replace it, or choose another name",
    ),
    (
        ["plan", "ds", "--placement", "ck.pt"],
        "placement file ck.pt is corrupt or not a Hotline placement: 'format is not a file in the archive'",
    ),
    (["plan", "ds", "--hbm-per-gpu", "0"], "hbm_per_device must be positive"),
    (
        ["evaluate", "ds", "--load", "ck.pt", "--arch-interaction-op", "dcn"],
        "checkpoint ck.pt was trained with interaction = dot, the flags ask for dcn: leave the --arch-* flags",
    ),
    (
        ["evaluate", "ds", "--load", "ck.pt", "--dcn-num-layers", "2"],
        "--dcn-num-layers has an effect with --arch-interaction-op dcn only; --arch-interaction-op dot (the c",
    ),
    (
        ["export", "e9.pt", "--load", "ck.pt", "--dcn-low-rank-dim", "8"],
        "--dcn-low-rank-dim has an effect with --arch-interaction-op dcn only; --arch-interaction-op dot (the",
    ),
    (
        ["predict", "ds", "--load", "ck.pt", "--out", "q.npy", "--dcn-num-layers", "3"],
        "--dcn-num-layers has an effect with --arch-interaction-op dcn only; --arch-interaction-op dot (the c",
    ),
    (
        ["calibrate", "--out", "hw9.json", "--disk-depth", "64"],
        "--disk-depth has an effect with --disk only; without --disk it would be ignored",
    ),
    (
        ["data", "criteo", "afile", "--out", "c9", "--multi-hot", "no", "--no-progress"],
        "--multi-hot has an effect with --day-files only; without --day-files it would be ignored",
    ),
    (
        ["data", "criteo", "--day-files", "days1", "--out", "c8", "--on-bad-line", "skip", "--no-progress"],
        "--on-bad-line has an effect without --day-files only; --day-files would ignore it",
    ),
    (
        ["profile", "ds", "--heldout", "none", "--heldout-fraction", "0.2", "--no-progress"],
        "--heldout-fraction has an effect with --heldout sample only; --heldout none would ignore it",
    ),
    (
        ["profile", "ds", "--hbm-budget", "1KiB", "--worker-threads", "2", "--no-progress"],
        "--worker-threads has an effect with --predict only; without --predict it would be ignored",
    ),
]


@pytest.mark.parametrize("argv,says", CASES, ids=[f"{i:02d}-{c[0][0]}" for i, c in enumerate(CASES)])
def test_a_user_mistake_is_one_line_and_writes_nothing(work, monkeypatch, capsys, argv, says):  # noqa: F811
    one_line_and_nothing_written(work, monkeypatch, capsys, argv, says)
