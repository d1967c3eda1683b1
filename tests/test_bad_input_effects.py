"""Every command's flags that have no effect where they are given are refused from the one table
(``hotline.cli.effects.FLAG_EFFECTS``), and ``evaluate`` / ``predict`` / ``export`` check the ``--arch-*``
flags against the checkpoint's dense model before building one: one line, exit 2, before any work."""

from __future__ import annotations

import pytest
import torch

from hotline.cli import build_parser, main
from hotline.cli.effects import ABSENT, FLAG_EFFECTS, GIVEN, check_flag_effects

VALUE = {"--hardware": "H100", "--host-hardware": "h.json", "--arch-mlp-bot": "13-16", "--arch-mlp-top": "16-1",
         "--arch-interaction-op": "dot", "--worker-threads": "1", "--dcn-num-layers": "3", "--dcn-low-rank-dim": "512",
         "--heldout-fraction": "0.1", "--disk-depth": "32", "--disk-record-bytes": "256", "--table-sizes": "5,5",
         "--max-rows-per-table": "10", "--multi-hot": "auto", "--layout": "auto", "--max-ind-range": "10",
         "--min-count": "1", "--on-bad-line": "error"}  # fmt: skip
"""A value of each flag (several at their defaults: still refused where they have no effect)."""
BASE = {"profile": ["profile", "D"], "calibrate": ["calibrate", "--out", "hw.json"],
        "data criteo": ["data", "criteo", "--out", "o"], "evaluate": ["evaluate", "D", "--load", "c.pt"],
        "predict": ["predict", "D", "--load", "c.pt", "--out", "p.npy"],
        "export": ["export", "o.pt", "--load", "c.pt"]}  # fmt: skip
ON = {"--predict": [], "--disk": ["d"], "--day-files": ["days"]}
"""The value a deciding flag that works by being given takes here (none for a switch)."""
OTHER = {"--heldout": "val", "--arch-interaction-op": "dot"}
"""A setting of each valued deciding flag that ignores the flags it decides."""
ROWS = [(command, flag) for command, table in FLAG_EFFECTS.items() if command != "train" for flag in table]


def _effects(command: str, flag: str) -> tuple:
    row = FLAG_EFFECTS[command][flag]
    return row if isinstance(row, tuple) else (row,)


def _applies(effect) -> list[str]:
    if effect.values == GIVEN:
        return [effect.on, *ON[effect.on]]
    if effect.values == ABSENT:
        return []
    return [effect.on, effect.values[0]]


def _ignores(effect) -> list[str]:
    if effect.values == GIVEN:
        return []
    if effect.values == ABSENT:
        return [effect.on, *ON[effect.on]]
    return [effect.on, OTHER[effect.on]]


def _check(argv: list[str], command: str) -> None:
    args = build_parser().parse_args(argv)
    check_flag_effects(args, command)


def test_every_row_has_a_value_and_a_command_line_here():
    assert {flag for _, flag in ROWS} == set(VALUE)
    assert set(BASE) == {command for command, _ in ROWS}


@pytest.mark.parametrize("command,flag", ROWS, ids=[f"{c}{f}" for c, f in ROWS])
def test_a_flag_of_any_command_is_refused_where_its_setting_ignores_it(command, flag):
    effects = _effects(command, flag)
    settings = [tok for effect in effects for tok in _applies(effect)]
    _check([*BASE[command], *settings, flag, VALUE[flag]], command)  # applies: no error
    _check([*BASE[command], *settings], command)  # not given: nothing to refuse
    for i, effect in enumerate(effects):  # every setting it needs, each taken away in turn
        others = [tok for j, e in enumerate(effects) if j != i for tok in _applies(e)]
        with pytest.raises(ValueError) as e:
            _check([*BASE[command], *others, *_ignores(effect), flag, VALUE[flag]], command)
        refused = str(e.value).split(" has an effect with")[0]  # this flag, or one of its settings' flags
        assert refused in (flag, *others), str(e.value)
        assert effect.on in str(e.value)


@pytest.mark.parametrize(
    "argv,line",
    [
        (["calibrate", "--out", "{t}/hw.json", "--disk-depth", "8"],
         "--disk-depth has an effect with --disk only; without --disk it would be ignored"),
        (["data", "criteo", "{t}/raw.txt", "--out", "{t}/o", "--table-sizes", "5,5"],
         "--table-sizes has an effect with --day-files only; without --day-files it would be ignored"),
        (["data", "criteo", "--day-files", "{t}/days", "--out", "{t}/o", "--min-count", "2"],
         "--min-count has an effect without --day-files only; --day-files would ignore it"),
        (["profile", "{t}/none", "--hardware", "H100"],
         "--hardware has an effect with --predict only; without --predict it would be ignored"),
        (["profile", "{t}/none", "--heldout", "val", "--heldout-fraction", "0.1"],
         "--heldout-fraction has an effect with --heldout sample only; --heldout val would ignore it"),
        (["profile", "{t}/none", "--preset", "mlperf-dcnv2", "--dcn-num-layers", "2"],
         "--dcn-num-layers has an effect with --predict only; without --predict it would be ignored"),
    ],
)  # fmt: skip
def test_the_cli_refuses_them_in_one_line_before_any_work(tmp_path, capsys, argv, line):
    argv = [a.replace("{t}", str(tmp_path)) for a in argv]
    (tmp_path / "raw.txt").write_text("")
    (tmp_path / "days").mkdir()
    assert main([*argv, "--no-progress"] if argv[0] != "calibrate" else argv) == 2
    err = [e for e in capsys.readouterr().err.strip().splitlines() if "--preset" not in e.split(":")[1]]
    assert len(err) == 1 and err[0].endswith(line), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["days", "raw.txt"]  # nothing written


SMALL = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A dataset, a checkpoint of the dot interaction, and the same checkpoint as one written before
    checkpoints recorded their architecture (no ``model_config``, no digest file)."""
    d = tmp_path_factory.mktemp("effects")
    assert main(["data", "synthetic", "--out", str(d / "ds"), "--rows", "600", "--table-sizes", "20,30,9",
                 "--no-progress"]) == 0  # fmt: skip
    argv = ["train", str(d / "ds"), "--mode", "device", "--num-batches", "2", *SMALL, "--no-progress"]
    assert main([*argv, "--save", str(d / "c.pt")]) == 0
    payload = torch.load(d / "c.pt", weights_only=True)
    payload.pop("model_config")
    torch.save(payload, d / "old.pt")
    return d


def _scoring(command: str, d, ckpt: str) -> list[str]:
    return {"evaluate": ["evaluate", str(d / "ds"), "--load", str(d / ckpt)],
            "predict": ["predict", str(d / "ds"), "--load", str(d / ckpt), "--out", str(d / "p.npy")],
            "export": ["export", str(d / "e.pt"), "--load", str(d / ckpt)]}[command]  # fmt: skip


def _one_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hotline {command}: error: "), err
    return err[0]


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
@pytest.mark.parametrize("flag", ["--dcn-num-layers", "--dcn-low-rank-dim"])
def test_a_dcn_flag_on_a_checkpoint_of_another_interaction_is_refused(trained, capsys, command, flag):
    """``--dcn-low-rank-dim 100000000`` on a dot checkpoint was ignored: exit 0, as if it applied."""
    assert main([*_scoring(command, trained, "c.pt"), flag, "100000000"]) == 2
    line = _one_error(capsys, command)
    assert line.endswith(f"{flag} has an effect with --arch-interaction-op dcn only; --arch-interaction-op dot "
                         f"(the checkpoint's) would ignore it")  # fmt: skip
    assert not (trained / "p.npy").exists() and not (trained / "e.pt").exists()


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
@pytest.mark.parametrize(
    "flags",
    [["--arch-mlp-bot", "13-100000-4"], ["--arch-mlp-bot", "13-1000000000-4"], ["--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "2000000000-1"],
     ["--arch-interaction-op", "dcn", "--dcn-low-rank-dim", "100000000"]],
    ids=["wide", "1e9", "top2e9", "dcn1e8"],
)  # fmt: skip
def test_arch_flags_of_another_model_than_the_checkpoints_are_one_line_before_it_is_built(
    trained, capsys, command, flags
):
    """An older checkpoint (no recorded architecture) with ``--arch-*`` flags of another size: export built
    the model first (an allocator traceback for a billion units, torch's many-line size mismatch else)."""
    assert main([*_scoring(command, trained, "old.pt"), *SMALL, *flags]) == 2  # the last of a flag wins
    line = _one_error(capsys, command)
    assert (
        f"checkpoint {trained / 'old.pt'} does not match this model's architecture: it holds a dense " in line
    )
    assert "describe one of " in line and "give the --arch-* flags it was trained with" in line
    assert all(f in line for f in flags if f.startswith("--")), line


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_the_flags_a_checkpoint_was_trained_with_still_apply(trained, command):
    force = [] if command == "evaluate" else ["--force"]
    assert main([*_scoring(command, trained, "old.pt"), *SMALL, *force]) == 0
    for name in ("p.npy", "e.pt"):
        (trained / name).unlink(missing_ok=True)
