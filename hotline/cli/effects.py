"""The one table of which flags of which ``hotline`` command have an effect with which setting (``--mode``,
``--arch-interaction-op``, ``--cold-store``, ``--predict``, ``--disk``, ``--day-files``, ``--heldout``): a flag
given where its setting ignores it is refused, every one the same way, before any work (``--lookahead`` with
``--mode device``, ``--dcn-num-layers`` with the dot interaction, ``--cold-cache`` without ``--cold-store
disk``, ``profile --hardware`` without ``--predict``, ``data criteo --min-count`` with ``--day-files``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


def given_dests(args: argparse.Namespace, parser: argparse.ArgumentParser) -> set[str]:
    """The dests of ``parser``'s options given on the command line (by any of their names, whole, with
    ``=VALUE``, or abbreviated as argparse accepts)."""
    argv = getattr(args, "command_line", None) or []
    names = {o: a.dest for a in parser._actions for o in a.option_strings}
    given = set()
    for tok in argv:
        if not tok.startswith("--"):
            continue
        name = tok.split("=", 1)[0]
        if name in names:
            given.add(names[name])
        elif parser.allow_abbrev:
            matches = {dest for o, dest in names.items() if o.startswith(name)}
            if len(matches) == 1:
                given |= matches
    return given


# The one table of which flags have an effect with which setting (--mode, --arch-interaction-op, --cold-store,
# and the settings of the other commands): a flag given where it has no effect is refused, every one the same
# way, before any work.
# --mode auto accepts the hotline flags: they apply when it chooses hotline (--placement and --hbm-budget
# choose it).
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
_HOTLINE = ("hotline", "auto")
MODE_FLAGS = {
    "--placement": Effect("placement", "--mode", _HOTLINE),
    "--hbm-budget": Effect("hbm_budget", "--mode", _HOTLINE),
    "--lookahead": Effect("lookahead", "--mode", _HOTLINE),
    "--worker-threads": Effect("worker_threads", "--mode", _HOTLINE),
    "--micro-batches": Effect("micro_batches", "--mode", _HOTLINE),
    "--replace-every": Effect("replace_every", "--mode", _HOTLINE),
    "--replace": Effect("replace", "--mode", _HOTLINE),
    "--replace-threshold": Effect("replace_threshold", "--mode", _HOTLINE),
    "--count-decay": Effect("count_decay", "--mode", _HOTLINE),
    "--save-placement": Effect("save_placement", "--mode", _HOTLINE),
    "--hardware": Effect("hardware", "--mode", ("auto",)),
    "--dcn-num-layers": Effect("dcn_num_layers", "--arch-interaction-op", ("dcn",)),
    "--dcn-low-rank-dim": Effect("dcn_low_rank_dim", "--arch-interaction-op", ("dcn",)),
    "--cold-io-depth": Effect("cold_io_depth", "--cold-store", ("disk",)),
    "--cold-cache": Effect("cold_cache", "--cold-store", ("disk",)),
    "--no-cold-direct": Effect("no_cold_direct", "--cold-store", ("disk",)),
}
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


def flag_given(args: argparse.Namespace, parser: argparse.ArgumentParser | None, dest: str) -> bool:
    """Whether the flag of ``dest`` was given: on the command line when it is known (a value equal to the
    default counts: it is still ignored; a value a ``--preset`` set does not), else set at all (a flag unset
    by default is None: every flag of ``hotline train``) or set to another value than its default."""
    default = parser.get_default(dest) if parser is not None else None
    value = getattr(args, dest, None)
    if getattr(args, "command_line", None) is not None and parser is not None:
        return dest in given_dests(args, parser)
    if default is None:
        return value is not None
    return value != default


def _flag_given(args: argparse.Namespace, effect: Effect, parser: argparse.ArgumentParser | None) -> bool:
    return flag_given(args, parser, effect.dest)


def _command_parser(command: str) -> argparse.ArgumentParser | None:
    """The parser of ``hotline COMMAND`` (``data criteo``: two words)."""
    from hotline.cli import build_parser

    parser = build_parser()
    for word in command.split():
        sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not sub or word not in sub[0].choices:
            return None
        parser = sub[0].choices[word]
    return parser


def check_flag_effects(
    args: argparse.Namespace, command: str, settings: dict[str, str] | None = None
) -> None:
    """Raises ValueError for the first flag of ``FLAG_EFFECTS[command]`` given where it has no effect.
    ``settings`` (deciding flag -> value) stand for the parsed ones (``evaluate``: the checkpoint's
    interaction, unless ``--arch-interaction-op`` is given)."""
    table = FLAG_EFFECTS.get(command, {})
    parser = getattr(args, "train_parser", None) if command == "train" else None
    parser = parser or (_command_parser(command) if table else None)
    for flag, effect in (
        (f, e) for f, row in table.items() for e in (row if isinstance(row, tuple) else (row,))
    ):
        setting = (settings or {}).get(effect.on, getattr(args, _ON_DEST[effect.on], None))
        if effect.values in (GIVEN, ABSENT):
            present = setting not in (None, False)
            if present == (effect.values == GIVEN) or not _flag_given(args, effect, parser):
                continue
            if effect.values == GIVEN:
                raise ValueError(f"{flag} has an effect with {effect.on} only; without {effect.on} it would be "
                                 f"ignored")  # fmt: skip
            raise ValueError(f"{flag} has an effect without {effect.on} only; {effect.on} would ignore it")
        if setting not in effect.values and _flag_given(args, effect, parser):
            raise ValueError(
                f"{flag} has an effect with {effect.on} {' or '.join(effect.values)} only; {effect.on} {setting} "
                f"would ignore it"
            )


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
