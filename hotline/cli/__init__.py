"""The ``hotline`` command line: a thin layer that parses flags and calls library functions."""

from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command -> module providing ``add_parser(subparsers)``. Modules are imported when the parser is built;
# they keep heavy imports (torch, torchrec) inside their ``run`` functions so ``hotline --help`` stays fast.
COMMANDS = {
    "data": "hotline.cli.data",
    "profile": "hotline.cli.profile",
    "train": "hotline.cli.train",
    "plan": "hotline.cli.plan",
    "evaluate": "hotline.cli.evaluate",
    "predict": "hotline.cli.predict",
    "export": "hotline.cli.export",
    "report": "hotline.cli.report",
    "calibrate": "hotline.cli.calibrate",
}


def build_parser() -> argparse.ArgumentParser:
    from hotline import __version__
    from hotline.cli.args import use_help_formatter

    parser = argparse.ArgumentParser(
        prog="hotline",
        description="Train recommendation models whose embedding tables do not fit in GPU memory.",
    )
    parser.add_argument("--version", action="version", version=f"hotline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).add_parser(sub)
    use_help_formatter(parser)  # every flag's help shows its default
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hotline`` console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
