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


# -- the layers: imports only go down ---------------------------------------------------------------------
CLIMBS = {
    ("hotline.distributed.launcher", "hotline.cli.args"): "a second Ctrl-C is ignored by the CLI's one rule",
}
"""The imports allowed against the layers, each with its reason (docs/architecture.md names them)."""


def layers(text: str) -> list[tuple[str, list[str]]]:
    """The page's layers, low to high: (name, module prefixes), from the ```text block that starts ``layers``
    (a name, then prefixes; a line that starts with spaces continues the layer above)."""
    block = next(b for b in re.findall(r"```text\n(.*?)```", text, flags=re.S) if b.startswith("layers\n"))
    out: list[tuple[str, list[str]]] = []
    for line in block.splitlines()[1:]:
        if line.startswith(" "):
            out[-1][1].extend(line.split())
        else:
            name, *prefixes = re.split(r"\s{2,}", line.strip())
            out.append((name, " ".join(prefixes).split()))
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for base, package in ((ROOT / "hotline", "hotline"), (ROOT / "kernels", "hotline.kernels")):
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the Hotline modules it imports, anywhere in it but under ``if TYPE_CHECKING:``."""
    import ast

    mods = _modules()

    def known(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else ""

    graph = {}
    for module, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
                for n in ast.walk(node)}  # fmt: skip
        out = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                out |= {known(a.name) for a in node.names if a.name.startswith("hotline")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hotline"):
                out |= {known(f"{node.module}.{a.name}") or known(node.module) for a in node.names}
        graph[module] = out - {module, ""}
    return graph


def _layer(module: str, order: list[tuple[str, list[str]]]) -> int:
    best = max(
        ((len(p), i) for i, (_, prefixes) in enumerate(order) for p in prefixes
         if module == p or module.startswith(p + ".")),
        default=None,
    )  # fmt: skip
    assert best is not None, f"docs/architecture.md's layers do not name {module}"
    return best[1]


def test_layers_rules_read_the_page_and_find_climbs():
    order = layers("```text\nlayers\nlow   a a.x\n      b\nhigh  c\n```")
    assert order == [("low", ["a", "a.x", "b"]), ("high", ["c"])]
    assert _layer("a.x.y", [("low", ["a"]), ("high", ["a.x"])]) == 1  # the longest prefix wins
    graph = import_graph()
    assert "hotline.datasets.format" in graph["hotline.profiling.profiler"]  # a plain import is an edge
    assert "hotline.profiling.profiler" not in graph["hotline.profiling.profile"]  # TYPE_CHECKING is not


def test_imports_go_down_the_layers_without_cycles():
    order = layers(PAGE.read_text())
    graph = import_graph()
    climbs = sorted((a, b) for a, bs in graph.items() for b in bs if _layer(b, order) > _layer(a, order))
    unexplained = [f"{a} -> {b}" for a, b in climbs if (a, b) not in CLIMBS]
    assert not unexplained, f"imports against the layers of docs/architecture.md: {unexplained}"
    gone = sorted(set(CLIMBS) - set(climbs))
    assert not gone, f"CLIMBS lists imports that no longer climb: {gone}"
    # no cycle: a depth-first search finds no edge back to a module on the current path
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            assert state.get(other) != 1, f"import cycle: {' -> '.join([*path, other])}"
            if other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


MAX_LINES = 500


def test_no_python_file_of_the_package_kernels_tests_or_benchmarks_is_over_500_lines():
    """Each file is one concept (docs/architecture.md): a file that grows past MAX_LINES is split along one."""
    files = [
        *ROOT.joinpath("hotline").rglob("*.py"),
        *ROOT.joinpath("kernels").glob("*.py"),
        *ROOT.joinpath("tests").glob("*.py"),
        *ROOT.joinpath("benchmarks").glob("*.py"),
    ]
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert len(files) > 150 and not long, f"over {MAX_LINES} lines: {long}"
