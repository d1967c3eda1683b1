"""The disk store's files (``hotline-cold-rows.bin``, its ``.json`` header and its ``.order.npy``) under the one
output policy: never written through a symbolic link, checked against the run's inputs and other outputs,
replaced only when provably the store's own by their content (a name or a manifest beside a file proves
nothing), or with ``--force``. The user's bytes are compared (sha256) before and after."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.synthetic import generate
from hotline.tiers.disk_store import cold_file
from hotline.tiers.store_files import check_cold_path, is_own_order, is_own_rows, manifest_path, order_path

ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
USER = b"a user's own file: not the disk store's to replace\n" * 3


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A dataset and one real disk store (its three files, to copy beside a user's file)."""
    root = tmp_path_factory.mktemp("store")
    ds = generate(root / "ds", 2000, seed=1, table_sizes=[40, 300, 25], zipf=1.2, progress=False)
    (root / "made").mkdir()
    assert main(_train(ds, root / "made")) == 0
    return root, ds


def _train(ds, cold, *extra) -> list[str]:
    return ["train", str(ds), *ARCH, "--mode", "hybrid", "--num-batches", "2", "--mini-batch-size", "32",
            "--no-progress", "--eval-max-samples", "64", "--threads", "1", "--cold-store", "disk", "--cold-dir",
            str(cold), *extra]  # fmt: skip


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("which", ["rows", "header", "order"])
def test_a_link_at_a_store_file_is_never_followed(env, tmp_path, capsys, which):
    """A link at any of the three names: refused (the target untouched); with --force the link itself is
    replaced by the store's file and the target is still the user's bytes."""
    root, ds = env
    mine = tmp_path / "thesis.txt"
    mine.write_bytes(USER)
    cold = tmp_path / "cold"
    cold.mkdir()
    name = {"rows": cold_file(cold), "header": manifest_path(cold_file(cold)),
            "order": order_path(cold_file(cold))}[which]  # fmt: skip
    name.symlink_to(mine)
    assert main(_train(ds, cold)) == 2
    line = _one_line(capsys)
    assert "symbolic link" in line and str(name) in line and "--force" in line
    assert mine.read_bytes() == USER and name.is_symlink()
    assert main(_train(ds, cold, "--force")) == 0
    assert mine.read_bytes() == USER and not name.is_symlink() and is_own_rows(cold_file(cold))


@pytest.mark.parametrize(
    "flag,suffix",
    [("--save", ""), ("--dump-params", ".order.npy"), ("--metrics", ".json"), ("--dump-init", "")],
)
def test_another_output_of_the_run_may_not_name_a_store_file(env, tmp_path, capsys, flag, suffix):
    """``--save DIR/hotline-cold-rows.bin`` and alike: refused even with --force, nothing written."""
    root, ds = env
    cold = tmp_path / "cold"
    cold.mkdir()
    assert main(_train(ds, cold, flag, f"{cold_file(cold)}{suffix}", "--force")) == 2
    line = _one_line(capsys)
    assert "are the same file" in line and "disk store" in line and flag in line, line
    assert not any(cold.iterdir())


def test_a_store_file_is_not_an_input_of_the_run(env, tmp_path, capsys):
    root, ds = env
    cold = tmp_path / "cold"
    shutil.copytree(root / "made", cold)
    before = _sha(cold_file(cold))
    assert main(_train(ds, cold, "--init-params", str(order_path(cold_file(cold))), "--force")) == 2
    assert "an input of this command" in _one_line(capsys)
    assert _sha(cold_file(cold)) == before


@pytest.mark.parametrize("which", ["rows", "header", "order"])
def test_a_users_file_beside_a_real_manifest_is_kept(env, tmp_path, capsys, which):
    """The store's other two files are real (copied from a store), the third is a user's file (an earlier
    ``--save`` there, say): refused without --force, its bytes unchanged; a manifest beside it proves
    nothing."""
    root, ds = env
    cold = tmp_path / "cold"
    shutil.copytree(root / "made", cold)
    name = {"rows": cold_file(cold), "header": manifest_path(cold_file(cold)),
            "order": order_path(cold_file(cold))}[which]  # fmt: skip
    if which == "order":  # an .npy of the same shape and kind: only its content tells it apart
        np.save(name, np.arange(np.load(name).shape[0])[::-1].astype(np.int64))
    else:
        name.write_bytes(USER)
    before = _sha(name)
    assert main(_train(ds, cold)) == 2
    line = _one_line(capsys)
    assert str(name) in line and "exists: pass --force" in line, line
    assert _sha(name) == before
    with pytest.raises(ValueError, match="not the disk store's own file by its content"):
        check_cold_path(cold_file(cold))
    assert main(_train(ds, cold, "--force")) == 0  # with --force it is replaced by the store's own
    assert is_own_rows(cold_file(cold)) and is_own_order(order_path(cold_file(cold)))


def test_the_stores_own_files_are_made_again_without_force(env, tmp_path):
    root, ds = env
    cold = tmp_path / "cold"
    shutil.copytree(root / "made", cold)
    assert main(_train(ds, cold)) == 0 and main(_train(ds, cold)) == 0


def test_a_users_file_where_save_streams_the_rows_is_refused_before_training(env, tmp_path, capsys):
    """``--save M.pt`` of a disk-store run also writes ``M.pt.rows``: a user's file there is named before any
    step (not after the training), its bytes unchanged."""
    root, ds = env
    cold = tmp_path / "cold"
    cold.mkdir()
    save = tmp_path / "model.pt"
    rows = tmp_path / "model.pt.rows"
    rows.write_bytes(USER)
    assert main(_train(ds, cold, "--save", str(save))) == 2
    line = _one_line(capsys)
    assert "--save (its rows)" in line and str(rows) in line, line
    assert rows.read_bytes() == USER and not save.exists() and not any(cold.iterdir())
