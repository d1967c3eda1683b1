"""Nothing a user owns is lost: every path that used to delete or replace a user's file is tried here, and the
file is checked byte for byte afterwards; plus the top-level error handler and the checks before step 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate

SIZES = [40, 300, 25]
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
SMALL = [*ARCH, "--mini-batch-size", "32", "--no-progress", "--eval-max-samples", "64", "--threads", "1"]
SYNTH = ["--rows", "300", "--table-sizes", "40,300,25", "--zipf", "1.2", "--no-progress"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    ds = generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)
    raw = root / "raw.tsv"
    generate(root / "with_raw", 200, seed=2, table_sizes=[20] * 26, raw_tsv=raw, progress=False)
    return {"root": root, "ds": ds, "raw": raw}


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself) by relative name, with its bytes."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _one_error(capsys, command: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"hotline {command}: error: "), err[0]
    return err[0]


# ------------------------------------------------------------------------------ dataset outputs (--out)


def _documents(d: Path) -> Path:
    (d / "sub").mkdir(parents=True)
    (d / "thesis.tex").write_bytes(b"\\documentclass{article} my life's work\n")
    (d / "sub" / "photo.jpg").write_bytes(bytes(range(256)) * 8)
    return d


def test_synthetic_out_on_a_folder_of_documents_is_refused(tmp_path, capsys):
    docs = _documents(tmp_path / "docs")
    before = _tree(docs)
    for extra in ([], ["--overwrite"]):
        assert main(["data", "synthetic", "--out", str(docs), *SYNTH, *extra]) == 2
        line = _one_error(capsys, "data synthetic")
        assert "is not a Hotline dataset directory" in line and str(docs) in line
        assert _tree(docs) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]  # no temporary directory left either


def test_out_on_a_regular_file_is_refused(data, tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_bytes(b"do not rename me\n")
    assert main(["data", "synthetic", "--out", str(f), *SYNTH, "--overwrite"]) == 2
    assert "is not a dataset directory" in _one_error(capsys, "data synthetic")
    assert main(["data", "criteo", str(data["raw"]), "--out", str(f), "--no-progress"]) == 2
    assert "is not a dataset directory" in _one_error(capsys, "data criteo")
    assert f.read_bytes() == b"do not rename me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_existing_dataset_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["data", "synthetic", "--out", str(out), *SYNTH]) == 0
    before = _tree(out)
    assert main(["data", "synthetic", "--out", str(out), *SYNTH, "--seed", "7"]) == 2
    assert "pass --overwrite" in _one_error(capsys, "data synthetic")
    assert _tree(out) == before
    assert main(["data", "synthetic", "--out", str(out), *SYNTH, "--seed", "7", "--overwrite"]) == 0
    assert _tree(out) != before and Dataset(out).meta["source"]["seed"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # the old one is gone, nothing else left


def test_empty_out_directory_is_used(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["data", "synthetic", "--out", str(tmp_path / "empty"), *SYNTH]) == 0
    assert len(Dataset(tmp_path / "empty").train) > 0


def test_criteo_out_holding_the_raw_input_is_refused(data, tmp_path, capsys):
    folder = tmp_path / "criteo"
    folder.mkdir()
    raw = folder / "train.txt"
    raw.write_bytes(data["raw"].read_bytes())
    (folder / "README").write_text("downloaded 2024-01-01\n")
    before = _tree(folder)
    for out in (folder, tmp_path):  # the input's own folder, and one above it
        assert main(["data", "criteo", str(raw), "--out", str(out), "--no-progress", "--overwrite"]) == 2
        assert "would delete it" in _one_error(capsys, "data criteo")
        assert _tree(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["README", "train.txt"]


def test_criteo_out_holding_the_raw_input_refused_even_if_it_is_a_dataset(data, tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["data", "criteo", str(data["raw"]), "--out", str(out), "--no-progress"]) == 0
    raw = out / "day_0"  # a raw file kept inside a Hotline dataset directory
    raw.write_bytes(data["raw"].read_bytes())
    before = _tree(out)
    assert main(["data", "criteo", str(raw), "--out", str(out), "--no-progress", "--overwrite"]) == 2
    assert "would delete it" in _one_error(capsys, "data criteo")
    assert _tree(out) == before


def test_synthetic_raw_tsv_inside_out_is_refused(tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["data", "synthetic", "--out", str(out), *SYNTH]) == 0
    before = _tree(out)
    argv = ["data", "synthetic", "--out", str(out), *SYNTH, "--overwrite", "--raw-tsv", str(out / "raw.tsv")]
    assert main(argv) == 2
    assert "would delete it" in _one_error(capsys, "data synthetic")
    assert _tree(out) == before
