"""``--eval-max-samples N`` scores exactly the first N samples, in ``evaluate``, ``predict`` and the trainer's own
validation; and a loss that stops being finite is reported at the step where it happened.

Both are behaviours an off-by-one breaks silently (N-1 samples still give an AUC; a message one step off still
reads well), so each is pinned against an independent figure: the AUC of the first N predictions of a full
``predict``, and the step counts that do and do not reach the non-finite loss.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.training.config import TrainConfig
from hotline.training.metrics import roc_auc
from hotline.training.trainer import Trainer

ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "16-8-1"]
N = 37  # not a multiple of any batch size below


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalsamples")
    ds = str(generate(root / "ds", 3000, seed=5, table_sizes=[50, 20, 200, 7], zipf=1.1, progress=False))
    ckpt = root / "run.pt"
    argv = [
        "train",
        ds,
        *ARCH,
        "--mode",
        "hybrid",
        "--num-batches",
        "12",
        "--no-progress",
        "--save",
        str(ckpt),
    ]
    assert main(argv) == 0
    return {"root": root, "ds": ds, "ckpt": ckpt}


def _predict(run, tmp, n: int, name: str) -> np.ndarray:
    out = tmp / f"{name}.npy"
    argv = [
        "predict",
        run["ds"],
        "--load",
        str(run["ckpt"]),
        "--split",
        "val",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main([*argv, *(["--eval-max-samples", str(n)] if n else [])]) == 0
    return np.load(out, allow_pickle=False)


def test_predict_writes_exactly_the_first_n_samples(run, tmp_path):
    full = _predict(run, tmp_path, 0, "all")
    first = _predict(run, tmp_path, N, "first")
    assert len(full) == len(Dataset(run["ds"]).val) > N
    assert len(first) == N
    # the same samples (a batch of another size may round differently in the last bits)
    np.testing.assert_allclose(first["probability"], full["probability"][:N], rtol=1e-6)
    np.testing.assert_array_equal(first["row"], np.arange(N))


def test_evaluate_scores_exactly_the_first_n_samples(run, tmp_path, capsys):
    first = _predict(run, tmp_path, N, "first")  # scored in the same batches as evaluate's
    capsys.readouterr()
    argv = ["evaluate", run["ds"], "--load", str(run["ckpt"]), "--split", "val", "--eval-max-samples", str(N)]
    assert main([*argv, "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    labels = np.asarray(Dataset(run["ds"]).val.labels[:N])
    assert result["samples"] == N
    assert result["auc"] == roc_auc(labels, first["probability"])


@pytest.mark.parametrize("eval_batch_size", [16, 16384])  # 37 = 16 + 16 + 5, and one batch
def test_the_trainers_validation_scores_exactly_n_samples(run, eval_batch_size):
    cfg = TrainConfig(
        mode="device", embedding_dim=4, bottom_mlp=[13, 8, 4], top_mlp=[16, 8, 1], num_batches=6,
        eval_max_samples=N, eval_batch_size=eval_batch_size, progress=False,
    )  # fmt: skip
    trainer = Trainer(cfg, run["ds"])
    try:
        trainer.fit()
        result = trainer.evaluate("val")
        probs, labels = trainer.predict(trainer.dataset.val)  # every sample, for the independent figure
    finally:
        trainer.close()
    assert result["samples"] == N and len(probs) == len(trainer.dataset.val)
    np.testing.assert_array_equal(labels[:N], np.asarray(trainer.dataset.val.labels[:N]))
    assert result["auc"] == pytest.approx(roc_auc(labels[:N], probs[:N]), abs=1e-9)


@pytest.mark.parametrize("mode", [["--mode", "device"], ["--mode", "hotline", "--hbm-budget", "512B"]])
def test_the_non_finite_loss_is_reported_at_its_own_step(run, mode, capsys):
    """The message names step s; s-1 steps train cleanly and s steps do not (in hotline mode the loss is read
    one step late, so an off-by-one in that bookkeeping moves the named step)."""

    def train(steps: int) -> tuple[int, str]:
        argv = ["train", run["ds"], *ARCH, *mode, "--num-batches", str(steps), "--learning-rate", "3e3",
                "--mini-batch-size", "64", "--no-progress"]  # fmt: skip
        code = main(argv)
        return code, capsys.readouterr().err

    code, err = train(60)
    assert code == 3, err
    found = re.search(r"loss became \S+ at step (\d+):", err)
    assert found, err
    s = int(found.group(1))
    assert s >= 3, f"the loss must stay finite for a few steps for this test to mean anything (step {s})"
    assert train(s - 1)[0] == 0
    code, err = train(s)
    assert code == 3 and f"at step {s}:" in err
