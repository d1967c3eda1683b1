"""The commands around training: complete help, --version, --device auto, evaluate / predict / export of a
checkpoint, the log lines of a run without a progress bar."""

from __future__ import annotations

import argparse
import io
import json
import sys

import numpy as np
import pytest
import torch

from hotline import _io
from hotline.cli import COMMANDS, build_parser, main
from hotline.datasets.synthetic import generate
from hotline.training.metrics import roc_auc

ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "16-8-1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A dataset, a second one of other table sizes, and a saved hotline run on the first."""
    root = tmp_path_factory.mktemp("tools")
    ds = str(generate(root / "ds", 6000, seed=3, table_sizes=[60, 25, 300, 9], zipf=1.1, progress=False))
    other = str(generate(root / "other", 3000, seed=4, table_sizes=[61, 25, 300, 9], progress=False))
    ckpt = root / "run.pt"
    argv = ["train", ds, *ARCH, "--mode", "hotline", "--hbm-budget", "2KiB", "--num-batches", "30",
            "--print-freq", "10", "--no-progress", "--save", str(ckpt), "--metrics", str(root / "m.jsonl")]  # fmt: skip
    assert main(argv) == 0
    summary = [json.loads(line) for line in open(root / "m.jsonl")][-1]
    return {"root": root, "ds": ds, "other": other, "ckpt": ckpt, "summary": summary}


# -- help ------------------------------------------------------------------------------------------------
def _command_parsers(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _command_parsers(sub, (*prefix, name))
            return
    yield prefix, parser


def test_every_option_of_every_command_has_a_help_text_and_its_default(capsys):
    parsers = dict(_command_parsers(build_parser()))
    assert {p[0] for p in parsers} >= set(COMMANDS) and ("data", "synthetic") in parsers
    for prefix, parser in parsers.items():
        with pytest.raises(SystemExit) as exit_:
            main([*prefix, "--help"])
        assert exit_.value.code == 0
        text = " ".join(capsys.readouterr().out.split())  # unwrapped
        formatter = parser.formatter_class(prog="x")
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), (
                f"hotline {' '.join(prefix)}: {action.dest} has no help"
            )
            shown = " ".join(formatter._get_help_string(action).split())
            if action.option_strings:
                assert action.option_strings[0] in text
                assert "default" in shown or "(required)" in shown, (prefix, action.option_strings, shown)
                if (
                    action.nargs != 0 and not action.choices
                ):  # a value flag names what it takes (N, FILE, ...)
                    assert action.metavar, (prefix, action.dest)
            assert shown.split(" (default")[0][:40] in text, (prefix, action.dest)


def test_train_help_shows_the_defaults_dlrm_users_ask_for(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split("options:")[1].split())  # past the usage lines
    for flag, default in (("--mini-batch-size B", "128"), ("--learning-rate LR", "0.1"), ("--nepochs N", "1"),
                          ("--seed N", "0"), ("--device DEVICE", "auto")):  # fmt: skip
        at = text.index(flag)
        assert f"(default: {default})" in text[at : at + 200], flag


def test_version(capsys):
    from hotline import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"hotline {__version__}"


def test_device_auto_takes_cuda_when_there_is_one(monkeypatch):
    from hotline.training.config import TrainConfig, resolve_device

    assert TrainConfig(device="auto").device == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == "cuda:1"  # each local rank its own GPU
    args = build_parser().parse_args(["train"])
    assert args.device == "auto"


# -- evaluate / predict ----------------------------------------------------------------------------------
def test_evaluate_gives_the_metrics_the_training_summary_gave(runs, capsys):
    for split in ("val", "test"):
        assert (
            main(["evaluate", runs["ds"], "--load", str(runs["ckpt"]), "--split", split, "--no-progress"])
            == 0
        )
        rec = json.loads(capsys.readouterr().out)
        assert rec["step"] == 30 and rec["split"] == split
        for k in ("auc", "logloss", "accuracy"):
            assert rec[k] == pytest.approx(runs["summary"][f"{split}_{k}"], abs=1e-6), (split, k)


@pytest.mark.parametrize("suffix", [".parquet", ".npy"])
def test_predict_writes_probability_and_label_per_sample(runs, tmp_path, capsys, suffix):
    out = tmp_path / f"pred{suffix}"
    assert (
        main(["predict", runs["ds"], "--load", str(runs["ckpt"]), "--split", "test", "--out", str(out)]) == 0
    )
    if suffix == ".npy":
        table = np.load(out, allow_pickle=False)
        rows, probs, labels = table["row"], table["probability"], table["label"]
    else:
        import pyarrow.parquet as pq

        t = pq.read_table(out)
        assert t.column_names == ["row", "probability", "label"]
        rows, probs, labels = (t.column(c).to_numpy() for c in t.column_names)
    from hotline.datasets.format import Dataset

    test = Dataset(runs["ds"]).test
    assert len(probs) == len(test) and np.array_equal(rows, np.arange(len(test)))
    assert np.array_equal(labels, np.asarray(test.labels, np.float32))
    assert ((probs > 0) & (probs < 1)).all()
    assert roc_auc(labels, probs) == pytest.approx(runs["summary"]["test_auc"], abs=1e-6)
    # an existing output is the user's: refused without --force, replaced atomically with it
    before = out.read_bytes()
    assert main(["predict", runs["ds"], "--load", str(runs["ckpt"]), "--out", str(out)]) == 2
    assert "exists: pass --force" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["predict", runs["ds"], "--load", str(runs["ckpt"]), "--out", str(out), "--force"]) == 0


def test_mismatched_dataset_checkpoint_and_flags_are_refused(runs, tmp_path, capsys):
    ck = str(runs["ckpt"])
    cases = [
        (["evaluate", runs["other"], "--load", ck], "this dataset has"),
        (["evaluate", runs["ds"], "--load", str(tmp_path / "nope.pt")], "does not exist"),
        (["evaluate", runs["ds"], "--load", ck, "--arch-mlp-top", "32-1"], "trained with top_mlp"),
        (
            ["predict", runs["ds"], "--load", ck, "--out", str(tmp_path / "p.csv")],
            "expected a .parquet or .npy",
        ),
        (["export", str(tmp_path / "e.pt"), "--load", str(runs["ds"] + "/meta.json")], "cannot be loaded"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"hotline {argv[0]}: error: ") and message in err.splitlines()[0], (argv, err)
        assert "Traceback" not in err
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "e.pt").exists()


def test_checkpoint_of_n_ranks_is_refused_by_name(tmp_path):
    from hotline.training.checkpoint import CheckpointError
    from hotline.training.inference import checkpoint_payload

    (tmp_path / "step-000000004.rank000-of-002.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="written by several ranks"):
        checkpoint_payload(tmp_path / "step-000000004")


def test_checkpoint_without_model_config_loads_with_the_arch_flags(runs, tmp_path, capsys):
    payload = torch.load(runs["ckpt"], weights_only=True)
    del payload["model_config"]  # as written before the config was stored
    old = tmp_path / "old.pt"
    _io.write_with_digest(old, lambda f: torch.save(payload, f))
    assert main(["evaluate", runs["ds"], "--load", str(old), "--no-progress"]) == 2  # train's default arch
    assert "does not match this model's architecture" in capsys.readouterr().err
    assert main(["evaluate", runs["ds"], "--load", str(old), "--no-progress", *ARCH]) == 0
    assert json.loads(capsys.readouterr().out)["auc"] == pytest.approx(runs["summary"]["val_auc"], abs=1e-6)


# -- export to torchrec ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pooling", [1, 3])
def test_torchrec_dlrm_predicts_what_hotline_predicts(runs, tmp_path, capsys, pooling):
    pytest.importorskip("torchrec")
    from hotline.datasets.format import Dataset
    from hotline.training.export import keyed_jagged, load_torchrec_dlrm
    from hotline.training.inference import trainer_from_checkpoint

    if pooling == 1:
        ds, ckpt = runs["ds"], runs["ckpt"]
    else:  # multi-hot bags, trained in device mode with row-wise Adagrad
        ds = str(generate(tmp_path / "mh", 3000, seed=5, table_sizes=[40, 70, 9], pooling_factor=pooling,
                          progress=False))  # fmt: skip
        ckpt = tmp_path / "mh.pt"
        assert main(["train", ds, *ARCH, "--optimizer", "rowwise-adagrad", "--num-batches", "15",
                     "--no-progress", "--save", str(ckpt), "--eval-max-samples", "100"]) == 0  # fmt: skip
    out = tmp_path / "dlrm.pt"
    assert main(["export", str(out), "--load", str(ckpt), "--to", "torchrec-dlrm"]) == 0
    capsys.readouterr()

    from torchrec.models.dlrm import DLRM as TorchrecDLRM

    module, config = load_torchrec_dlrm(out)
    assert isinstance(module, TorchrecDLRM)
    test = Dataset(ds).test
    trainer = trainer_from_checkpoint(ds, ckpt, progress=False)
    try:
        ours, _ = trainer.predict(test)
    finally:
        trainer.close()
    with torch.no_grad():
        kjt = keyed_jagged(np.asarray(test.sparse), config["feature_names"])
        theirs = torch.sigmoid(module(torch.from_numpy(np.array(test.dense)), kjt)).squeeze(1).numpy()
    assert theirs.shape == ours.shape
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-6)
    assert (
        np.abs(ours - ours.mean()).max() > 1e-3
    )  # the model is not constant: the comparison means something


def test_an_export_whose_config_and_weights_disagree_is_one_error(runs, tmp_path, capsys):
    """An export edited or mixed up by hand (its config says dim 4, its weights are dim 8; or a weight is
    missing) is refused with an ExportError naming the file, not a RuntimeError from load_state_dict."""
    pytest.importorskip("torchrec")
    from hotline.training.export import ExportError, load_torchrec_dlrm

    out = tmp_path / "dlrm.pt"
    assert main(["export", str(out), "--load", str(runs["ckpt"])]) == 0
    capsys.readouterr()
    blob = torch.load(out, weights_only=True)
    wrong_dim = {**blob, "config": {**blob["config"], "embedding_dim": blob["config"]["embedding_dim"] * 2}}
    torch.save(wrong_dim, tmp_path / "dim.pt")
    state = dict(blob["state_dict"])
    state.pop(next(iter(state)))
    torch.save({**blob, "state_dict": state}, tmp_path / "missing.pt")
    for name in ("dim.pt", "missing.pt"):
        with pytest.raises(
            ExportError, match=f"{name}: its config and weights do not make one torchrec DLRM"
        ):
            load_torchrec_dlrm(tmp_path / name)


def test_export_refuses_what_torchrec_cannot_express(runs, tmp_path, capsys):
    pytest.importorskip("torchrec")
    ckpt = tmp_path / "cat.pt"
    assert main(["train", runs["ds"], "--arch-interaction-op", "cat", "--arch-sparse-feature-size", "4",
                 "--arch-mlp-bot", "13-4", "--arch-mlp-top", "20-1", "--num-batches", "2", "--no-progress",
                 "--eval-max-samples", "50", "--save", str(ckpt)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["export", str(tmp_path / "x.pt"), "--load", str(ckpt)]) == 2
    assert "cat has no torchrec DLRM counterpart" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()


# -- logs ----------------------------------------------------------------------------------------------------
def test_summary_line_has_the_same_keys_on_one_rank_as_on_n(runs, capsys):
    from hotline.cli.train import SUMMARY_KEYS

    argv = ["train", runs["ds"], *ARCH, "--num-batches", "3", "--no-progress", "--eval-max-samples", "50"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(record) == [*SUMMARY_KEYS, "world_size", "auto"] and record["world_size"] == 1
    assert record["auto"]["mode"] == record["mode"] == "device"  # no --mode: auto, and small tables fit


def test_no_progress_prints_a_line_per_report(runs, capsys):
    argv = ["train", runs["ds"], *ARCH, "--mode", "hybrid", "--num-batches", "12", "--print-freq", "4",
            "--no-progress", "--eval-max-samples", "100"]  # fmt: skip
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["4/12", "8/12", "12/12"]
    assert all("loss " in line and "samples/s" in line and "ms/step" in line for line in lines)


def test_log_line_has_the_tier_figures():
    from hotline.training.logs import format_line

    rec = {"step": 5, "loss": 0.5, "samples_per_s": 1234.0, "ms_per_step": 2.5, "hot_lookup_share": 0.9,
           "popular_sample_share": 0.25, "overlap_ratio": 0.4}  # fmt: skip
    line = format_line(rec, 10)
    assert (
        line
        == "step 5/10  loss 0.5000  1,234 samples/s  2.50 ms/step  hit rate 90.0%  popular 25.0%  overlap 0.40"
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_restarts_its_clock_after_the_first_step():
    from tqdm import tqdm

    from hotline.training.logs import LogLines

    stream = _Terminal()
    log = LogLines(True, bar=True, stream=stream)
    assert log.bar and not log.lines
    bar = tqdm(total=100, file=stream, mininterval=0)
    bar.start_t -= 30.0  # the first step took 30 s (compilation)
    bar.update(1)
    log.after_step(bar, 1)
    assert (
        bar.n == 1 and bar.initial == 1 and bar._time() - bar.start_t < 5.0
    )  # 30 s forgotten: no 50-minute ETA
    bar.close()
    assert not LogLines(True, bar=True, stream=io.StringIO()).bar  # no terminal: lines instead
    assert not LogLines(False, bar=False, stream=io.StringIO()).lines  # rank > 0: silent


def test_compile_note_only_while_a_kernel_is_not_compiled(tmp_path, monkeypatch):
    from hotline.training.logs import kernels_need_compiling

    source = "import numba\n\n@numba.njit(cache=True)\ndef _twice(x):\n    return 2 * x\n"
    source += "\n\n@numba.njit(cache=True)\ndef _thrice(x):\n    return 3 * x\n"
    (tmp_path / "fresh_kernels.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kernels_need_compiling(("fresh_kernels",))  # no cache on disk, not compiled here
    import fresh_kernels

    assert fresh_kernels._twice(2) == 4
    assert not kernels_need_compiling(("fresh_kernels",))  # one compiled: the module was
    del fresh_kernels
    monkeypatch.delitem(sys.modules, "fresh_kernels")
    assert not kernels_need_compiling(("fresh_kernels",))  # a new process: _twice comes from the cache


def test_export_without_torchrec_says_what_is_missing(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrec.models.dlrm", None)  # import fails as if not installed
    assert main(["export", str(tmp_path / "x.pt"), "--load", str(runs["ckpt"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hotline export: error: torchrec is needed") and not (tmp_path / "x.pt").exists()


def test_evaluation_shows_a_progress_bar_on_a_terminal(runs, monkeypatch):
    from dataclasses import replace

    from hotline.training.inference import trainer_from_checkpoint

    trainer = trainer_from_checkpoint(runs["ds"], runs["ckpt"], progress=True)
    try:
        trainer.config = replace(trainer.config, eval_batch_size=100)
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        trainer.evaluate("val")
        shown = terminal.getvalue()
        trainer.config = replace(trainer.config, progress=False)
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        trainer.evaluate("val")
    finally:
        trainer.close()
    assert "eval val" in shown and "sample" in shown
    assert terminal.getvalue() == ""  # --no-progress: no bar
