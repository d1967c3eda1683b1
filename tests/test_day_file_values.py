"""``hotline data criteo --day-files``: day files that hold something other than data are refused at
``hotline data``, one line naming the file and the row, and no dataset is written: an empty day file (0
train or 0 val/test rows), a negative id (taken modulo the table size it would land on another row), a label
outside [0, 1], a NaN or infinite dense value."""

from __future__ import annotations

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.criteo_days import DayFileError, convert_days

ROWS = (5, 4, 7)
SIZES = [7 + t for t in range(26)]


def _days(d, multi_hot: bool = False) -> None:
    rng = np.random.default_rng(0)
    for i, n in enumerate(ROWS):
        np.save(d / f"day_{i}_dense.npy", rng.random((n, 13), dtype=np.float32))
        np.save(d / f"day_{i}_labels.npy", rng.integers(0, 2, (n, 1)).astype(np.int32))
        np.save(d / f"day_{i}_sparse.npy", rng.integers(0, 1000, (n, 26)).astype(np.int64))
        if multi_hot:
            bags = {str(t): rng.integers(0, 1000, (n, 2)).astype(np.int64) for t in range(26)}
            np.savez(d / f"day_{i}_sparse_multi_hot.npz", **bags)


def _edit(path, fn) -> None:
    a = np.load(path)
    fn(a)
    np.save(path, a)


def _bad_bag(d) -> None:
    z = dict(np.load(d / "day_0_sparse_multi_hot.npz"))
    z["7"][3, 1] = -4
    np.savez(d / "day_0_sparse_multi_hot.npz", **z)


def _rows(d, day: int, n: int) -> None:
    np.save(d / f"day_{day}_dense.npy", np.zeros((n, 13), np.float32))
    np.save(d / f"day_{day}_labels.npy", np.zeros((n, 1), np.int32))
    np.save(d / f"day_{day}_sparse.npy", np.zeros((n, 26), np.int64))


CASES = {
    "empty train day": (lambda d: _rows(d, 1, 0), "day_1_dense.npy holds 0 rows"),
    "empty last day": (lambda d: _rows(d, 2, 0), "day_2_dense.npy holds 0 rows"),
    "one-row last day": (lambda d: _rows(d, 2, 1), "day_2_dense.npy holds 1 row"),
    "negative id": (lambda d: _edit(d / "day_2_sparse.npy", lambda a: a.__setitem__((5, 3), -1)),
                    "day_2_sparse.npy, row 5: table 3's id is -1"),
    "label 2": (lambda d: _edit(d / "day_0_labels.npy", lambda a: a.__setitem__((4, 0), 2)),
                "day_0_labels.npy, row 4: the label is 2"),
    "label -1": (lambda d: _edit(d / "day_2_labels.npy", lambda a: a.__setitem__((6, 0), -1)),
                 "day_2_labels.npy, row 6: the label is -1"),
    "NaN dense": (lambda d: _edit(d / "day_1_dense.npy", lambda a: a.__setitem__((2, 11), np.nan)),
                  "day_1_dense.npy, row 2, column 11: the value is nan"),
    "inf dense": (lambda d: _edit(d / "day_2_dense.npy", lambda a: a.__setitem__((0, 0), np.inf)),
                  "day_2_dense.npy, row 0, column 0: the value is inf"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_day_file_that_is_not_data_is_refused_naming_file_and_row(tmp_path, capsys, case):
    src = tmp_path / "days"
    src.mkdir()
    _days(src)
    make, says = CASES[case]
    make(src)
    argv = ["data", "criteo", "--day-files", str(src), "--table-sizes", ",".join(map(str, SIZES)), "--out",
            str(tmp_path / "o"), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_negative_id_in_a_multi_hot_member_is_named(tmp_path):
    src = tmp_path / "days"
    src.mkdir()
    _days(src, multi_hot=True)
    _bad_bag(src)
    with pytest.raises(
        DayFileError, match=r"day_0_sparse_multi_hot\.npz \(member 7\), row 3: table 7's id is -4"
    ):
        convert_days(src, tmp_path / "o", SIZES, progress=False)


def test_good_day_files_still_convert(tmp_path):
    src = tmp_path / "days"
    src.mkdir()
    _days(src)
    convert_days(src, tmp_path / "o", SIZES, progress=False)
