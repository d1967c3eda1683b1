"""Readers of files that a crash or a user can damage: one line naming the file (and the line, field or
row), never a traceback nor advice to load a file unsafely; a last line a crash cut short is skipped and
named."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from hotline import TrainConfig, Trainer
from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.tiers.disk_store import cold_file

RECORD = {"kind": "train", "step": 5, "loss": 0.7, "window_steps": 5, "time_s": {"gather": 0.01}}


def _report(tmp_path, text: bytes, capsys) -> tuple[int, list[str]]:
    path = tmp_path / "m.jsonl"
    path.write_bytes(text)
    code = main(["report", str(path), "--out", str(tmp_path / "r.png")])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "field,value,says",
    [("step", "5", "'step' is '5', not a step count"), ("step", -1, "'step' is -1"),
     ("loss", "high", "'loss' is 'high', not a number"), ("time_s", [1], "'time_s' is not an object"),
     ("window_steps", True, "'window_steps' is True, not a number")],
)  # fmt: skip
def test_report_names_the_file_line_and_field_of_a_record_of_the_wrong_type(
    tmp_path, capsys, field, value, says
):
    good = json.dumps(RECORD)
    code, err = _report(tmp_path, f"{good}\n{json.dumps({**RECORD, field: value})}\n".encode(), capsys)
    assert code == 2 and len(err) == 1, err
    assert f"m.jsonl, line 2: {says}" in err[0], err
    assert not (tmp_path / "r.png").exists()


def test_report_on_random_bytes_names_the_file_and_line(tmp_path, capsys):
    code, err = _report(tmp_path, f"{json.dumps(RECORD)}\n".encode() + bytes(range(128, 256)) + b"\n", capsys)
    assert code == 2 and len(err) == 1 and "m.jsonl, line 2: not text" in err[0], err


def test_report_skips_and_names_a_last_line_cut_by_a_crash(tmp_path, capsys):
    cut = json.dumps({**RECORD, "step": 10})[:17]
    code, err = _report(tmp_path, f"{json.dumps(RECORD)}\n{cut}".encode(), capsys)
    warned = [line for line in err if "warning" in line]
    assert code == 0 and len(warned) == 1 and not any("Traceback" in line for line in err), err
    assert "m.jsonl, line 2: its last line is cut short" in warned[0] and "skipped" in warned[0]
    assert (tmp_path / "r.png").stat().st_size > 0
    (tmp_path / "r.png").unlink()
    code, err = _report(
        tmp_path, f"{json.dumps(RECORD)}\n{cut}\n".encode(), capsys
    )  # a whole bad line: refused
    assert code == 2 and "line 2: not a JSON record" in err[0]


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize("kind", ["pickle", "junk", "cut"])
def test_a_checkpoint_without_its_digest_is_one_line_that_never_advises_an_unsafe_load(
    tmp_path, capsys, kind
):
    os.chdir(tmp_path)
    ds = generate(tmp_path / "ds", 400, seed=1, table_sizes=[20, 30], progress=False)
    path = tmp_path / "c.pt"
    if kind == "pickle":
        with open(path, "wb") as f:
            pickle.dump({"format": "hotline-checkpoint/1", "x": _Exploit()}, f, protocol=4)
    elif kind == "junk":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    else:
        torch.save({"format": "x", "w": torch.zeros(1000)}, path)
        os.truncate(path, 2000)
    for argv in (["train", str(ds), "--mode", "device", "--load", str(path), "--num-batches", "1", "--no-progress"],
                 ["evaluate", str(ds), "--load", str(path)], ["export", str(tmp_path / "e.pt"), "--load", str(path)]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert str(path) in err[0] and "no digest file c.pt.sha256" in err[0], err
        assert "weights_only" not in err[0] and "trusted source" not in err[0]
    assert not (tmp_path / "pwned").exists()


def test_nan_written_into_the_cold_file_under_a_run_names_the_file_and_row(tmp_path):
    ds = Dataset(generate(tmp_path / "ds", 3000, seed=2, table_sizes=[40, 300, 25], progress=False))
    cold = tmp_path / "cold"
    cold.mkdir()
    cfg = TrainConfig(mode="hybrid", mini_batch_size=64, num_batches=20, progress=False, embedding_dim=8,
                      bottom_mlp=[13, 16, 8], top_mlp=[16, 1], cold_store="disk", cold_dir=str(cold))  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        steps = tr.progress(tr.batches())
        next(steps)
        size = os.path.getsize(cold_file(cold)) - 4096  # the records (the last page names the file)
        fd = os.open(cold_file(cold), os.O_WRONLY)
        os.pwrite(fd, np.full(size // 4, np.nan, np.float32).tobytes(), 0)
        os.close(fd)
        with pytest.raises(
            ValueError, match=r"hotline-cold-rows\.bin: row \d+ \(record \d+ of the file\) holds nan"
        ):
            for _ in steps:
                pass
    finally:
        tr.close()


def test_a_diverging_run_is_still_the_loss_checks_to_name(tmp_path, capsys):
    """NaN rows that the run's own updates wrote are not blamed on the file."""
    ds = generate(tmp_path / "ds", 3000, seed=2, table_sizes=[40, 300, 25], progress=False)
    cold = tmp_path / "cold"
    cold.mkdir()
    argv = ["train", str(ds), "--mode", "hybrid", "--learning-rate", "3e38", "--num-batches", "30", "--no-progress",
            "--cold-store", "disk", "--cold-dir", str(cold)]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "lower --learning-rate?" in err and "never wrote" not in err
