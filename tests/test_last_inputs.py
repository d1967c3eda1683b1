"""The last bad inputs of their kind: a read-only install without a writable HOME (Numba's cache), I/O depths
beyond reason, ``calibrate --disk-only --force`` onto a file that is not a hardware description,
``evaluate`` of an empty split (strict JSON), ``--hardware GPU`` priced on a CPU, and a rank killed under
``--nproc 2``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotline.cli import main
from hotline.cli.calibrate import _document
from hotline.datasets.synthetic import generate

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "--arch-sparse-feature-size",
    "4",
    "--arch-mlp-bot",
    "13-8-4",
    "--arch-mlp-top",
    "8-1",
    "--no-progress",
]


def test_no_writable_cache_folder_compiles_without_a_cache_and_says_so_once(tmp_path):
    """Neither the kernels' folder (its ``__pycache__`` is a file here: as root a read-only folder is still
    writable) nor HOME can take Numba's cache: ``hotline --version`` and a kernel import work, one line says so."""
    tree = tmp_path / "ro"
    for part in ("hotline", "kernels"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "kernels" / "__pycache__").write_text("not a folder")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "NUMBA_CACHE_DIR")}
    env.update(HOME="/dev/null/nohome", PYTHONPATH=str(tree))
    for argv in (["-m", "hotline", "--version"], ["-c", "import hotline.kernels.criteo_parse"]):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and "compiled on every run (no cache)" in err[0], err
    assert not (tmp_path / "numba").exists()


@pytest.mark.parametrize("xdg", ["", "relative/cache"])
def test_an_empty_or_relative_xdg_cache_home_caches_in_home_not_the_working_folder(tmp_path, xdg):
    """A read-only install (the kernels' ``__pycache__`` is a file) with ``XDG_CACHE_HOME`` empty or relative:
    Numba's own rule would cache into ``./numba`` (or ``./relative/cache/numba``) of the working folder; the
    XDG rule ignores such a value, so the cache goes to ``$HOME/.cache/numba``."""
    tree, work, home = tmp_path / "ro", tmp_path / "work", tmp_path / "home"
    for part in ("hotline", "kernels"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "kernels" / "__pycache__").write_text("not a folder")
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(HOME=str(home), XDG_CACHE_HOME=xdg, PYTHONPATH=str(tree))
    code = "import numpy as np, hotline.kernels.reuse as r; r._fenwick_add(np.zeros(5, np.int64), 1, 1)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    assert list(work.iterdir()) == []
    assert any((home / ".cache" / "numba").rglob("*.nbi"))


@pytest.mark.parametrize("argv", [["calibrate", "--disk", ".", "--disk-only", "--disk-depth", "1000000"],
                                  ["train", "D", "--cold-store", "disk", "--cold-dir", ".", "--cold-io-depth", "100000"]])  # fmt: skip
def test_an_io_depth_beyond_reason_is_one_line(tmp_path, capsys, argv):
    os.chdir(tmp_path)
    assert main([*argv[:1], *argv[1:], "--out", "hw.json"] if argv[0] == "calibrate" else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be in [1, 1024] (reads in flight, one I/O thread each)" in err[0], err


@pytest.mark.parametrize("text", ["not json at all", "[1, 2]", '{"format": "other"}'])
def test_disk_only_force_onto_a_file_that_is_not_a_hardware_description_starts_a_new_one(
    tmp_path, capsys, text
):
    out = tmp_path / "hw.json"
    out.write_text(text)
    assert _document(out) == {"format": "hotline-hardware"}
    assert "is not a Hotline hardware description: --force replaces it" in capsys.readouterr().err
    out.write_text('{"format": "hotline-hardware", "host": {"x": 1}}')
    assert _document(out)["host"] == {"x": 1}


def test_evaluate_of_an_empty_split_is_strict_json(tmp_path, capsys):
    ds = generate(tmp_path / "tiny", 6, seed=1, table_sizes=[20, 30], progress=False)  # no val, no test rows
    assert main(["train", str(ds), *SMALL, "--mode", "device", "--save", str(tmp_path / "c.pt")]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(ds), "--load", str(tmp_path / "c.pt"), "--split", "val"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert record["auc"] is None if "auc" in record else any(v is None for v in record.values())


def test_a_gpu_named_as_hardware_on_a_cpu_is_said(tmp_path, capsys):
    from hotline import TrainConfig
    from hotline.costmodel.auto import choose_for_run
    from hotline.datasets.format import Dataset

    ds = Dataset(generate(tmp_path / "ds", 3000, seed=1, table_sizes=[40, 300, 25], progress=False))
    cfg = TrainConfig(mode="auto", embedding_dim=4, bottom_mlp=[13, 8, 4], top_mlp=[8, 1], progress=False)
    choose_for_run(cfg, ds, "H200")
    err = capsys.readouterr().err
    assert "--hardware H200 prices a H200's speeds, but this run trains on the CPU" in err


def test_a_rank_killed_under_nproc_2_is_named_and_the_checkpoint_said_intact(tmp_path):
    ds = generate(tmp_path / "ds", 20000, seed=1, table_sizes=[40, 300, 25], progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "hotline", "train", str(ds), *SMALL, "--mode", "hybrid", "--nproc", "2",
           "--mini-batch-size", "16", "--num-batches", "100000", "--checkpoint-dir", str(tmp_path / "ck"),
           "--checkpoint-every", "5", "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    ranks: list[int] = []
    deadline = time.monotonic() + 600
    while (
        time.monotonic() < deadline and proc.poll() is None and not list((tmp_path / "ck").glob("*.commit"))
    ):
        time.sleep(0.2)
    ranks = [
        int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _rank_of(int(p.name), proc.pid)
    ]
    assert proc.poll() is None and ranks, proc.stderr.read() if proc.poll() is not None else "no rank found"
    os.kill(max(ranks), signal.SIGKILL)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 128 + signal.SIGKILL, err
    line = [x for x in err.splitlines() if x.startswith("hotline train: error: rank")]
    assert len(line) == 1 and "was killed by SIGKILL" in line[0] and "checkpoint" in line[0], err


def _rank_of(pid: int, launcher: int) -> bool:
    """Whether ``pid`` is a rank (``LOCAL_RANK`` set) started under the launcher ``launcher``."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"HOTLINE_LAUNCHER_PID={launcher}".encode() in env and any(
        e.startswith(b"LOCAL_RANK=") for e in env
    )
