"""Every benchmark's outputs go through the project's output policy (``benchmarks/common.judge_outputs``, and
``run_all``'s claim): a ``--json`` (or ``--hardware-out``) that is a folder, one of the run's inputs, inside
one, or another output's file is refused with one line and exit 2 while the flags are read, before any work,
and nothing the user owns is touched. Discovered from the scripts' own text, so a new benchmark is covered."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import common  # noqa: E402 - benchmarks/ on the path first

NOT_SCRIPTS = {"common", "run_all", "gpu_parts", "scale_stages"}  # parts of gpu_bench, bench_scale
SCRIPTS = sorted(
    p.stem
    for p in BENCHMARKS.glob("*.py")
    if p.stem not in NOT_SCRIPTS and ('"--json"' in p.read_text() or "common.parser(" in p.read_text())
)
INPUTS = [
    (name, dest)
    for name in SCRIPTS
    for dest in common.INPUT_FLAGS
    if f'"--{dest.replace("_", "-")}"' in (BENCHMARKS / f"{name}.py").read_text()
]


def refused(main, argv: list[str], capsys) -> str:
    """The one line ``main(argv)`` is refused with (exit 2)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "refused without a message"
    return err[-1]


def test_every_benchmark_with_a_json_is_covered():
    """The discovery finds the scripts (a typo in it would make every test below vacuous)."""
    assert {"bench_pipeline", "bench_disk_tier", "bench_preprocess", "bench_profile", "gpu_bench"} <= set(
        SCRIPTS
    )
    assert ("bench_pipeline", "pool") in INPUTS and ("bench_costmodel", "hardware") in INPUTS
    assert ("gpu_bench", "host") in INPUTS and ("bench_train", "data") in INPUTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_json_that_is_a_folder_is_refused_before_any_work(name, tmp_path, capsys):
    line = refused(importlib.import_module(name).main, ["--json", str(tmp_path)], capsys)
    assert line.endswith(f"--json {tmp_path} is a directory: give a file name"), line


@pytest.mark.parametrize(("name", "dest"), INPUTS)
def test_a_json_is_never_an_input_nor_inside_one(name, dest, tmp_path, capsys):
    """A calibration or a dataset the run reads is never overwritten by its results, nor written into."""
    flag = "--" + dest.replace("_", "-")
    folder = tmp_path / "input"
    folder.mkdir()
    mine = folder / "mine.json"
    mine.write_text('{"mine": 1}\n')
    main = importlib.import_module(name).main
    for given, out in ((mine, mine), (folder, folder / "results.json")):
        line = refused(main, [flag, str(given), "--json", str(out)], capsys)
        assert f"--json {out}" in line and "an input of this command" in line and flag in line, line
    assert mine.read_text() == '{"mine": 1}\n' and sorted(folder.iterdir()) == [mine]


def test_two_outputs_on_one_file_are_refused(tmp_path, capsys):
    out = tmp_path / "both.json"
    line = refused(importlib.import_module("gpu_bench").main, ["--json", str(out), "--hardware-out", str(out)],
                   capsys)  # fmt: skip
    assert "are the same file" in line and "--hardware-out" in line, line
    assert not out.exists()


def test_a_json_through_a_link_writes_the_link_target(tmp_path):
    """A link is followed: what was judged is what is written."""
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    p = common.parser(None)
    ns = p.parse_args(["--json", str(link)])
    assert ns.json == target
    common.write_json(ns.json, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1} and link.is_symlink()


def test_bench_preprocess_works_in_a_folder_of_its_own_inside_dir(tmp_path):
    """``--dir`` of a user's (their Criteo ``train.txt`` in it) holds only the run's own temporary folder,
    removed at the end: the user's files are as they were."""
    work = tmp_path / "criteo"
    work.mkdir()
    theirs = work / "train.txt"
    theirs.write_text("1\t2\n")
    out = work / "result.json"
    code = importlib.import_module("bench_preprocess").main(
        ["--rows", "2000", "--baseline-rows", "200", "--repeats", "1", "--dir", str(work), "--json", str(out)]
    )
    assert code == 0
    assert theirs.read_text() == "1\t2\n" and sorted(work.iterdir()) == [out, theirs]
    assert json.loads(out.read_text())["rows"] == 2000


def _run_all(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "run_all.py"), *argv], capture_output=True, text=True
    )


def test_run_all_never_writes_its_page_over_the_json_it_is_made_from(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    record = results / "dispatcher.run.json"
    record.write_text("{}\n")
    got = _run_all("--from-json", str(results), "--out", str(record))
    assert got.returncode == 2 and record.read_text() == "{}\n"
    line = got.stderr.strip().splitlines()[-1]
    assert f"--out {record}" in line and "an input of this command" in line, line
    got = _run_all("--from-json", str(tmp_path / "missing"), "--out", str(tmp_path / "page.md"))
    assert got.returncode == 2 and "--from-json" in got.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "page.md").exists() and not (tmp_path / "missing").exists()
    page = tmp_path / "page.md"
    got = _run_all("--json-dir", str(page), "--out", str(page), "--only", "dispatcher", "--smoke")
    assert got.returncode == 2 and not page.exists(), got.stderr


def test_steal_share_is_the_hosts_share_of_the_ticks_between_two_readings():
    """The benchmarks record how much of a run's CPU time a virtual machine's host took away (/proc/stat's
    steal, the eighth figure): golden values, and the real reading where /proc says."""
    before = [100, 0, 50, 800, 10, 0, 5, 35]
    after = [160, 0, 70, 900, 10, 0, 5, 55]  # 200 ticks, 20 of them stolen
    assert common.steal_share(before, after) == pytest.approx(0.1)
    assert common.steal_share(before, before) == 0.0
    assert common.steal_share(None, after) is None and common.steal_share(before[:4], after) is None
    ticks = common.cpu_ticks()
    if Path("/proc/stat").exists():
        assert ticks is not None and len(ticks) == 8 and all(t >= 0 for t in ticks)
        assert 0.0 <= common.steal_share(ticks, common.cpu_ticks()) <= 1.0
