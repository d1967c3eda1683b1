"""The docs cannot drift: every command README.md and docs/*.md show with its output is run here, and its
output compared with the page's.

A page shows a session in a ```console block: lines starting with ``$ `` are commands (run in order, in one
scratch folder per page, with ``hotline`` and ``python`` this checkout's), the lines after one are its output.
A line ``...`` stands for any number of lines (output trimmed on the page). Figures that depend on the machine
(times, rates, the overlap ratio) are masked before comparing. The data are seeded, so text, flags and integers
must match exactly; a float printed by training (a loss, an AUC) ends in digits that depend on the CPU's BLAS
code path, so floats match within :data:`FLOAT_TOLERANCE`, a bound measured across code paths. The pages pass
with ATEN_CPU_CAPABILITY=avx2 and with ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE as well as by default.
A block just after ``<!-- docs-test: skip REASON -->`` is not run (a GPU, hours or tens of GB); the reason is
required. ```bash / ```text blocks show commands or text without a checked output.
docs/cli.md is generated from the parsers and must equal what they print now.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_BLOCK = re.compile(r"(?:<!-- docs-test: skip(?P<skip>[^>]*)-->\s*\n)?```console\n(?P<body>.*?)```", re.S)

# Machine-dependent figures: a time, a rate, the overlap ratio, a size in a "took" line. Masked on both sides.
_VOLATILE = [
    (
        re.compile(
            r"\d[\d,]*(\.\d+)?(e[+-]?\d+)? ?(samples/s|rows/s|lookups/s|M/s|GB/s|MB/s|ms/step|ms|s)\b"
        ),
        "<t>",
    ),
    (
        re.compile(r'"(samples_per_s|seconds|wall_s|elapsed_s|[a-z_]*_seconds|[a-z_]*_ms)": [-\d.e+]+'),
        r'"\1": <t>',
    ),
    (re.compile(r"overlap \d\.\d+"), "overlap <r>"),
    (re.compile(r"\d+:\d\d(:\d\d)?"), "<clock>"),
    (re.compile(r"peak RSS [\d.]+ [KMG]iB"), "peak RSS <m>"),
]


def _mask(line: str) -> str:
    for pattern, repl in _VOLATILE:
        line = pattern.sub(repl, line)
    return line.rstrip()


def parse_blocks(text: str) -> list[tuple[str | None, list[tuple[str, list[str]]]]]:
    """The console blocks of a page: (skip reason or None, [(command, expected output lines)])."""
    blocks = []
    for m in _BLOCK.finditer(text):
        steps: list[tuple[str, list[str]]] = []
        for line in m.group("body").splitlines():
            if line.startswith("$ "):
                steps.append((line[2:].strip(), []))
            elif steps:
                steps[-1][1].append(line)
            elif line.strip():
                raise AssertionError(f"a console block starts with output, not a command: {line!r}")
        skip = m.group("skip")
        blocks.append((skip.strip() if skip is not None else None, steps))
    return blocks


_NUMBER = re.compile(r"(-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)")
FLOAT_TOLERANCE = 5e-3
"""How far a printed float (a number with a decimal point or an exponent) may stand from the page's, relative
to max(1, |page's value|). Training is chaotic in its last bits: the losses, AUCs, log-losses, accuracies and
predictions it prints end in digits that depend on the CPU's BLAS code path. Measured on the pages' commands:
an Intel Xeon printed floats up to 3e-4 from an AMD EPYC's; the scalar code path (ATEN_CPU_CAPABILITY=default
MKL_CBWR=COMPATIBLE) up to 3.5e-3 from the vectorised one (an accuracy that moved by 5 of 1,429 samples after
134 steps of DLRM-DCNv2). Text, flags and integers (row counts, table sizes, steps) must match exactly."""


def _line_matches(expected: str, actual: str) -> bool:
    """Equal text and integers; floats within :data:`FLOAT_TOLERANCE`."""
    exp, act = _NUMBER.split(expected), _NUMBER.split(actual)
    if len(exp) != len(act):
        return False
    for k, (e, a) in enumerate(zip(exp, act)):
        if k % 2 == 0 or e == a:  # text between numbers, or the same number
            if e != a:
                return False
            continue
        if not any(c in e for c in ".e") or not any(c in a for c in ".e"):
            return False  # an integer is printed exactly
        x, y = float(e.replace(",", "")), float(a.replace(",", ""))
        if abs(x - y) > FLOAT_TOLERANCE * max(1.0, abs(x)):
            return False
    return True


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` equals ``expected`` line by line (:func:`_line_matches`), a ``...`` line matching
    any run of lines."""
    exp = [_mask(e) for e in expected]
    act = [_mask(a) for a in actual]
    while exp and not exp[-1]:
        exp.pop()
    while act and not act[-1]:
        act.pop()

    def go(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(go(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and _line_matches(exp[i], act[j]) and go(i + 1, j + 1)

    return go(0, 0)


def _scratch(folder: Path) -> dict:
    """Makes the empty ``folder`` a page's working directory (nothing of the checkout in it: the pages say
    their commands run in an empty directory); returns the environment its commands run in (:func:`_shims`)."""
    return _shims(folder)


def _run(command: str, folder: Path, env: dict) -> tuple[int, list[str]]:
    """Runs a page's command in ``folder``: its exit status and output lines, the scratch folder's path shown
    as the page's "." and the first-run compile note (only a cold Numba cache prints it) left out."""
    proc = subprocess.run(command, shell=True, cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)  # fmt: skip
    lines = proc.stdout.replace(f"{folder}/", "").splitlines()
    return proc.returncode, [x for x in lines if not x.startswith("compiling kernels, once")]


def _shims(folder: Path) -> dict:
    """PATH with ``hotline`` and ``python`` as this interpreter and checkout."""
    bin_dir = folder / ".bin"
    bin_dir.mkdir()
    for name, target in (
        ("hotline", f'"{sys.executable}" -m hotline "$@"'),
        ("python", f'"{sys.executable}" "$@"'),
    ):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\nexec {target}\n")
        script.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "100"
    env.pop("HOTLINE_DEBUG", None)
    return env


def test_parse_and_match_rules():
    text = "```console\n$ echo a\na\n...\nz\n$ true\n```\n<!-- docs-test: skip needs a GPU -->\n```console\n$ x\n```"
    (skip1, steps1), (skip2, steps2) = parse_blocks(text)
    assert skip1 is None and steps1 == [("echo a", ["a", "...", "z"]), ("true", [])]
    assert skip2 == "needs a GPU" and steps2 == [("x", [])]
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"]) and matches(["a", "...", "z"], ["a", "z"])
    assert not matches(["a", "...", "z"], ["a", "b"]) and not matches(["a"], ["a", "b"])
    assert matches(["took 1.4 s at 12,345 samples/s"], ["took 0.9 s at 9,001.5 samples/s"])
    assert matches(["loss 0.5492  auc 0.69311"], ["loss 0.5493  auc 0.69292"])  # a float within tolerance
    assert not matches(["loss 0.5492"], ["loss 0.5552"])  # and beyond it
    assert not matches(["train 85,715 rows"], ["train 85,716 rows"])  # integers exactly
    assert not matches(["0.5 of 12"], ["0.5 of 12.0"]) and not matches(["a 1"], ["a 1 2"])
    assert not matches(["loss 0.5492"], ["lost 0.5492"])  # text exactly


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_commands_print_what_the_page_shows(page: Path, tmp_path: Path):
    blocks = parse_blocks(page.read_text())
    runnable = [(skip, steps) for skip, steps in blocks if skip is None]
    for skip, _ in blocks:
        assert skip is None or skip, f"{page.name}: a skipped block must give its reason"
    if not runnable:
        pytest.skip(f"{page.name} shows no command with output")
    env = _scratch(tmp_path)
    for _, steps in runnable:
        for command, expected in steps:
            code, actual = _run(command, tmp_path, env)
            wants_error = any("error:" in line for line in expected)
            assert (code != 0) == wants_error, f"{page.name}: `{command}` exited {code}:\n" + "\n".join(
                actual[-40:]
            )
            assert matches(expected, actual), (
                f"{page.name}: `{command}` printed\n"
                + "\n".join(actual)
                + "\n\nthe page shows\n"
                + "\n".join(expected)
            )


def test_cli_reference_is_generated_from_the_parsers():
    from hotline.cli.reference import page_path, render

    assert page_path().read_text() == render(), (
        "docs/cli.md is stale: run `python -m hotline.cli.reference --write`"
    )


DOCS_MAX_BYTES = 155_000
"""docs/*.md together at most this many bytes: half of what they were as lab notebooks (310 KB). A page says
what a feature is, how to use it, what it guarantees and the test that shows it; measured figures live in
benchmarks/results/ and the generated performance page."""


def test_docs_stay_reference_sized():
    sizes = {p.name: len(p.read_bytes()) for p in sorted((ROOT / "docs").glob("*.md"))}
    total = sum(sizes.values())
    largest = ", ".join(f"{n} {b:,}" for n, b in sorted(sizes.items(), key=lambda x: -x[1])[:4])
    assert total <= DOCS_MAX_BYTES, f"docs/ is {total:,} bytes, over {DOCS_MAX_BYTES:,} (largest: {largest})"


def _help_fragments(text: str) -> list[str]:
    """The pieces of a ``--help`` printed at a width that wraps nothing: each line's runs of text between two or
    more spaces (an option's invocation, its help; a group's title without its colon), the usage left out."""
    lines = text.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if not line.strip()) :]  # after the usage block
    skip = {"options", "positional arguments", "-h, --help", "show this help message and exit"}
    out = []
    for line in body:
        for piece in re.split(r"\s{2,}", line.strip()):
            piece = piece.removesuffix(":")  # a group's title
            if piece and piece not in skip:
                out.append(piece)
    return out


def test_cli_reference_holds_every_line_of_every_commands_help(monkeypatch):
    """docs/cli.md is --help without its layout: each piece of each command's --help (flags, help texts with
    their defaults, group titles and descriptions, sub-commands) is in that command's section of the page or in
    its shared flags."""
    from hotline.cli import build_parser
    from hotline.cli.reference import page_path, walk

    monkeypatch.setenv("COLUMNS", "2000")
    page = page_path().read_text().replace("\\*", "*")
    sections = dict(re.findall(r"^## `?([^`\n]+)`?\n(.*?)(?=^## |\Z)", page, re.S | re.M))
    shared = " ".join(sections["Flags several commands share"].split())
    checked = 0
    for name, parser in walk(build_parser()):
        parser.prog = name
        mine = " ".join(sections[name].split()) + " " + shared
        for piece in _help_fragments(parser.format_help()):
            assert " ".join(piece.split()) in mine, (
                f"docs/cli.md, `{name}`: {piece!r} of its --help is missing"
            )
            assert not re.search(r"(\([^()]+\))\s*\1", piece), f"`{name}`: {piece!r} says it twice"
            checked += 1
    assert checked > 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_test_a_page_names_exists(page: Path):
    """A page names a test as ``test_file.py::test_name``, or ``::test_name`` after a mention of its file
    (``tests/test_file.py``); every one is a test function of that file (``-k bad-input`` selects this page's)."""
    import ast

    file = None
    for m in re.finditer(r"(?:tests/)?(test_\w+\.py)|::(test_\w+)", page.read_text()):
        if m.group(1):
            file = m.group(1)
            assert (ROOT / "tests" / file).exists(), f"{page.name} names tests/{file}, which does not exist"
            continue
        assert file, f"{page.name}: ::{m.group(2)} before any test file is named"
        tree = ast.parse((ROOT / "tests" / file).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert m.group(2) in names, f"{page.name} names {file}::{m.group(2)}, which does not exist"


def test_links_between_pages_resolve():
    link = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(#[^)]*)?\)")
    for page in PAGES:
        for target, _ in link.findall(page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_performance_page_is_the_benchmarks_json(tmp_path):
    """docs/performance.md is what benchmarks/run_all.py makes of the committed JSON in benchmarks/results."""
    out = tmp_path / "performance.md"
    script = ROOT / "benchmarks" / "run_all.py"
    results = ROOT / "benchmarks" / "results"
    subprocess.run([sys.executable, str(script), "--from-json", str(results), "--out", str(out)], check=True,
                   cwd=ROOT, capture_output=True)  # fmt: skip
    assert out.read_text() == (ROOT / "docs" / "performance.md").read_text(), (
        "docs/performance.md is stale: python benchmarks/run_all.py --from-json benchmarks/results"
    )


def test_run_all_quotes_a_benchmark_with_its_machine(tmp_path):
    out = tmp_path / "performance.md"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--only", "dispatcher", "--smoke",
                    "--json-dir", str(tmp_path / "results"), "--out", str(out)], check=True, cwd=ROOT,
                   capture_output=True)  # fmt: skip
    text = out.read_text()
    dispatcher = text.split("## dispatcher", 1)[1].split("\n## ", 1)[0]
    assert "python benchmarks/bench_dispatcher.py --json dispatcher.json" in dispatcher
    assert "cores" in dispatcher and "load average" in dispatcher
    assert "| method |" in dispatcher or "| " in dispatcher.split("load average", 1)[1]  # the results table
    assert "Not run yet." in text.split("## profile", 1)[1].split("\n## ", 1)[0]


def test_readme_is_short():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 16 * 1024, f"README.md is {len(text.encode())} bytes (at most 16 KiB)"


def update_page(page: Path) -> None:
    """Reruns a page's console blocks and writes what each command printed as its shown output (then trim by
    hand with ``...`` lines where a command prints pages). ``python tests/test_docs.py --rewrite PAGE``."""
    import tempfile

    text = page.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = _scratch(folder)

        def rerun(m: re.Match) -> str:
            if m.group("skip") is not None:
                return m.group(0)
            out = []
            for command, _ in parse_blocks(m.group(0))[0][1]:
                out += [f"$ {command}", *_run(command, folder, env)[1]]
            return "```console\n" + "\n".join(out) + "\n```"

        page.write_text(_BLOCK.sub(rerun, text))


def main(argv: list[str] | None = None) -> int:
    """``python tests/test_docs.py --rewrite PAGE...``: the pages' shown outputs rewritten (not a test: pytest
    runs the tests)."""
    import argparse

    p = argparse.ArgumentParser(
        description="Rewrite the shown output of each console block of PAGE with what its commands print now "
        "(this does not test the pages: `python -m pytest tests/test_docs.py` does)."
    )
    p.add_argument("--rewrite", action="store_true", required=True, help="rewrite the pages named (required)")
    p.add_argument(
        "pages", nargs="+", type=Path, metavar="PAGE", help="a Markdown page (README.md, docs/X.md)"
    )
    args = p.parse_args(argv)
    missing = [str(page) for page in args.pages if not page.is_file()]
    if missing:
        p.error(f"no such page: {', '.join(missing)}")
    for page in args.pages:
        update_page(page.resolve())
        print(f"rewrote the outputs of {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
