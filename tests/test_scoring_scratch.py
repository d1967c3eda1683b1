"""``hotline evaluate`` / ``predict --scratch DIR``: a disk-store checkpoint's rows are copied into DIR while
it scores (not beside the checkpoint), under the one output policy."""

import json

import numpy as np
import pytest

from hotline import Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.training.checkpoint import save_checkpoint
from hotline.training.inference import trainer_from_checkpoint
from tests.test_checkpoint_rows import TABLES, _config, _placement


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    root = tmp_path_factory.mktemp("scratch")
    ds = Dataset(generate(root / "d", 600, seed=7, table_sizes=TABLES, zipf=1.3, progress=False))
    cold = root / "cold"
    cold.mkdir()
    tr = Trainer(_config(_placement(ds, root / "p.npz", 0.3), cold, steps=6), ds)
    try:
        tr.fit()
        ck = root / "ck" / "step-000000006.pt"
        save_checkpoint(tr, ck)
        want, _ = tr.predict(ds.split("val"), 0)
    finally:
        tr.close()
    return ds, ck, want


def test_the_rows_are_copied_into_the_scratch_directory(disk, tmp_path):
    ds, ck, want = disk
    scorer = trainer_from_checkpoint(ds, ck, progress=False, scratch_dir=tmp_path)
    try:
        store_file = scorer.mode.cold.host.file.path
        assert tmp_path in store_file.parents and ck.parent not in store_file.parents
        got, _ = scorer.predict(ds.split("val"), 0)
        np.testing.assert_array_equal(want, got)
    finally:
        scorer.close()
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone


def test_evaluate_with_scratch_scores_as_without(disk, tmp_path, capsys):
    ds, ck, _ = disk
    argv = ["evaluate", str(ds.path), "--load", str(ck), "--no-progress"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--scratch", str(tmp_path / "new" / "scratch")]) == 0
    assert json.loads(capsys.readouterr().out) == plain
    assert (tmp_path / "new" / "scratch").is_dir()  # made by the output policy; nothing left in it
    assert [p for p in (tmp_path / "new" / "scratch").iterdir() if not p.name.endswith("-lock")] == []


def test_a_scratch_inside_an_input_is_refused_in_one_line(disk, tmp_path, capsys):
    ds, ck, _ = disk
    out = tmp_path / "p.npy"
    code = main(
        ["predict", str(ds.path), "--load", str(ck), "--out", str(out), "--scratch", str(ds.path / "x")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--scratch" in err[0], err
    assert not out.exists() and not (ds.path / "x").exists()
