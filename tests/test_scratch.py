"""Scratch left by a stopped command: every command unwinds on SIGTERM (its scratch folders and temporary files
removed, one line, exit 143), and what a ``kill -9`` leaves (named as Hotline's temporaries are, with the
pid) is found and removed, with one line naming it, by the next run that writes in that folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotline import _io
from hotline.cli import main

CALIBRATE = ["calibrate", "--disk-only", "--disk-depth", "2", "--disk-record-bytes", "128"]


def _scratch(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(".hotline-disk-calibration")]


def _start_calibration(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """``hotline calibrate --disk DIR`` started, and returned once its scratch folder is in DIR."""
    disk = tmp_path / name
    disk.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [
        sys.executable,
        "-m",
        "hotline",
        *CALIBRATE,
        "--disk",
        str(disk),
        "--out",
        str(tmp_path / f"{name}.json"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    while not _scratch(disk) and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read()
    time.sleep(0.2)  # into the scratch file's writes
    return proc, disk


def test_sigterm_unwinds_a_calibration_and_removes_its_scratch(tmp_path):
    proc, disk = _start_calibration(tmp_path, "disk")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=300)[1].strip().splitlines()
    assert proc.returncode == 143, err
    assert err[-1] == "hotline calibrate: terminated" and not any("Traceback" in line for line in err), err
    assert not _scratch(disk) and not (tmp_path / "disk.json").exists()


def test_a_killed_calibrations_scratch_is_removed_and_named_by_the_next_run(tmp_path, capsys):
    proc, disk = _start_calibration(tmp_path, "disk")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    left = _scratch(disk)
    assert len(left) == 1 and left[0].is_dir() and str(proc.pid) in left[0].name
    mine = disk / "notes.txt"
    mine.write_text("the user's")
    # the next run that writes in that folder (any command: here one whose output goes there) removes it
    assert main(["calibrate", "--out", str(disk / "hw.json"), "--disk-only"]) == 2  # (it needs --disk)
    err = capsys.readouterr().err
    assert f"removed {left[0]}, left by a Hotline run that was killed" in err
    assert not _scratch(disk) and mine.read_text() == "the user's"


@pytest.mark.parametrize("suffix", ["", ".tsv"])
def test_a_killed_runs_temporary_file_is_found_whatever_its_suffix(tmp_path, suffix):
    """``data synthetic --raw-tsv`` keeps its file's suffix on its temporary: found all the same."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".raw.tsv{_io.TMP_MARKER}{int(dead.stdout)}-0a1b2c3d{suffix}"
    stale.write_text("half a file")
    live = _io.temporary_name(tmp_path / "raw.tsv")
    live.write_text("this process's")
    assert _io.remove_stale_temporaries(tmp_path) == [stale]
    assert live.exists() and not stale.exists()
