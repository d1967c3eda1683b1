"""Progress bars only on a terminal: a command whose stderr is a log file or a pipe writes no bar, and so no
``\\r``-rewritten lines, even when its bar is on (no ``--no-progress``)."""

from __future__ import annotations

import subprocess
import sys

from hotline._progress import bar_disable


def test_a_bar_is_off_unless_asked_for_and_else_left_to_the_terminal_check():
    assert bar_disable(False) is True
    assert bar_disable(True) is None  # tqdm: shown on a terminal only


def test_commands_write_no_bar_into_a_log(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "w") as stderr:
        for argv in (
            ["data", "synthetic", "--out", str(tmp_path / "ds"), "--rows", "3000", "--seed", "0",
             "--max-rows-per-table", "500", "--raw-tsv", str(tmp_path / "raw.tsv")],
            ["data", "criteo", str(tmp_path / "raw.tsv"), "--out", str(tmp_path / "criteo")],
            ["profile", str(tmp_path / "ds"), "--hbm-budget", "4KiB", "--out", str(tmp_path / "p.npz")],
        ):  # fmt: skip
            subprocess.run([sys.executable, "-m", "hotline", *argv], check=True, stdout=subprocess.DEVNULL,
                           stderr=stderr, cwd=tmp_path)  # fmt: skip
    text = log.read_text()
    assert "\r" not in text, text[:400]
    assert "%|" not in text  # no bar drawn as plain lines either


def test_a_first_run_says_it_compiles_before_the_mode_choice_does(tmp_path):
    """With nothing in Numba's cache (a fresh install), ``hotline train``'s ``--mode auto`` profiles and times
    kernels before the first step: the compile note comes before that work, not never."""
    import os

    from hotline.datasets.synthetic import generate
    from hotline.training.logs import COMPILE_NOTE

    ds = generate(tmp_path / "ds", 600, seed=2, table_sizes=[40, 30, 500], zipf=1.2, progress=False)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "HOTLINE_CACHE": str(tmp_path / "cache")}
    arch = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
    proc = subprocess.run([sys.executable, "-m", "hotline", "train", str(ds), *arch, "--num-batches", "2",
                           "--no-progress"], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    lines = proc.stderr.splitlines()
    assert COMPILE_NOTE in lines, proc.stderr
    assert lines.index(COMPILE_NOTE) < next(i for i, x in enumerate(lines) if x.startswith("timing this"))
