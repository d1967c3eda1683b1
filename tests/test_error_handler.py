"""The top-level error handler (hotline/cli): one line for an error, the traceback behind it with ``--debug``,
the install command for a missing optional package, one line for out of memory, exit 130 on Ctrl-C (split
from test_safety.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest
from test_safety import SIZES, SMALL, SYNTH, _one_error

from hotline.cli import main
from hotline.datasets.synthetic import generate


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The dataset the runs train on (test_safety.py's ``data`` also holds a raw Criteo file)."""
    root = tmp_path_factory.mktemp("handler")
    return {"ds": generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)}


# ------------------------------------------------------------------------------ the top-level handler


def test_debug_shows_the_traceback_behind_the_line(data, capsys, monkeypatch):
    monkeypatch.delenv("HOTLINE_DEBUG", raising=False)
    argv = ["train", str(data["ds"]), *SMALL, "--mini-batch-size", "0"]
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):" and "ValueError" in err[-2]
    assert err[-1] == "hotline train: error: mini_batch_size (--mini-batch-size) must be positive, got 0"
    assert "HOTLINE_DEBUG" not in os.environ  # --debug held for that call only
    assert main(argv) == 2
    _one_error(capsys, "train")
    monkeypatch.setenv("HOTLINE_DEBUG", "1")
    assert main(argv) == 2
    assert "Traceback" in capsys.readouterr().err


def test_missing_optional_package_names_the_install_command(data):
    code = (
        "import sys; sys.modules['torchrec'] = None\n"  # as if torchrec were not installed
        "from hotline.cli import main\n"
        f"sys.exit(main(['plan', {str(data['ds'])!r}, '--no-progress']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "hotline plan: error: this needs the optional package 'torchrec': "
        'pip install "hotline-dlrm[torchrec]" && pip install --no-deps torchrec==1.8.0'
    ]


def test_memory_error_is_one_line(tmp_path, capsys, monkeypatch):
    import hotline.datasets.synthetic as synthetic

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 80.0 GiB for an array with shape (10000000000, 2)")

    monkeypatch.setattr(synthetic, "generate", no_memory)
    assert main(["data", "synthetic", "--out", str(tmp_path / "ds"), *SYNTH]) == 2
    line = _one_error(capsys, "data synthetic")
    assert line.startswith("hotline data synthetic: error: out of memory (Unable to allocate 80.0 GiB")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_is_one_line_and_exit_130(data, tmp_path, presses):
    """Waits on events, not on time: the run's first log line says it trains; the presses follow at once (a
    second press inside the first one's handling must not matter)."""
    cmd = [sys.executable, "-m", "hotline", "train", str(data["ds"]), *SMALL, "--nepochs", "100000"]
    cmd += ["--print-freq", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        while not lines or not lines[-1].startswith("step "):  # until it trains (a log line per step)
            line = proc.stderr.readline()
            assert line, f"the run ended before its first step: {''.join(lines)}"
            lines.append(line)
        for _ in range(presses):
            with contextlib.suppress(ProcessLookupError):  # already gone after the first: fine
                os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        after = proc.communicate(timeout=600)[1]  # (a hang guard, not a time bound)
    finally:
        proc.kill()
    assert proc.returncode == 130, "".join(lines) + after
    # what the presses made it print: one line, the last (no traceback, no second message)
    out = after.strip().splitlines()
    assert out[-1] == "hotline train: interrupted" and "Traceback" not in after, after
    assert sum("interrupted" in line or "rror" in line for line in out) == 1, after
