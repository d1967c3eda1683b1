"""The config's sections (``hotline.training.sections``) are the one source of ``hotline train``'s flags: one
argument group per section holding exactly its fields' flags, each flag's default the field's, kinds named
once (``hotline.kinds``) and kept as plain strings, and a flag given told apart from its default without
reading the command line again."""

from __future__ import annotations

from dataclasses import fields

import pytest

from hotline.cli import build_parser
from hotline.cli.args import field_dest
from hotline.cli.train import EXTRA_FLAGS, config_from_args
from hotline.kinds import MODES, Mode, Optimizer, staging_slots
from hotline.training.config import TrainConfig
from hotline.training.sections import SECTIONS


def _train_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["train"]


def test_the_sections_are_the_config_field_for_field():
    names = [f.name for section in SECTIONS.values() for f in fields(section)]
    assert names == [f.name for f in fields(TrainConfig)] and len(set(names)) == len(names)
    assert all(f.metadata["help"] for f in fields(TrainConfig))  # every field says what it is


def test_train_help_has_one_group_per_section_with_exactly_its_flags():
    groups = {g.title: g for g in _train_parser()._action_groups}
    for name, section in SECTIONS.items():
        shown = {o for a in groups[name]._group_actions for o in a.option_strings}
        own = {f.metadata["flag"] for f in fields(section) if f.metadata["flag"]}
        assert shown - {"--num-threads"} == own | set(EXTRA_FLAGS.get(name, {})), name


def test_the_flags_defaults_are_the_configs():
    """``hotline train`` with no flag makes the library's default config, but for the two defaults the CLI
    chooses for the user (``--mode auto``, ``--device auto``)."""
    args = _train_parser().parse_args([])
    assert config_from_args(args) == TrainConfig(mode="auto", device="auto")


def test_a_preset_yields_to_a_flag_given_at_its_default_without_the_command_line():
    """No argv is kept or read again: a flag a preset may set is unset (None) unless given."""
    args = _train_parser().parse_args(
        ["--preset", "mlperf-dcnv2", "--optimizer", "sgd", "--mini-batch-size", "128"]
    )
    assert not hasattr(args, "command_line")
    config = config_from_args(args)
    assert (config.optimizer, config.mini_batch_size, config.embedding_dim) == ("sgd", 128, 128)


def test_profile_s_preset_yields_to_flags_given_at_their_defaults_and_the_rest_get_theirs():
    """``hotline profile``'s preset fills only what no flag set (no argv read again), a value it filled is not
    judged given (``--arch-mlp-bot`` without ``--predict``), and the flags left unset get their defaults."""
    from hotline.cli.effects import check_flag_effects
    from hotline.cli.profile import PRESET_DESTS
    from hotline.cli.train import apply_preset

    args = build_parser().parse_args(["profile", "D", "--preset", "mlperf-dcnv2"])
    apply_preset(args, PRESET_DESTS, "hotline profile")
    assert (args.optimizer, args.embedding_dim) == ("rowwise-adagrad", 128)
    argv = ["profile", "D", "--preset", "mlperf-dcnv2", "--optimizer", "sgd", "--embedding-dim", "16"]
    args = build_parser().parse_args(argv)
    apply_preset(args, PRESET_DESTS, "hotline profile")
    check_flag_effects(args, "profile")
    assert (args.optimizer, args.embedding_dim, args.arch_mlp_top) == ("sgd", 16, "1024-1024-512-256-1")
    assert (args.hardware, args.worker_threads, args.heldout_fraction) == ("H200", 1, None)
    args = build_parser().parse_args([*argv, "--dcn-num-layers", "3"])
    apply_preset(args, PRESET_DESTS, "hotline profile")
    with pytest.raises(ValueError, match="^--dcn-num-layers has an effect with --predict only"):
        check_flag_effects(args, "profile")


@pytest.mark.parametrize(
    "argv",
    [["--mode", "device", "--lookahead", "2"], ["--arch-interaction-op", "dot", "--dcn-num-layers", "3"],
     ["--cold-store", "memory", "--cold-io-depth", "32"]],
)  # fmt: skip
def test_a_flag_without_effect_given_at_its_default_is_refused_without_the_command_line(argv):
    args = _train_parser().parse_args(argv)
    with pytest.raises(ValueError, match=f"^{argv[2]} has an effect with {argv[0]} "):
        config_from_args(args)


def test_the_ranks_of_nproc_get_no_preset_value_their_settings_ignore():
    """``--nproc 2 --preset mlperf-dcnv2 --arch-interaction-op dot``: the preset's dcn shape is not handed to the
    ranks as given flags (every rank refused it); the ranks' command line makes the launcher's config; a dcn
    flag the user gives with dot is still refused, before any rank starts."""
    from hotline.cli.train import rank_argv

    argv = ["train", "D", "--nproc", "2", "--preset", "mlperf-dcnv2", "--arch-interaction-op", "dot",
            "--mode", "hybrid"]  # fmt: skip
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    ranks = rank_argv(args)
    assert "--dcn-num-layers" not in ranks and "--dcn-low-rank-dim" not in ranks, ranks
    assert "--arch-mlp-top" in ranks  # what the preset filled that has an effect goes to the ranks
    assert config_from_args(build_parser().parse_args(ranks)) == config
    args = build_parser().parse_args([*argv, "--dcn-num-layers", "3"])
    with pytest.raises(ValueError, match="^--dcn-num-layers has an effect with --arch-interaction-op dcn"):
        config_from_args(args)


def test_kinds_given_as_enum_members_are_kept_as_strings():
    """A checkpoint records the config's kinds, and ``torch.load(weights_only=True)`` refuses enum classes."""
    config = TrainConfig(mode=Mode.HYBRID, optimizer=Optimizer.ADAM)
    assert type(config.mode) is str and type(config.optimizer) is str
    assert config.mode == Mode.HYBRID == "hybrid"
    assert _train_parser()._option_string_actions["--mode"].choices == list(MODES)
    with pytest.raises(ValueError, match="--mode must be one of"):
        TrainConfig(mode="gpu")


def test_staging_slots():
    assert [staging_slots("hotline", k) for k in (0, 2, 4)] == [3, 5, 7]
    assert staging_slots("hybrid", 2) == 1


def test_every_flag_dest_is_unique():
    dests = [field_dest(f) for f in fields(TrainConfig) if f.metadata["flag"]]
    assert len(dests) == len(set(dests))
