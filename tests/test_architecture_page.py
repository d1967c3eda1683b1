"""docs/architecture.md's file listing names every module of hotline/ and kernels/ in its own folder, so the
page cannot drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"


def listed_paths(text: str) -> set[str]:
    """The paths the page's file listing (the code block that starts with ``pyproject.toml``) names: folders
    nest by indentation (two spaces a level), an entry is what a line holds before its description (two or more
    spaces); a line indented deeper than an entry can be continues a description."""
    block = next(b for b in re.findall(r"```\n(.*?)```", text, flags=re.S) if b.startswith("pyproject.toml"))
    stack: list[tuple[int, str]] = []
    paths = set()
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        entry = re.split(r"\s{2,}", line.strip())[0]
        stack = [(i, f) for i, f in stack if i < indent]
        if indent > (stack[-1][0] + 2 if stack else 0):
            continue
        if entry.endswith("/"):
            stack.append((indent, entry))
            continue
        for name in re.findall(r"[\w.]+\.(?:py|json)\b", entry):
            paths.add("".join(f for _, f in stack) + name)
    return paths


def test_listing_nests_by_folder():
    text = "```\npyproject.toml  x\na/  y\n  b.py  z\n  c/\n    d.py, e.py:\n                  words f.py\ng.py\n```"
    assert listed_paths(text) == {"a/b.py", "a/c/d.py", "a/c/e.py", "g.py"}


def test_architecture_page_names_every_module():
    listed = listed_paths(PAGE.read_text())
    missing = [
        path.relative_to(ROOT).as_posix()
        for folder in ("hotline", "kernels")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".json")
        and "__pycache__" not in path.parts
        and not (path.name == "__init__.py" and path.parent != ROOT / "hotline")
        and path.relative_to(ROOT).as_posix() not in listed
    ]
    assert not missing, f"docs/architecture.md does not name {', '.join(missing)}: add a line for each"
    stale = sorted(p for p in listed if p.startswith(("hotline/", "kernels/")) and not (ROOT / p).exists())
    assert not stale, f"docs/architecture.md names {', '.join(stale)}, which do not exist"
