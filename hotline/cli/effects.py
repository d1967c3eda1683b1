"""The one table of which ``hotline train`` flags have an effect with which setting (``--mode``,
``--arch-interaction-op``, ``--cold-store``): a flag given where its setting ignores it is refused, every one
the same way, before any work (``--lookahead`` with ``--mode device``, ``--dcn-num-layers`` with the dot
interaction, ``--cold-cache`` without ``--cold-store disk``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


def given_dests(args: argparse.Namespace, parser: argparse.ArgumentParser) -> set[str]:
    """The dests of ``parser``'s options given on the command line."""
    argv = getattr(args, "command_line", None) or []
    return {
        a.dest
        for a in parser._actions
        if any(tok == o or tok.startswith(o + "=") for o in a.option_strings for tok in argv)
    }


# The one table of which flags have an effect with which setting (--mode, --arch-interaction-op, --cold-store):
# a flag given where it has no effect is refused, every one the same way, before any work.
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
    """The values of ``on`` the flag has an effect with."""


_ON_DEST = {"--mode": "mode", "--arch-interaction-op": "arch_interaction_op", "--cold-store": "cold_store"}
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


def flag_given(args: argparse.Namespace, parser: argparse.ArgumentParser | None, dest: str) -> bool:
    """Whether the flag of ``dest`` was given: set at all (a flag unset by default is None: every flag of
    ``hotline train`` this asks about), or, for a flag with a default, on the command line (a value equal to
    the default counts: it is still ignored)."""
    default = parser.get_default(dest) if parser is not None else None
    value = getattr(args, dest, None)
    if default is None:
        return value is not None
    if getattr(args, "command_line", None) is not None:
        return dest in given_dests(args, parser)
    return value != default


def _flag_given(args: argparse.Namespace, effect: Effect) -> bool:
    return flag_given(args, getattr(args, "train_parser", None), effect.dest)


def check_mode_flags(args: argparse.Namespace) -> None:
    """Raises ValueError for the first flag of :data:`MODE_FLAGS` given where it has no effect (with a
    ``--mode``, an ``--arch-interaction-op`` or a ``--cold-store`` that ignores it), and for ``--load`` with
    ``--resume`` (two starting points)."""
    for flag, effect in MODE_FLAGS.items():
        setting = getattr(args, _ON_DEST[effect.on], None)
        if setting not in effect.values and _flag_given(args, effect):
            raise ValueError(
                f"{flag} has an effect with {effect.on} {' or '.join(effect.values)} only; {effect.on} {setting} "
                f"would ignore it"
            )
    if args.load and (args.resume or args.resume_if_present):
        flag = "--resume" if args.resume else "--resume-if-present"
        raise ValueError(
            f"--load {args.load} and {flag} are two starting points (a checkpoint file, or the newest checkpoint "
            f"in --checkpoint-dir): give one of them"
        )
