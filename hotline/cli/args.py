"""Argument helpers every ``hotline`` sub-command shares: threads, sampling, budgets, outputs, errors.

One definition per flag, so the commands cannot drift apart (``--threads`` everywhere; ``--num-threads``
stays as a hidden alias of it).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import traceback
from dataclasses import MISSING, Field
from pathlib import Path

from hotline.kinds import OPTIMIZERS, names
from hotline.units import parse_size, size_arg

SubParsers = argparse._SubParsersAction


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless its text already names it: ``(default: 128)``,
    ``(default: off)`` for a switch, ``(default: none)`` for an optional value left unset. A description or
    epilog with line breaks of its own keeps them (a table of commands); one without is wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.required:
            return text if text.endswith("(required)") else f"{text} (required)"
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return text
        if action.nargs == 0:  # store_true / store_false
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.default is None:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


def _every_parser(parser: argparse.ArgumentParser):
    """``parser`` and every sub-command parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _every_parser(sub)


def use_help_formatter(parser: argparse.ArgumentParser) -> None:
    """Gives ``parser`` and every sub-command parser below it :class:`HelpFormatter`."""
    for p in _every_parser(parser):
        p.formatter_class = HelpFormatter


NEGATIVE_VALUE = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d*\.?\d+\s*[A-Za-z]+$")
"""What argparse reads as a value, not an option, after a flag: a negative number (its own rule) and a negative
size (``-1KiB``), so that the flag's parser names what is wrong with it (not "expected one argument")."""


def read_negative_values(parser: argparse.ArgumentParser) -> None:
    """Gives ``parser`` and every sub-command parser below it :data:`NEGATIVE_VALUE`."""
    for p in _every_parser(parser):
        p._negative_number_matcher = NEGATIVE_VALUE


def add_threads(parser: argparse.ArgumentParser, what: str = "torch and numba threads") -> None:
    """``--threads N`` (0 or unset: all cores) and its hidden alias ``--num-threads``."""
    parser.add_argument("--threads", type=int, default=0, metavar="N", help=f"{what} (default 0: all cores)")
    parser.add_argument("--num-threads", dest="threads", type=int, help=argparse.SUPPRESS)


# Flags of every command whose values are thread or process counts: (flag, destination, least value).
COUNT_FLAGS = (
    ("--threads", "threads", 0),
    ("--worker-threads", "worker_threads", 1),
    ("--nproc", "nproc", 1),
)


IO_DEPTH_FLAGS = (("--cold-io-depth", "cold_io_depth"), ("--disk-depth", "disk_depth"))
"""Reads in flight (each an I/O thread, blocked on the disk most of the time: bounded apart from the cores)."""
MAX_IO_DEPTH = 1024


def check_counts(args: argparse.Namespace) -> None:
    """Raises ValueError naming the flag when a thread or process count of any command is out of bounds
    (at most a small multiple of this machine's cores: ``hotline.pipeline.threads.max_threads``; an I/O depth
    at most :data:`MAX_IO_DEPTH`)."""
    from hotline.pipeline.threads import check_threads

    for flag, dest, least in COUNT_FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            check_threads(value, flag, least)
    for flag, dest in IO_DEPTH_FLAGS:
        value = getattr(args, dest, None)
        if value is not None and not 1 <= value <= MAX_IO_DEPTH:
            raise ValueError(
                f"{flag} must be in [1, {MAX_IO_DEPTH}] (reads in flight, one I/O thread each), got {value}"
            )


def add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_force(parser: argparse.ArgumentParser, *aliases: str) -> None:
    """``--force``: the same flag and meaning in every command that writes (see :mod:`hotline.outputs`)."""
    parser.add_argument(
        "--force",
        *aliases,
        dest="force",
        action="store_true",
        help="replace outputs that exist (never one of this command's inputs, never a run's live output)",
    )


def add_seed(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=f"seed of {what} (default 0)")


def add_mini_batch_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mini-batch-size", type=int, default=128, metavar="B", help="mini-batch size (default 128)"
    )


def add_sampling(parser: argparse.ArgumentParser) -> None:
    """How a profile samples the split: a random share or the first mini-batches (plus batch size, seed)."""
    sample = parser.add_mutually_exclusive_group()
    sample.add_argument(
        "--sample-fraction",
        type=float,
        default=None,
        metavar="F",
        help="profile a uniform random share F of the split, without replacement (default 0.05, as in FAE)",
    )
    sample.add_argument(
        "--sample-batches",
        type=int,
        default=None,
        metavar="N",
        help="profile the first N mini-batches instead (Hotline's learning phase)",
    )
    add_mini_batch_size(parser)
    add_seed(parser, "the random sample")


def sample_fraction(args: argparse.Namespace) -> float:
    """The sampling share the flags ask for (FAE's 5% unless ``--sample-fraction`` is given)."""
    return 0.05 if args.sample_fraction is None else args.sample_fraction


def add_embedding(parser: argparse.ArgumentParser) -> None:
    """``--embedding-dim`` (alias DLRM's ``--arch-sparse-feature-size``) and ``--optimizer``: a row's cost."""
    parser.add_argument(
        "--embedding-dim",
        "--arch-sparse-feature-size",
        dest="embedding_dim",
        type=int,
        default=16,
        metavar="D",
        help="embedding dimension (DLRM's --arch-sparse-feature-size; default 16): a hot row costs D*4 bytes",
    )
    parser.add_argument(
        "--optimizer",
        default="sgd",
        choices=list(OPTIMIZERS),
        help="optimizer whose state is kept with hot rows (default sgd: none; rowwise-adagrad: 4 bytes per row; "
        "adagrad: 4 D; adam: 8 D + 4)",
    )


def add_arch(parser: argparse.ArgumentParser, default=True) -> None:
    """The DLRM architecture flags of ``hotline train`` (``default=False``: unset, taken from a checkpoint)."""
    for name in ("embedding_dim", "bottom_mlp", "top_mlp"):
        add_field(parser, section_field(name), unset=not default)
    add_interaction(parser, default)


def add_interaction(parser: argparse.ArgumentParser, default=True, what: str = "") -> None:
    """``--arch-interaction-op``, ``--dcn-num-layers`` and ``--dcn-low-rank-dim`` (``default=False``: unset;
    ``what``: a prefix of their help, e.g. "for --predict: ")."""
    for name in ("interaction", "dcn_num_layers", "dcn_low_rank_dim"):
        add_field(parser, section_field(name), unset=not default, prefix=what)


def add_device(parser: argparse.ArgumentParser) -> None:
    add_field(parser, section_field("device"))


# -- flags made from the config's fields (hotline.training.sections) -----------------------------------------
def section_field(name: str) -> Field:
    """The field ``name`` of one of the config's sections."""
    from hotline.training.sections import section_field

    return section_field(name)


def field_dest(f: Field) -> str:
    """The argparse dest of field ``f``'s flag (``--arch-mlp-bot`` -> ``arch_mlp_bot``)."""
    return f.metadata["flag"].lstrip("-").replace("-", "_")


def add_field(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    f: Field,
    unset: bool = False,
    show_default: bool = False,
    prefix: str = "",
) -> None:
    """Adds the flag of config field ``f`` as its metadata describes it (:func:`hotline.training.sections.option`).
    ``unset``: the flag's default is None, so that a value given can be told from none (a ``--preset`` yields
    to it, a flag of another mode is refused); ``show_default``: its help still names the config's default."""
    from hotline.training.sections import cli_default

    meta = f.metadata
    default = cli_default(f)
    if meta["shared"]:  # a flag of every command: one definition here
        {"--threads": add_threads, "--force": add_force}[meta["flag"]](parser)
        return
    kw: dict = {"help": field_help(f, prefix), "default": None if unset else default}
    if meta["negate"] or isinstance(default, bool):
        kw["action"] = "store_true"
        kw["default"] = None if unset else False
    else:
        kw["metavar"] = meta["metavar"]
        if meta["choices"] is not None:
            kw["choices"] = list(names(meta["choices"]))
        elif meta["parse"] is not None or default is None:
            kw["default"] = None if unset or default is None else str(default)
        else:
            kw["type"] = type(default)
        if unset and show_default and default is not None:
            kw["help"] += f" (default: {default})"
    parser.add_argument(meta["flag"], **kw)


def field_help(f: Field, prefix: str = "") -> str:
    """The ``--help`` text of config field ``f``: after ``prefix`` (``for --predict: ``), the setting it has an
    effect with, from the one table (:data:`hotline.training.sections.APPLIES_TO`), then its own help."""
    from hotline.training.sections import APPLIES_TO, applies_text, flag_of

    if f.name not in APPLIES_TO:
        return prefix + f.metadata["help"]
    on, values = APPLIES_TO[f.name]
    setting = applies_text(flag_of(on), values)
    head = f"{prefix.rstrip(': ')}, {setting}" if prefix else setting
    return f"{head}: {f.metadata['help']}"


def field_value(args: argparse.Namespace, f: Field):
    """The value of config field ``f`` that the parsed flags give (MISSING: unset, the config's default)."""
    meta = f.metadata
    value = getattr(args, field_dest(f), None)
    if value is None:
        return MISSING
    if meta["parse"] == "layers":
        from hotline.models.dlrm import parse_layers

        value = parse_layers(value, meta["flag"])
    elif meta["parse"] == "size" or (meta["parse"] == "size-or-auto" and value != "auto"):
        try:
            value = parse_size(value)
        except ValueError as e:
            raise ValueError(f"{meta['flag']}: {e}") from None
    return not value if meta["negate"] else value


def add_budget(parser: argparse.ArgumentParser, flag: str = "--hbm-budget", **kw) -> None:
    kw.setdefault("help", "device bytes for hot rows, e.g. 256MiB, 2GiB, 1GB or plain bytes")
    parser.add_argument(flag, type=size_arg, default=kw.pop("default", None), metavar="SIZE", **kw)


def add_output(parser: argparse.ArgumentParser, flag: str, help: str, **kw) -> None:
    """An output file flag (a Path)."""
    parser.add_argument(flag, type=Path, default=None, metavar="FILE", help=help, **kw)


def flags(args: argparse.Namespace, *names: str) -> dict:
    """The parsed flags ``names`` as keyword arguments of the same names."""
    return {name: getattr(args, name) for name in names}


def error(command: str, message: object) -> int:
    """Prints ``hotline COMMAND: error: MESSAGE`` on stderr (one line); returns exit status 2. With
    ``--debug`` / ``HOTLINE_DEBUG=1``, the traceback of the exception being handled comes first."""
    show_traceback()
    print(f"hotline {command}: error: {message}", file=sys.stderr)
    return 2


def ignore_further_interrupts() -> None:
    """After the first Ctrl-C: a second one must not cut the clean-up and the one-line message short
    (``hotline.cli.main`` restores the handler when it was called in-process)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def show_traceback() -> None:
    """Prints the traceback of the exception being handled if ``--debug`` or ``HOTLINE_DEBUG=1`` asked for it."""
    if os.environ.get("HOTLINE_DEBUG", "") not in ("", "0") and sys.exc_info()[0] is not None:
        traceback.print_exc()
