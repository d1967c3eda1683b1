"""``hotline evaluate`` and ``predict`` of N-rank checkpoints (:func:`hotline.training.inference._ranks_trainer`):
a two-rank run's checkpoint (disk store, its delta, host memory), named by its stem or one rank's file, scores
as an independent reference does: the torchrec DLRM of its export (``nn.EmbeddingBag`` tables) run forward in
float64. A missing or damaged rank file is one line, before any work; the host memory is the one-process
case's, not the tables'."""

import json
import tracemalloc

import numpy as np
import pytest
import torch

from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.training import checkpoint_rows
from hotline.training.checkpoint_rows import rows_path
from hotline.training.export import keyed_jagged, load_torchrec_dlrm
from hotline.training.inference import trainer_from_checkpoint
from hotline.training.metrics import log_loss, roc_auc
from tests.test_checkpoint_rows import BATCH, CLI_ARCH, data  # noqa: F401 -- data: a fixture
from tests.test_export_ranks import two_ranks  # noqa: F401 -- a fixture

PROB_ATOL = 1e-6
"""float32 scoring against the float64 reference (another code path: Hotline's DLRM, torchrec's in float64):
the largest difference measured here is about 1e-7."""


def _reference(ckpt, ds: Dataset, tmp_path) -> np.ndarray:
    """The test split's probabilities from ``hotline export`` of ``ckpt``, torchrec's DLRM in float64."""
    out = tmp_path / f"ref-{abs(hash(str(ckpt)))}.pt"
    assert main(["export", str(out), "--load", str(ckpt), "--format", "torch-save"]) == 0
    module, config = load_torchrec_dlrm(out)
    module = module.double()
    test = ds.test
    with torch.no_grad():
        kjt = keyed_jagged(np.asarray(test.sparse), config["feature_names"])
        logits = module(torch.from_numpy(np.array(test.dense, np.float64)), kjt)
    return torch.sigmoid(logits).squeeze(1).numpy()


@pytest.fixture(scope="module")
def device_ranks(data, tmp_path_factory):  # noqa: F811 -- the fixture imported above
    """A two-rank ``--mode device`` run's checkpoint (rank 0's file holds the tables)."""
    ds, _, _ = data
    out = tmp_path_factory.mktemp("devranks") / "device.pt"
    argv = [str(ds.path), *CLI_ARCH, "--mode", "device", "--nproc", "2", "--optimizer", "rowwise-adagrad",
            "--learning-rate", "0.05", "--mini-batch-size", str(BATCH), "--no-progress", "--eval-max-samples",
            "64", "--num-batches", "10", "--save", str(out)]  # fmt: skip
    assert main(["train", *argv]) == 0
    return out


def _case(request, name):
    if name == "device-stem":
        return request.getfixturevalue("device_ranks")
    disk, memory = (request.getfixturevalue("two_ranks")[k][0] for k in ("disk", "memory"))
    return {
        "disk-stem": disk,
        "disk-rank1": disk.with_name("disk.rank001-of-002.pt"),
        "disk-delta": disk.parent / "ck-disk" / "step-000000010",  # each rank's rows file a delta on step 5's
        "memory-stem": memory,
    }[name]


@pytest.mark.parametrize("case", ["disk-stem", "disk-rank1", "disk-delta", "memory-stem", "device-stem"])
def test_a_two_rank_checkpoint_scores_as_its_export(data, request, case, tmp_path, capsys):  # noqa: F811
    ds = data[0]
    ckpt = _case(request, case)
    assert not ckpt.exists() or case == "disk-rank1"  # a stem: no file of that name
    want = _reference(ckpt, ds, tmp_path)
    capsys.readouterr()
    out = tmp_path / "p.npy"
    argv = [
        str(ds.path),
        "--load",
        str(ckpt),
        "--split",
        "test",
        "--no-progress",
        "--scratch",
        str(tmp_path / "s"),
    ]
    assert main(["predict", *argv, "--out", str(out)]) == 0, capsys.readouterr().err
    got = np.load(out, allow_pickle=False)
    assert np.array_equal(got["label"], np.asarray(ds.test.labels, np.float32).reshape(-1))
    assert np.abs(got["probability"] - want).max() <= PROB_ATOL, np.abs(got["probability"] - want).max()
    assert np.ptp(want) > 1e-3  # the model is not constant: the comparison means something
    assert main(["evaluate", *argv]) == 0
    metrics = json.loads(capsys.readouterr().out)
    labels = np.asarray(ds.test.labels, np.float64).reshape(-1)
    assert metrics["step"] == 10 and metrics["samples"] == len(labels)
    assert metrics["auc"] == pytest.approx(roc_auc(labels, want), abs=1e-6)
    assert metrics["logloss"] == pytest.approx(log_loss(labels, want), abs=1e-6)
    assert [p.name for p in (tmp_path / "s").iterdir() if not p.name.endswith("-lock")] == []


@pytest.fixture
def built(monkeypatch):
    """The Trainers built in this test (the real class, counted)."""
    from hotline.training.trainer import Trainer

    made, real = [], Trainer.__init__

    def counted(self, *args, **kw):
        made.append(args[0].mode)
        real(self, *args, **kw)

    monkeypatch.setattr(Trainer, "__init__", counted)
    return made


def _copy(src_base, dst, ranks=(0, 1)):
    """The files of ``src_base``'s ranks (checkpoint, digest, rows file) into ``dst``."""
    dst.mkdir()
    for r in ranks:
        for p in src_base.parent.glob(f"{src_base.stem}.rank{r:03d}-of-002.pt*"):
            (dst / p.name).write_bytes(p.read_bytes())
    return dst / src_base.name


@pytest.mark.parametrize("damage", ["missing", "rows", "digest"])
def test_a_missing_or_damaged_rank_file_is_one_line_before_any_work(data, two_ranks, damage, tmp_path,  # noqa: F811
                                                                    capsys, built):  # fmt: skip
    ds, base = data[0], two_ranks["disk"][0]
    ck = _copy(base, tmp_path / "ck", (0,) if damage == "missing" else (0, 1))
    one = ck.with_name("disk.rank001-of-002.pt")
    if damage != "missing":
        target = rows_path(one) if damage == "rows" else one
        raw = bytearray(target.read_bytes())
        raw[len(raw) // 2] ^= 0xFF  # a record's byte (the rows file), a tensor's (the checkpoint)
        target.write_bytes(bytes(raw))
    out, scratch = tmp_path / "p.npy", tmp_path / "s"
    for argv in (
        ["predict", str(ds.path), "--load", str(ck), "--out", str(out)],
        ["evaluate", str(ds.path), "--load", str(ck)],
    ):
        code = main([*argv, "--no-progress", "--scratch", str(scratch)])
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "Traceback" not in captured.err, err
        what = {"missing": "disk.rank001-of-002.pt is missing", "rows": "corrupt", "digest": "corrupt"}[
            damage
        ]
        assert what in err[0] and (damage == "missing" or one.name in err[0]), err
        assert captured.out == ""
    # refused before any model or store was built; a damaged rows file is found on its one pass (its sha256 on
    # the stream that fills the scoring store), before anything is scored or written
    assert built == ([] if damage != "rows" else ["hybrid", "hybrid"]) and not out.exists()
    assert [p.name for p in scratch.iterdir() if not p.name.endswith("-lock")] == []


def test_arch_flags_against_a_two_rank_checkpoint_are_one_line_before_any_work(data, two_ranks, capsys,  # noqa: F811
                                                                                built):  # fmt: skip
    """The flags are checked against rank 0's file (it holds the model) before the model is built."""
    ds, base = data[0], two_ranks["disk"][0]
    code = main(["evaluate", str(ds.path), "--load", str(base), "--arch-mlp-top", "64-1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "trained with top_mlp" in err[0], err
    assert built == []


def test_scoring_two_ranks_takes_the_memory_of_one_process(tmp_path, monkeypatch):
    """With the chunk at 64 KiB, scoring a two-rank disk-store checkpoint of 36 MB of rows and state
    allocates (tracemalloc: numpy's arrays, Python's buffers) what a one-process checkpoint's takes, a few chunks
    more at most: the ranks' rows stream, the tables are never whole in memory."""
    from hotline.datasets.synthetic import generate
    from tests.test_checkpoint_rows import _placement

    tables = [250_000] * 4
    ds = Dataset(generate(tmp_path / "d", 400, seed=1, table_sizes=tables, progress=False))
    placement = _placement(ds, tmp_path / "p.npz", 0.001)
    saved = {}
    for n in (1, 2):
        (tmp_path / f"c{n}").mkdir()
        argv = [str(ds.path), *CLI_ARCH, "--mode", "hotline", "--placement", placement, "--nproc", str(n),
                "--optimizer", "rowwise-adagrad", "--mini-batch-size", "64", "--num-batches", "3", "--no-progress",
                "--eval-max-samples", "64", "--cold-store", "disk", "--cold-dir", str(tmp_path / f"c{n}"),
                "--save", str(tmp_path / f"n{n}.pt")]  # fmt: skip
        assert main(["train", *argv]) == 0
        saved[n] = tmp_path / f"n{n}.pt"
    chunk = 64 << 10
    monkeypatch.setattr(checkpoint_rows, "CHUNK_BYTES", chunk)
    peaks: dict[str, int] = {}

    def measured(name, fn):
        """``fn``, the memory it allocates at its peak above what was allocated when it began in ``peaks``."""

        def run(*args, **kw):
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            try:
                return fn(*args, **kw)
            finally:
                peaks[name] = max(peaks.get(name, 0), tracemalloc.get_traced_memory()[1] - start)

        return run

    from hotline.training import checkpoint, export_sharded, inference

    monkeypatch.setattr(checkpoint, "load_checkpoint", measured("one: load", checkpoint.load_checkpoint))
    monkeypatch.setattr(inference, "_load_ranks", measured("two: load", inference._load_ranks))
    real_source = export_sharded.rank_source
    monkeypatch.setattr(export_sharded, "rank_source",
                        lambda *a: measured("two: sort", real_source(*a)))  # fmt: skip
    scores = {}
    tracemalloc.start()  # the store's build and initial fill are the same for both, and not measured
    try:
        for n, ck in saved.items():
            scorer = trainer_from_checkpoint(ds, ck, progress=False, scratch_dir=tmp_path)
            try:
                scores[n] = scorer.predict(ds.split("test"), 0)[0]
            finally:
                scorer.close()
    finally:
        tracemalloc.stop()
    table_bytes = sum(tables) * 4 * (8 + 1)
    two = max(peaks["two: sort"], peaks["two: load"])
    assert two <= peaks["one: load"] + 8 * chunk, peaks
    assert table_bytes > 3 * two, peaks
    assert np.ptp(scores[2]) > 1e-3 and np.abs(scores[2] - scores[1]).max() < 1e-3
