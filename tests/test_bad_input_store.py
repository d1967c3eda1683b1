"""A disk store an older Hotline wrote (header format ``hotline-cold-rows/1``: no last page naming the row
file, no order digest) cannot prove by its content that it is the store's: a run on it is refused in one line
that says what it is and that ``--force`` rebuilds it (its rows come from the model or the checkpoint), and
it is left byte for byte; with ``--force`` the run rebuilds it in the current format."""

from __future__ import annotations

import json
import os

import pytest

from hotline.cli import main
from hotline.tiers.store_files import FORMAT, PAGE
from tests.test_last_inputs import SMALL  # the tiny model of every CLI case

ROWS = "hotline-cold-rows.bin"


def _older(cold) -> None:
    """The store as format /1 wrote it: the header without its order digest, the rows without the last page."""
    header = cold / f"{ROWS}.json"
    m = json.loads(header.read_text())
    m["format"] = "hotline-cold-rows/1"
    m.pop("order_sha256")
    header.write_text(json.dumps(m, indent=2))
    os.truncate(cold / ROWS, (cold / ROWS).stat().st_size - PAGE)


@pytest.mark.parametrize("mode", ["hybrid", "hotline"])
def test_an_older_hotlines_store_is_named_and_force_rebuilds_it(tmp_path, capsys, mode):
    assert main(["data", "synthetic", "--out", str(tmp_path / "ds"), "--rows", "600", "--table-sizes", "20,30,9",
                 "--no-progress"]) == 0  # fmt: skip
    cold = tmp_path / "cold"
    cold.mkdir()
    hot = ["--hbm-budget", "1KiB"] if mode == "hotline" else []
    argv = ["train", str(tmp_path / "ds"), *SMALL, "--mode", mode, *hot, "--num-batches", "2",
            "--cold-store", "disk", "--cold-dir", str(cold)]  # fmt: skip
    assert main(argv) == 0
    _older(cold)
    before = {p.name: p.read_bytes() for p in cold.iterdir()}
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (
        f"{ROWS} is a disk store of an older Hotline (its header {ROWS}.json says hotline-cold-rows/1"
        in err[0]
    )
    assert "pass --force to rebuild it, or choose another --cold-dir" in err[0]
    assert {p.name: p.read_bytes() for p in cold.iterdir()} == before  # left as it was
    assert main([*argv, "--force"]) == 0
    assert json.loads((cold / f"{ROWS}.json").read_text())["format"] == FORMAT


def test_a_users_file_beside_no_header_still_only_exists(tmp_path, capsys):
    """Only a header of the store's own name says "older Hotline": a user's file is refused as before."""
    assert main(["data", "synthetic", "--out", str(tmp_path / "ds"), "--rows", "600", "--table-sizes", "20,30,9",
                 "--no-progress"]) == 0  # fmt: skip
    (tmp_path / "cold").mkdir()
    (tmp_path / "cold" / ROWS).write_text("my notes")
    argv = ["train", str(tmp_path / "ds"), *SMALL, "--mode", "hybrid", "--num-batches", "2", "--cold-store", "disk",
            "--cold-dir", str(tmp_path / "cold")]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{ROWS} exists: pass --force to replace it, or choose another name"), err
    assert (tmp_path / "cold" / ROWS).read_text() == "my notes"
