"""An adversarial pass over every command (the disk tier, DCN, the MLPerf preset, day files, auto,
calibrate, evaluate / predict / export / report, data, profile, plan), each case run as a user would: exit 2,
one line naming what is wrong and where, no traceback, and nothing written. A file of a Hotline dataset is
never replaced by another command's output, even with ``--force`` (``calibrate --out ds/meta.json --force``
and ``export ds/train_dense.npy --force`` destroyed the dataset)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hotline.cli import main
from tests.test_last_inputs import SMALL  # the tiny model of every CLI case


def _days(d: Path, n_days: int, rows: int, labels: int, ids: int) -> None:
    rng = np.random.default_rng(0)
    d.mkdir()
    for i in range(n_days):
        np.save(d / f"day_{i}_dense.npy", rng.random((rows, 13), dtype=np.float32))
        np.save(d / f"day_{i}_labels.npy", rng.integers(0, 2, (labels, 1)).astype(np.int32))
        np.save(d / f"day_{i}_sparse.npy", rng.integers(0, 1000, (rows, ids)).astype(np.int64))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A dataset, another of other table sizes, a checkpoint, a metrics file, day-file folders (one day;
    labels of another length; 25 id columns) and files of the wrong kind."""
    w = tmp_path_factory.mktemp("pass")
    data = ["data", "synthetic", "--rows", "600", "--no-progress", "--out"]
    assert main([*data, str(w / "ds"), "--table-sizes", "20,30,9"]) == 0
    assert main([*data, str(w / "other"), "--table-sizes", "20,31,9"]) == 0
    train = ["train", str(w / "ds"), "--mode", "device", "--num-batches", "2", *SMALL]
    assert main([*train, "--save", str(w / "ck.pt")]) == 0
    assert main([*train, "--metrics", str(w / "m.jsonl")]) == 0
    (w / "empty.json").write_text("")
    (w / "exists.txt").write_text("mine")
    (w / "afile").write_text("x")
    (w / "obj.jsonl").write_text('{"a": 1, "b": [1, 2]}\n')
    for name in ("dirout", "c2", "c4"):
        (w / name).mkdir()
    _days(w / "days1", 1, 5, 5, 26)
    _days(w / "daysmis", 2, 5, 4, 26)
    _days(w / "days26", 2, 5, 5, 25)
    return w


def _tree(w: Path) -> dict[str, int]:
    return {str(p.relative_to(w)): p.stat().st_size for p in w.rglob("*") if p.is_file()}


CASES = [
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--mode", "hybrid", "--cold-store", "disk"],
        "--cold-store disk needs --cold-dir DIR (where its file goes)",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode hybrid --cold-store disk --cold-dir nonexist".split(),
        "--cold-dir nonexist is not a directory",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode hybrid --cold-store disk --cold-dir afile".split(),
        "--cold-dir afile is not a directory",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode hybrid --cold-store disk --cold-dir c1 --cold-cache abc".split(),
        "cannot read 'abc' as a size: expected a non-negative number with an optional unit B, KiB, MiB, GiB,",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode hybrid --cold-store disk --cold-dir c1 --cold-io-depth 0".split(),
        "--cold-io-depth must be in [1, 1024] (reads in flight, one I/O thread each), got 0",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode hybrid --cold-store disk --cold-dir ds".split(),
        "--cold-dir ds is DATASET ds, an input of this command: refused even with --force (it would be destro",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode device --cold-store disk --cold-dir dirout".split(),
        "--cold-store disk keeps the cold rows of --mode hybrid, hotline or auto (not --mode device)",
    ),
    (
        "train ds @SMALL --num-batches 2 --arch-interaction-op dcn --dcn-num-layers 0".split(),
        "--dcn-num-layers and --dcn-low-rank-dim must be >= 1, got 0 and 512",
    ),
    (
        "train ds @SMALL --num-batches 2 --arch-interaction-op dcn --dcn-low-rank-dim -5".split(),
        "--dcn-num-layers and --dcn-low-rank-dim must be >= 1, got 3 and -5",
    ),
    (
        "train ds @SMALL --num-batches 2 --arch-interaction-op dcn --dcn-num-layers 1025".split(),
        "--dcn-num-layers must be at most 1024, got 1025: every cross layer runs in sequence in every step (D",
    ),
    (
        "train ds @SMALL --num-batches 2 --arch-interaction-op cat --dcn-num-layers 2".split(),
        "--dcn-num-layers has an effect with --arch-interaction-op dcn only; --arch-interaction-op cat would",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--arch-mlp-top", "8-2"],
        "--arch-mlp-top must end with 1 (one logit), got [8, 2]",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--mode", "auto", "--hardware", "nonexist.json"],
        "hardware file nonexist.json does not exist",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--mode", "auto", "--hardware", "H999"],
        "hardware 'H999': neither a JSON file nor a known GPU (H100, H200)",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--mode", "auto", "--hardware", "empty.json"],
        "hardware file empty.json is not valid JSON: Expecting value: line 1 column 1 (char 0)",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--mode", "auto", "--hardware", "ck.pt"],
        "hardware file ck.pt is not valid JSON",
    ),
    (["train", "ds", "@SMALL", "--nproc", "0"], "--nproc must be >= 1, got 0"),
    (
        ["train", "ds", "@SMALL", "--num-batches", "-1"],
        "num_batches (--num-batches) must be >= 0, got -1",
    ),
    (
        ["train", "ds", "@SMALL", "--mini-batch-size", "0"],
        "mini_batch_size (--mini-batch-size) must be positive, got 0",
    ),
    (
        ["train", "ds", "@SMALL", "--learning-rate", "nan"],
        "learning rate (--learning-rate) must be positive and at most 3.403e+38 (float32's largest), got nan",
    ),
    (["train", "ds", "@SMALL", "--resume"], "--checkpoint-every and --resume need --checkpoint-dir"),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--save", "ds/meta.json"],
        "--save ds/meta.json is inside DATASET ds, an input of this command: refused even with --force (it wo",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--metrics", "ck.pt"],
        "--metrics ck.pt exists: pass --force to replace it, or choose another name",
    ),
    (
        ["train", "ds", "@SMALL", "--num-batches", "2", "--mode", "hotline", "--placement", "ck.pt"],
        "placement file ck.pt is corrupt or not a Hotline placement: 'format is not a file in the archive'",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode auto --hardware H200 --hbm-budget 1KiB --placement x.npz".split(),
        "--hardware has an effect with --mode auto only; --mode hotline would ignore it",
    ),
    (
        "train ds @SMALL --num-batches 2 --mode hybrid --cold-store disk --cold-dir c4 --metrics c4/hotline-cold-rows.bin.json".split(),
        "--metrics c4/hotline-cold-rows.bin.json and --cold-dir (the disk store's header) c4/hotline-cold-row",
    ),
]


def one_line_and_nothing_written(work: Path, monkeypatch, capsys, argv: list[str], says: str) -> None:
    """``hotline *argv`` in ``work`` (``@SMALL``: the small model's flags) exits 2 with one error line holding
    ``says``, and leaves every file of ``work`` as it was."""
    monkeypatch.chdir(work)
    argv = [t for a in argv for t in (SMALL if a == "@SMALL" else [a])]
    before = _tree(work)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": error: " in err[0], err
    assert says in err[0], err[0]
    assert _tree(work) == before  # nothing written, nothing replaced


@pytest.mark.parametrize("argv,says", CASES, ids=[f"{i:02d}-{c[0][0]}" for i, c in enumerate(CASES)])
def test_a_user_mistake_is_one_line_and_writes_nothing(work, monkeypatch, capsys, argv, says):
    one_line_and_nothing_written(work, monkeypatch, capsys, argv, says)


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_a_kjt_of_two_dimensional_values_is_one_line():
    """2-D ids in a KeyedJaggedTensor gave numpy's "cannot reshape array of size 6 into shape (2,1,1)"."""
    torch = pytest.importorskip("torch")
    torchrec = pytest.importorskip("torchrec")
    from hotline.placement import Placement
    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    configs = [torchrec.EmbeddingBagConfig(name=f"t_{t}", embedding_dim=4, num_embeddings=n,
                                           feature_names=[f"f{t}"]) for t, n in enumerate([30, 50])]  # fmt: skip
    module = HotlineEmbeddingBagCollection(configs, Placement.all_cold([30, 50], embedding_dim=4))
    kjt = torchrec.KeyedJaggedTensor(keys=["f0", "f1"], values=torch.arange(1, 7).reshape(2, 3),
                                     lengths=torch.tensor([1, 0, 2, 1, 1, 1]))  # fmt: skip
    with pytest.raises(ValueError, match=r"its values have shape \(2, 3\), not one id per value \(1-D\)"):
        module(kjt)
