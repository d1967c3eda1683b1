"""``hotline train``'s starting files are looked into before any long work (``--mode auto``'s timing, the model
built): ``--load`` of a file that is no Hotline checkpoint and ``--init-params`` of a file that is no parameter
.npz are one line first (:func:`hotline.cli.train.check_start_files`); a negative size is named by its flag,
not taken for a missing value."""

from __future__ import annotations

import argparse
import contextlib

import numpy as np
import pytest
import torch

from hotline.cli import main
from hotline.cli.train import check_start_files


def _args(load=None, init_params=None) -> argparse.Namespace:
    return argparse.Namespace(load=load, init_params=init_params)


def test_a_file_of_another_kind_is_refused_before_any_long_work(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n')
    torch.save({"model": {}}, tmp_path / "other.pt")
    torch.save({"format": "hotline-checkpoint/1"}, tmp_path / "c.pt")  # the format a checkpoint declares
    np.savez(tmp_path / "p.npz", w=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"^checkpoint .*m\.jsonl cannot be loaded: "):
        check_start_files(_args(load=str(tmp_path / "m.jsonl")))
    with pytest.raises(ValueError, match=r"other\.pt is not a Hotline checkpoint"):
        check_start_files(_args(load=str(tmp_path / "other.pt")))
    with pytest.raises(ValueError, match=r"^--init-params .*c\.pt: not a parameter \.npz: it holds \["):
        check_start_files(_args(init_params=str(tmp_path / "c.pt")))
    with pytest.raises(ValueError, match=r"^--init-params .*m\.jsonl: not a readable parameter \.npz"):
        check_start_files(_args(init_params=str(tmp_path / "m.jsonl")))
    check_start_files(_args(load=str(tmp_path / "c.pt"), init_params=str(tmp_path / "p.npz")))  # looked into
    with pytest.raises(ValueError, match="--init-params"):
        check_start_files(_args(init_params=str(tmp_path)))  # a directory


@pytest.mark.parametrize(
    "argv,line",
    [
        (["train", "{t}/none", "--mode", "hybrid", "--cold-store", "disk", "--cold-dir", "{t}", "--cold-cache", "-1KiB"],
         "hotline train: error: --cold-cache: cannot read '-1KiB' as a size"),
        (["train", "{t}/none", "--mode", "hotline", "--hbm-budget", "-2.5GiB"],
         "hotline train: error: --hbm-budget: cannot read '-2.5GiB' as a size"),
        (["profile", "{t}/none", "--hbm-budget", "-1KiB"], "--hbm-budget: cannot read '-1KiB' as a size"),
    ],
)  # fmt: skip
def test_a_negative_size_is_named_by_its_flag(tmp_path, capsys, argv, line):
    """``--cold-cache -1KiB`` was argparse's "expected one argument": the value was taken for a flag."""
    with pytest.raises(SystemExit) if argv[0] == "profile" else contextlib.nullcontext():
        assert main([a.replace("{t}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert line in err[-1] and "expected one argument" not in err[-1], err
