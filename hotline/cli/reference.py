"""The CLI reference page (docs/cli.md), generated from the parsers so that it cannot drift from them.

``python -m hotline.cli.reference`` prints it; ``--write`` rewrites docs/cli.md in a checkout.
``tests/test_docs.py`` fails when the page and the parsers disagree.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

WIDTH = 100  # columns argparse wraps the help text to (the terminal's width would make the page vary)

HEADER = """# Command-line reference

Generated from the parsers by `python -m hotline.cli.reference --write` (do not edit by hand;
`tests/test_docs.py` fails when this page and `hotline COMMAND --help` disagree). Every command prints the
same text with `--help`. Start with `hotline train` (no arguments: the built-in data, the mode chosen for
you), or `hotline data synthetic` then `hotline profile` and `hotline train --mode hotline` (see the
[quickstart](../README.md#quickstart-the-split-at-work)).
"""


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _walk(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for sub_name, sub in _subparsers(parser):
        yield from _walk(sub, f"{name} {sub_name}")


def render() -> str:
    """The whole reference page as Markdown."""
    from hotline.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parser = build_parser()
        parts = [HEADER]
        for name, p in _walk(parser, "hotline"):
            p.prog = name
            parts.append(f"## `{name}`\n\n```text\n{p.format_help().rstrip()}\n```\n")
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def page_path() -> Path:
    """docs/cli.md of this checkout."""
    return Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--write" in argv:
        from hotline import _io

        _io.write_text(page_path(), text)
        print(f"wrote {page_path()}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
