"""Flags with no effect are refused from one table (``hotline.cli.train.MODE_FLAGS``): every flag of it, given
where its setting (``--mode``, ``--arch-interaction-op``, ``--cold-store``) ignores it, is refused with the
same line before any work, and accepted where it has an effect; a flag given at its default value is still
refused where it has no effect."""

from __future__ import annotations

import pytest

from hotline.cli import build_parser, main
from hotline.cli.train import MODE_FLAGS, check_mode_flags

VALUE = {"--placement": "p.npz", "--hbm-budget": "1KiB", "--lookahead": "2", "--worker-threads": "1",
         "--micro-batches": "split", "--replace-every": "10", "--replace": "auto", "--replace-threshold": "0.1",
         "--count-decay": "0.5", "--save-placement": "s.npz", "--hardware": "hw.json", "--dcn-num-layers": "3",
         "--dcn-low-rank-dim": "512", "--cold-io-depth": "32", "--cold-cache": "1KiB",
         "--cold-write-buffer": "1KiB", "--no-cold-direct": None, "--no-cold-lazy": None,
         "--cold-dir": "d"}  # fmt: skip
"""A value of each flag (the DCN and disk ones at their defaults: still refused where they have no effect)."""
ELSEWHERE = {"--mode": "hybrid", "--arch-interaction-op": "dot", "--cold-store": "memory"}
"""A setting of each deciding flag that ignores the flags it decides."""


def _check(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    check_mode_flags(args)


def _with(flag: str) -> list[str]:
    return [flag] if VALUE[flag] is None else [flag, VALUE[flag]]


def test_every_flag_of_the_table_has_a_value_here():
    assert set(VALUE) == set(MODE_FLAGS)


@pytest.mark.parametrize("flag", list(MODE_FLAGS))
def test_a_flag_is_refused_where_its_setting_ignores_it_and_accepted_where_it_applies(flag):
    effect = MODE_FLAGS[flag]
    setting = [effect.on, ELSEWHERE[effect.on]]
    with pytest.raises(ValueError) as e:
        _check(["train", "D", *setting, *_with(flag)])
    assert str(e.value) == (
        f"{flag} has an effect with {effect.on} {' or '.join(effect.values)} only; {effect.on} "
        f"{ELSEWHERE[effect.on]} would ignore it"
    )
    mode = [] if effect.on == "--mode" else ["--mode", "hotline"]
    _check(["train", "D", *mode, effect.on, effect.values[0], *_with(flag)])  # no error
    _check(["train", "D", *setting])  # not given: nothing to refuse


@pytest.mark.parametrize("flag", ["--dcn-num-layers", "--dcn-low-rank-dim", "--cold-cache", "--cold-io-depth",
                                  "--cold-write-buffer", "--no-cold-direct", "--no-cold-lazy"])  # fmt: skip
def test_the_cli_refuses_them_in_one_line_before_any_work(tmp_path, capsys, flag):
    assert main(["train", str(tmp_path / "none"), "--mode", "hybrid", *_with(flag)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hotline train: error: {flag} has an effect with"), err


def test_every_flag_s_help_names_the_setting_it_has_an_effect_with_from_the_one_table():
    """A flag's help and its effect cannot disagree: the help of every flag of the table starts with the
    setting it has an effect with, and no other flag's help starts with a setting of its own."""
    import re

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for action in sub.choices["train"]._actions:
        flag = (action.option_strings or [""])[0]
        if flag in MODE_FLAGS:
            effect = MODE_FLAGS[flag]
            assert action.help.startswith(f"{effect.on} {' or '.join(effect.values)}: "), (flag, action.help)
        else:
            assert not re.match(
                r"(--mode|--arch-interaction-op|--cold-store|hotline|hybrid|auto)\b[^:(]*:", action.help or ""
            ), (flag, action.help)


def test_the_config_refuses_its_strict_fields_where_the_table_says_they_have_no_effect():
    """The library reads the same table (``APPLIES_TO``) and says the CLI's sentence; the fields it is not
    strict about are tolerated (``--mode auto`` may carry them into another mode)."""
    from hotline.training.config import TrainConfig

    for kw, line in [
        (
            {"mode": "device", "replace_every": 5},
            "--replace-every has an effect with --mode hotline only; --mode device would ignore it",
        ),
        (
            {"mode": "auto", "replace": "auto"},
            "--replace has an effect with --mode hotline only; --mode auto would ignore it",
        ),
        (
            {"cold_dir": "."},
            "--cold-dir has an effect with --cold-store disk only; --cold-store memory would ignore it",
        ),
    ]:
        with pytest.raises(ValueError) as e:
            TrainConfig(**kw)
        assert str(e.value) == line
    TrainConfig(mode="device", lookahead=4, cold_cache=1)  # tolerated
    TrainConfig(mode="hotline", replace_every=5, replace="auto")
