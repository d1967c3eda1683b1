"""The one table of which flags of which ``hotline`` command have an effect with which setting (``--mode``,
``--arch-interaction-op``, ``--cold-store``, ``--predict``, ``--disk``, ``--day-files``, ``--heldout``): a flag
given where its setting ignores it is refused, every one the same way, before any work (``--lookahead`` with
``--mode device``, ``--dcn-num-layers`` with the dot interaction, ``--cold-cache`` without ``--cold-store
disk``, ``profile --hardware`` without ``--predict``, ``data criteo --min-count`` with ``--day-files``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hotline.cli.args import field_dest, section_field
from hotline.kinds import Mode
from hotline.training.sections import APPLIES_TO, HOTLINE, flag_of, ignored_message


# The one table of which flags have an effect with which setting (--mode, --arch-interaction-op, --cold-store,
# and the settings of the other commands): a flag given where it has no effect is refused, every one the same
# way, before any work. hotline train's rows are read from the library's (sections.APPLIES_TO).
@dataclass(frozen=True)
class Effect:
    """Where a flag has an effect: with ``on`` (a flag) set to one of ``values``."""

    dest: str
    """The flag's argparse dest."""
    on: str
    """The flag whose value decides: ``--mode``, ``--arch-interaction-op`` or ``--cold-store``."""
    values: tuple[str, ...]
    """The values of ``on`` the flag has an effect with (:data:`GIVEN`: ``on`` given at all; :data:`ABSENT`:
    ``on`` not given)."""


GIVEN = ("(given)",)
"""``values`` of an Effect whose deciding flag has an effect by being given (a switch, a path)."""
ABSENT = ("(absent)",)
"""``values`` of an Effect whose deciding flag takes the effect away by being given."""

_ON_DEST = {"--mode": "mode", "--arch-interaction-op": "arch_interaction_op", "--cold-store": "cold_store",
            "--predict": "predict", "--disk": "disk", "--day-files": "day_files", "--heldout": "heldout"}  # fmt: skip
MODE_FLAGS = {
    **{
        flag_of(name): Effect(field_dest(section_field(name)), flag_of(on), values)
        for name, (on, values) in APPLIES_TO.items()
    },
    "--save-placement": Effect("save_placement", "--mode", HOTLINE),
    "--hardware": Effect("hardware", "--mode", (Mode.AUTO.value,)),
}
"""``hotline train``'s rows: its config fields' from the library's table (``APPLIES_TO``), and its two flags that
are no config field."""
_DCN = {flag: MODE_FLAGS[flag] for flag in ("--dcn-num-layers", "--dcn-low-rank-dim")}
FLAG_EFFECTS = {
    "train": MODE_FLAGS,
    "profile": {
        **{
            flag: Effect(flag[2:].replace("-", "_"), "--predict", GIVEN)
            for flag in (
                "--hardware",
                "--host-hardware",
                "--arch-mlp-bot",
                "--arch-mlp-top",
                "--arch-interaction-op",
                "--worker-threads",
            )
        },
        **{flag: (Effect(effect.dest, "--predict", GIVEN), effect) for flag, effect in _DCN.items()},
        "--heldout-fraction": Effect("heldout_fraction", "--heldout", ("sample",)),
    },
    "calibrate": {
        "--disk-depth": Effect("disk_depth", "--disk", GIVEN),
        "--disk-record-bytes": Effect("disk_record_bytes", "--disk", GIVEN),
    },
    "data criteo": {
        **{
            flag: Effect(flag[2:].replace("-", "_"), "--day-files", GIVEN)
            for flag in ("--table-sizes", "--max-rows-per-table", "--multi-hot")
        },
        **{
            flag: Effect(flag[2:].replace("-", "_"), "--day-files", ABSENT)
            for flag in ("--layout", "--max-ind-range", "--min-count", "--on-bad-line")
        },
    },
    # the interaction of evaluate, predict and export is the checkpoint's unless --arch-interaction-op is given
    "evaluate": _DCN,
    "predict": _DCN,
    "export": _DCN,
}
"""Command (``hotline COMMAND``) -> its flags that have an effect only with some setting -> that setting (or
settings, each needed: ``profile --dcn-num-layers`` needs ``--predict`` and the dcn interaction)."""


def unset_flags(parser: argparse.ArgumentParser, dests) -> None:
    """Makes the options of ``parser`` whose dest is in ``dests`` default to None, so that a flag given (at
    any value, its default's too) is told from one left unset by the parsed value alone, and a ``--preset``
    fills only what is unset. Their defaults stay named in their help, kept in ``flag_defaults`` (a parser
    default) and given by :func:`check_flag_effects` once it has judged the flags."""
    defaults = dict(parser.get_default("flag_defaults") or {})
    for action in parser._actions:
        if action.dest not in dests or not action.option_strings or action.default is None:
            continue
        default = action.default
        if isinstance(default, str) and action.type is not None:  # as argparse converts a default
            default = action.type(default)
        defaults[action.dest] = default
        if "default" not in (action.help or ""):
            shown = ("on" if default else "off") if isinstance(default, bool) else default
            action.help = f"{action.help} (default: {shown})"
        action.default = None
    parser.set_defaults(flag_defaults=defaults)


def effect_dests(command: str) -> set[str]:
    """The dests of the flags of ``FLAG_EFFECTS[command]``."""
    rows = FLAG_EFFECTS.get(command, {}).values()
    return {e.dest for row in rows for e in (row if isinstance(row, tuple) else (row,))}


def unset_effect_flags(parser: argparse.ArgumentParser) -> None:
    """Unsets (:func:`unset_flags`) the flags of every command of :data:`FLAG_EFFECTS` in ``hotline``'s
    ``parser``: whether one was given is whether it is set at all."""
    for command in FLAG_EFFECTS:
        sub = parser
        for word in command.split():
            sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        unset_flags(sub, effect_dests(command))


def flag_given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the flag of ``dest`` was given: set at all (a flag of :data:`FLAG_EFFECTS`, or one a preset
    may set, is None unless given; given at its default's value it counts: it is still ignored), and not by a
    ``--preset`` (``args.preset_filled``)."""
    return getattr(args, dest, None) is not None and dest not in getattr(args, "preset_filled", ())


def _value(args: argparse.Namespace, dest: str):
    """The value of the flag of ``dest``: given, else its default."""
    value = getattr(args, dest, None)
    return (getattr(args, "flag_defaults", None) or {}).get(dest) if value is None else value


def fill_defaults(args: argparse.Namespace) -> None:
    """Gives every flag :func:`unset_flags` left unset its default."""
    for dest, default in (getattr(args, "flag_defaults", None) or {}).items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, default)


def _ignored(args: argparse.Namespace, command: str, settings: dict[str, str] | None = None):
    """(dest, the one-line reason) of every flag of ``FLAG_EFFECTS[command]`` whose setting ignores it, given
    or not."""
    table = FLAG_EFFECTS.get(command, {})
    for flag, effect in (
        (f, e) for f, row in table.items() for e in (row if isinstance(row, tuple) else (row,))
    ):
        setting = (settings or {}).get(effect.on, _value(args, _ON_DEST[effect.on]))
        if effect.values in (GIVEN, ABSENT):
            present = setting not in (None, False)
            if present == (effect.values == GIVEN):
                continue
            if effect.values == GIVEN:
                yield (
                    effect.dest,
                    f"{flag} has an effect with {effect.on} only; without {effect.on} it would be ignored",
                )
            else:
                yield (
                    effect.dest,
                    f"{flag} has an effect without {effect.on} only; {effect.on} would ignore it",
                )
        elif setting not in effect.values:
            yield effect.dest, ignored_message(flag, effect.on, effect.values, setting)


def check_flag_effects(
    args: argparse.Namespace, command: str, settings: dict[str, str] | None = None
) -> None:
    """Raises ValueError for the first flag of ``FLAG_EFFECTS[command]`` given where it has no effect.
    ``settings`` (deciding flag -> value) stand for the parsed ones (``evaluate``: the checkpoint's
    interaction, unless ``--arch-interaction-op`` is given). Then gives the flags left unset their
    defaults (:func:`fill_defaults`)."""
    for dest, reason in _ignored(args, command, settings):
        if flag_given(args, dest):
            raise ValueError(reason)
    fill_defaults(args)


def ignored_preset_dests(args: argparse.Namespace, command: str) -> set[str]:
    """The dests a ``--preset`` filled whose flag the settings ignore (the dcn shape with ``--arch-interaction-op
    dot``): left out of the command line the ranks of ``--nproc`` get, which would judge them given."""
    return {dest for dest, _ in _ignored(args, command)} & set(getattr(args, "preset_filled", ()))


def check_mode_flags(args: argparse.Namespace) -> None:
    """Raises ValueError for the first flag of :data:`MODE_FLAGS` given where it has no effect (with a
    ``--mode``, an ``--arch-interaction-op`` or a ``--cold-store`` that ignores it), and for ``--load`` with
    ``--resume`` (two starting points)."""
    check_flag_effects(args, "train")
    if args.load and (args.resume or args.resume_if_present):
        flag = "--resume" if args.resume else "--resume-if-present"
        raise ValueError(
            f"--load {args.load} and {flag} are two starting points (a checkpoint file, or the newest checkpoint "
            f"in --checkpoint-dir): give one of them"
        )
