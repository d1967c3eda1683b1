"""The CLI reference page (docs/cli.md), generated from the parsers so that it cannot drift from them.

``python -m hotline.cli.reference`` prints it; ``--write`` rewrites docs/cli.md in a checkout.
``tests/test_docs.py`` fails when the page and the parsers disagree, and when a line of a command's ``--help``
is not on the page.

The page is ``--help`` without its layout: per command its synopsis, description and one line per flag (the
help text as ``--help`` prints it, default included). A flag that several commands take with the same help is
listed once, under "Flags several commands share", and named in each command's section.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

HEADER = """# Command-line reference

Generated from the parsers by `python -m hotline.cli.reference --write`: `tests/test_docs.py` fails when a
line of a command's `--help` is missing here. Every command also takes `-h, --help`. Start with the
[quickstart](../README.md#quickstart-the-split-at-work).
"""


SHARED_ANCHOR = "flags-several-commands-share"


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def walk(parser: argparse.ArgumentParser, name: str = "hotline"):
    """``(command, parser)`` for ``parser`` and every sub-command below it, depth first."""
    yield name, parser
    for sub_name, sub in _subparsers(parser):
        yield from walk(sub, f"{name} {sub_name}")


def flags(parser: argparse.ArgumentParser) -> list[tuple[argparse._ArgumentGroup, str, str]]:
    """``(group, invocation, help)`` of each flag, positional and sub-command ``--help`` shows, as it shows them
    (the help with its default), in ``--help``'s order; ``-h, --help`` left out."""
    fmt = parser._get_formatter()
    out = []
    for group in parser._action_groups:
        for a in group._group_actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            subs = a._get_subactions() if isinstance(a, argparse._SubParsersAction) else [a]
            out += [
                (group, fmt._format_action_invocation(s), fmt._expand_help(s) if s.help else "") for s in subs
            ]
    return out


def _md(text: str) -> str:
    """Help text as Markdown text: ``*`` (``D*4``) is not emphasis."""
    return " ".join(text.split()).replace("*", "\\*")


def _line(invocation: str, text: str) -> str:
    return f"- `{invocation}`: {_md(text)}" if text else f"- `{invocation}`"


def _synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    words = [name]
    fmt = parser._get_formatter()
    for a in parser._actions:
        if a.option_strings and a.required:
            words.append(f"{a.option_strings[0]} {fmt._format_args(a, a.dest.upper())}".rstrip())
    shown = [
        a for a in parser._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]
    if any(a.option_strings and not a.required for a in shown):
        words.append("[options]")
    for a in parser._actions:
        if not a.option_strings:
            words.append(fmt._format_args(a, a.dest))
    return " ".join(words)


def render() -> str:
    """The whole reference page as Markdown."""
    from hotline.cli import build_parser

    parser = build_parser()
    commands = list(walk(parser))
    seen = Counter((inv, text) for _, p in commands for _, inv, text in flags(p))
    shared: dict[tuple[str, str], list[str]] = {}
    parts = [HEADER]
    for name, p in commands:
        own = [(g, inv, text) for g, inv, text in flags(p) if seen[inv, text] == 1]
        mine = [(inv, text) for _, inv, text in flags(p) if seen[inv, text] > 1]
        for key in mine:
            shared.setdefault(key, []).append(name.removeprefix("hotline "))
        lines = [f"## `{name}`", "", f"`{_synopsis(name, p)}`", ""]
        if p.description:
            lines += [_md(p.description), ""]
        group = None
        for g, inv, text in own:
            if g is not group and g.title not in ("positional arguments", "options"):
                lines += ["", f"**{g.title}**" + (f": {_md(g.description)}" if g.description else ""), ""]
            group = g
            lines.append(_line(inv, text))
        if mine:
            names = ", ".join(f"`{inv.split(', ')[0].split(' ')[0]}`" for inv, _ in mine)
            lines += ["", f"Also {names} ([below](#{SHARED_ANCHOR}))."]
        if p.epilog:
            lines += ["", "```text", p.epilog.rstrip(), "```"]
        parts.append("\n".join(lines).replace("\n\n\n", "\n\n") + "\n")
    parts.append("## Flags several commands share\n")
    by_commands: dict[str, list[str]] = {}
    for (inv, text), who in shared.items():
        by_commands.setdefault(", ".join(who), []).append(_line(inv, text))
    parts += [f"**{who}**\n\n" + "\n".join(lines) + "\n" for who, lines in by_commands.items()]
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
