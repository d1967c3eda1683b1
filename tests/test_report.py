"""``hotline report``: training runs as one picture (curves shared by the runs, a phase panel per run)."""

from __future__ import annotations

import json

import pytest

from hotline.cli import main
from hotline.datasets.synthetic import generate
from hotline.training.report import TITLES, phase_ms, read_metrics, report_figure

ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """metrics files of a hybrid and a hotline run on one dataset (validation every 10 steps)."""
    root = tmp_path_factory.mktemp("report")
    ds = str(generate(root / "ds", 5000, seed=1, table_sizes=[80, 30, 400], zipf=1.1, progress=False))
    paths = []
    for mode, extra in (("hybrid", []), ("hotline", ["--hbm-budget", "2KiB"])):
        path = root / f"{mode}.jsonl"
        argv = ["train", ds, *ARCH, "--mode", mode, *extra, "--num-batches", "30", "--print-freq", "5",
                "--test-freq", "10", "--eval-max-samples", "200", "--no-progress", "--metrics", str(path)]  # fmt: skip
        assert main(argv) == 0
        paths.append(path)
    return paths


def test_train_records_carry_their_length_and_per_step_phases(pair):
    recs = [r for r in read_metrics(pair[1]) if r["kind"] == "train"]
    assert [r["window_steps"] for r in recs] == [5] * 6
    for r in recs:
        assert r["phase_ms_per_step"].keys() == r["time_s"].keys()
        for k, ms in r["phase_ms_per_step"].items():
            assert ms == pytest.approx(
                1e3 * r["time_s"][k] / r["window_steps"], abs=1e-3
            )  # time_s is rounded to 1 us
        assert r["ms_per_step"] > 0


def test_report_writes_the_image(pair, tmp_path, capsys):
    out = tmp_path / "run.png"
    assert main(["report", *map(str, pair), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    assert main(["report", str(pair[0]), "--out", str(out)]) == 2  # the existing picture is kept
    assert "exists: pass --force" in capsys.readouterr().err


def test_figure_has_the_axes_and_series(pair):
    runs = [(p.stem, read_metrics(p)) for p in pair]
    fig = report_figure(runs)
    axes = {ax.get_title(): ax for ax in fig.get_axes()}
    assert set(axes) == {*TITLES, "hybrid: time per step by phase", "hotline: time per step by phase"}

    def labels(title):
        return [line.get_label() for line in axes[title].get_lines()]

    assert labels(TITLES[0]) == ["hybrid", "hotline"]
    assert labels("validation AUC") == ["hybrid", "hotline"]
    loss_line = axes["training loss"].get_lines()[1]
    assert list(loss_line.get_xdata()) == [5, 10, 15, 20, 25, 30]
    auc = axes["validation AUC"].get_lines()[0]
    assert list(auc.get_xdata()) == [10, 20, 30]  # two eval records and the summary's val_auc
    assert "hotline: popular-sample share" in labels(TITLES[2])
    assert "hotline: overlap ratio" in labels(TITLES[2])
    rates = {line.get_label(): line for line in axes[TITLES[2]].get_lines()}
    assert "hybrid: popular-sample share" not in rates  # hybrid has no popular micro-batch
    assert min(rates["hotline: popular-sample share"].get_ydata()) > 0.1
    assert "hybrid: overlap ratio" not in rates
    assert axes["training loss"].get_xlabel() == "step"

    hot = axes["hotline: time per step by phase"]
    stacked = [c.get_label() for c in hot.collections]
    assert "stall" in stacked and "non_popular_compute" in stacked and "gather" not in stacked
    assert "row movement (worker, overlapped)" in [line.get_label() for line in hot.get_lines()]
    hyb = axes["hybrid: time per step by phase"]
    assert "gather" in [c.get_label() for c in hyb.collections]  # sequential: movement is stacked
    assert "wall clock" in [line.get_label() for line in hyb.get_lines()]

    def colour(ax, phase):
        (c,) = [c for c in ax.collections if c.get_label() == phase]
        return tuple(c.get_facecolor()[0])

    assert colour(hot, "non_popular_compute") == colour(hyb, "non_popular_compute")  # one colour per phase


def test_old_records_without_window_length_use_the_step_difference(tmp_path):
    path = tmp_path / "old.jsonl"
    recs = [{"kind": "train", "step": 4, "loss": 0.7, "samples_per_s": 1.0, "time_s": {"gather": 0.04}},
            {"kind": "train", "step": 10, "loss": 0.6, "samples_per_s": 1.0, "time_s": {"gather": 0.03}}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps, phases, wall = phase_ms(read_metrics(path))
    assert steps == [4, 10] and phases["gather"] == pytest.approx([10.0, 5.0])
    assert all(w != w for w in wall)  # unknown: NaN, not made up
    report_figure([("old", read_metrics(path))])


def test_bad_metrics_files_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "train", "step": 1}\nnot json\n')
    assert main(["report", str(bad), "--out", str(tmp_path / "x.png")]) == 2
    assert "bad.jsonl, line 2: not a JSON record" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_validation_time_is_not_counted_as_step_time(tmp_path, monkeypatch):
    import time

    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    ds = generate(tmp_path / "ds", 3000, seed=1, table_sizes=[30, 20], progress=False)
    config = TrainConfig(embedding_dim=4, bottom_mlp=[13, 4], top_mlp=[8, 1], num_batches=12, print_freq=4,
                         test_freq=4, progress=False)  # fmt: skip
    trainer = Trainer(config, ds)
    real = trainer.evaluate

    def slow_evaluate(split):  # a validation of 2 s: 500 ms per step of the next 4-step window if counted
        if trainer.step_count < 12:
            time.sleep(2.0)
        return real(split)

    monkeypatch.setattr(trainer, "evaluate", slow_evaluate)
    try:
        trainer.fit()
    finally:
        trainer.close()
    train = [r for r in trainer.history if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert all(r["ms_per_step"] < 400 for r in train[1:]), [r["ms_per_step"] for r in train]
