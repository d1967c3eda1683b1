"""Preflight covers every table and every array of every split: a bad id in the LAST table, and a NaN or an
out-of-range label, in train, val or test, stop the run before its first step, naming file and place.

(The older tests poison an early table and a dense feature; a preflight that skipped the last table or the
labels, or read only the training split, passed them.)
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.format import record_arrays
from hotline.datasets.synthetic import generate

SIZES = [40, 300, 25]
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
RUN = [
    *ARCH,
    "--mode",
    "device",
    "--mini-batch-size",
    "32",
    "--num-batches",
    "4",
    "--no-progress",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return generate(
        tmp_path_factory.mktemp("preflight") / "ds", 2000, seed=1, table_sizes=SIZES, progress=False
    )


def _poisoned(clean, tmp_path, split: str, array: str, poison) -> tuple:
    ds = tmp_path / "ds"
    shutil.copytree(clean, ds)
    a = np.load(ds / f"{split}_{array}.npy", mmap_mode="r+")
    where = poison(a)
    a.flush()
    del a
    record_arrays(ds)  # an edit on purpose: re-recorded, so the dataset is not refused as a swapped file
    return ds, where


def _refused_before_step_1(ds, tmp_path, capsys) -> str:
    metrics = tmp_path / "m.jsonl"
    assert main(["train", str(ds), *RUN, "--metrics", str(metrics)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hotline train: error: "), err
    assert not metrics.exists() or not metrics.read_text().strip(), "a step was taken"
    return err[0]


@pytest.mark.parametrize("split", ["train", "val", "test"])
@pytest.mark.parametrize("bad", ["too large", "negative"])
def test_a_bad_id_in_the_last_table_of_the_last_sample(clean, tmp_path, capsys, split, bad):
    last = len(SIZES) - 1

    def poison(sparse):
        s = sparse.shape[0] - 1
        sparse[s, last, 0] = SIZES[last] if bad == "too large" else -1
        return s

    ds, sample = _poisoned(clean, tmp_path, split, "sparse", poison)
    line = _refused_before_step_1(ds, tmp_path, capsys)
    assert f"{split}_sparse.npy, sample {sample}, table {last}: id" in line and f"[0, {SIZES[last]})" in line


@pytest.mark.parametrize("split", ["train", "val", "test"])
@pytest.mark.parametrize("value", [np.nan, 2.0, -1.0])
def test_a_nan_or_out_of_range_label_in_any_split(clean, tmp_path, capsys, split, value):
    def poison(labels):
        row = labels.shape[0] - 2
        labels[row] = value
        return row

    ds, row = _poisoned(clean, tmp_path, split, "labels", poison)
    line = _refused_before_step_1(ds, tmp_path, capsys)
    assert f"{split}_labels.npy, row {row}" in line
