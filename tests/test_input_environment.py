"""The run's surroundings are checked and cleaned up: hardware descriptions field by field, ranks that die with
their launcher, gloo start-up that retries, and temporaries of killed processes removed (issue 23's input half;
split from test_inputs.py, whose fixtures it shares)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_inputs import LINUX, SMALL, _hotline, _one_error, datasets

from hotline.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return datasets(tmp_path_factory.mktemp("inputs"))


# ----------------------------------------------------------------------------------- hardware descriptions


def _hardware():
    from tests.test_costmodel import HW

    return json.loads(json.dumps(HW))


@pytest.mark.parametrize(
    "edit,text",
    [
        (
            lambda hw: hw["device"].update(dense_gflops=math.nan),
            "device.dense_gflops is nan, not a finite number",
        ),
        (lambda hw: hw["device"].update(mem_gbps=-5.0), "device.mem_gbps is -5.0: a rate must be > 0"),
        (lambda hw: hw["link"].update(h2d_gbps=0), "link.h2d_gbps is 0: a rate must be > 0"),
        (
            lambda hw: hw["host"]["gather_gbps"].update(n=0.0),
            'host.gather_gbps["n"] is 0.0: a rate must be > 0',
        ),
        (lambda hw: hw["host"].update(handover_us=-1.0), "host.handover_us is -1.0: it must be >= 0"),
        (lambda hw: hw["device"].pop("pass_overhead_us"), "device.pass_overhead_us is missing"),
        (lambda hw: hw["host"].pop("scatter_gbps"), "host.scatter_gbps is missing"),
        (lambda hw: hw["device"].update(mem_gbps="fast"), "device.mem_gbps is 'fast', not a number"),
        (lambda hw: hw.pop("link"), "has no 'link' section"),
    ],
)
def test_hardware_json_is_checked_field_by_field(tmp_path, capsys, data, edit, text):
    """A hardware JSON with NaN, negative, zero or missing figures gave a prediction or a traceback."""
    from hotline.costmodel import load_hardware

    hw = _hardware()
    edit(hw)
    f = tmp_path / "hw.json"
    f.write_text(json.dumps(hw))  # NaN is written as the JSON extension NaN, which Python reads back
    with pytest.raises(ValueError, match="hardware description"):
        load_hardware(f)
    argv = [
        "profile",
        str(data["ds"]),
        "--hbm-budget",
        "1KiB",
        "--predict",
        "--hardware",
        str(f),
        "--no-progress",
    ]
    assert main(argv) == 2
    line = _one_error(capsys, "profile")
    assert f"hardware description {f}" in line and text in line, line
    assert "samples of split" not in capsys.readouterr().out  # refused before the profile


def test_hardware_json_that_is_not_an_object_is_one_line(tmp_path):
    from hotline.costmodel import load_hardware

    f = tmp_path / "hw.json"
    f.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a JSON list, not an object"):
        load_hardware(f)
    f.write_text("{")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_hardware(f)
    assert load_hardware(_hardware())["name"] == "test host"  # a complete one passes


# ----------------------------------------------------------------------------------- processes and temporaries


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _dead_or_dying(pid: int) -> bool:
    """Whether ``pid`` is gone, a zombie, or has SIGKILL pending (it dies as soon as it is scheduled)."""
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
    except OSError:
        return True
    kill_bit = 1 << (signal.SIGKILL - 1)
    pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
    return status["State"].split()[0] in ("Z", "X") or bool(pending & kill_bit)


@LINUX
def test_ranks_die_with_their_launcher(data, tmp_path):
    """``kill -9`` of the ``--nproc 2`` launcher left both ranks training and writing for ~40 s: they now
    carry the parent-death signal, so when the launcher is gone they are too (or have SIGKILL pending)."""
    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "hotline", "train", str(data["ds"]), *SMALL, "--nproc", "2", "--nepochs", "100000", "--metrics", str(metrics), "--print-freq", "1"]  # fmt: skip
    launcher = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, start_new_session=True)
    ranks: list[int] = []
    try:
        while launcher.poll() is None and not (metrics.is_file() and metrics.stat().st_size):
            time.sleep(0.05)  # until the ranks train
        ranks = [p for p in _children(launcher.pid) if b"hotline" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(ranks) == 2, ranks
        launcher.kill()
        launcher.wait()
        assert all(_dead_or_dying(p) for p in ranks)
    finally:  # whatever is left (the ranks run in a process group of their own)
        for pid in [launcher.pid, *ranks]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


_FLAKY_GLOO = """
import os
from pathlib import Path

if os.environ.get("RANK") == "1":  # rank 1 of a --nproc run: its first FAILS start-ups fail as a busy machine's
    import hotline.distributed.launcher as launcher

    real, count = launcher._init_process_group, Path(os.environ["FLAKY_DIR"]) / "failures"

    def flaky(*args, **kwargs):
        n = int(count.read_text()) if count.exists() else 0
        if n < int(os.environ["FLAKY_FAILS"]):
            count.write_text(str(n + 1))
            raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:41: Resource temporarily unavailable")
        return real(*args, **kwargs)

    launcher._init_process_group = flaky
"""


@pytest.mark.parametrize("fails,code", [(1, 0), (3, 2)])
def test_gloo_start_up_retries_transient_errors(data, tmp_path, fails, code):
    """``--nproc 2`` sometimes failed to start with ``RuntimeError: Resource temporarily unavailable`` and
    full tracebacks: a transient start-up error now starts every rank again (3 tries), then is one line.
    The error is injected into rank 1's first start-ups (a sitecustomize); everything else is real."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(textwrap.dedent(_FLAKY_GLOO))
    env = {**os.environ, "FLAKY_DIR": str(inject), "FLAKY_FAILS": str(fails)}
    env["PYTHONPATH"] = os.pathsep.join([str(inject), env.get("PYTHONPATH", "")])
    r = _hotline("train", str(data["ds"]), *SMALL, "--nproc", "2", "--num-batches", "2", env=env)
    assert r.returncode == code, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    retried = [
        line for line in r.stderr.splitlines() if "transient: the launcher starts the ranks again" in line
    ]
    assert len(retried) == fails and all(line.startswith("hotline train: rank 1: ") for line in retried)
    if code == 0:
        assert json.loads(r.stdout.strip().splitlines()[-1])["steps"] == 2
    else:
        assert (
            r.stderr.strip()
            .splitlines()[-1]
            .startswith("hotline train: error: the ranks could not form their process group after 3 tries")
        )


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_run(tmp_path):
    """A killed ``data synthetic`` left a hidden temporary folder that later runs never cleaned: the next run
    that writes there removes temporaries whose process is gone, and nothing else."""
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "hotline", "data", "synthetic", "--out", str(out), "--rows", "3000000",
           "--table-sizes", "40,300,25", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not list(tmp_path.glob(".ds.hotline-tmp-*")):
        time.sleep(0.02)
    proc.kill()  # kill -9: no clean-up runs
    proc.wait()
    (left,) = tmp_path.glob(".ds.hotline-tmp-*")
    live = tmp_path / f".ds.hotline-tmp-{os.getppid()}-0123abcd"  # a live process's: kept
    live.mkdir()
    foreign = tmp_path / ".ds.tmp-12345"  # not a Hotline name: kept
    foreign.write_text("mine")
    synth = ["data", "synthetic", "--rows", "300", "--table-sizes", "40,300,25", "--no-progress"]
    assert main([*synth, "--out", str(tmp_path / "other")]) == 0
    assert not left.exists() and live.is_dir() and foreign.read_text() == "mine"
    # (the killed run's lock file may stay: its flock died with the process, so it blocks nobody)
    left_over = sorted(p.name for p in tmp_path.iterdir() if p.name != ".ds.hotline-lock")
    assert left_over == sorted([live.name, foreign.name, "other"])


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    from hotline._io import write_text

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".plan.json.hotline-tmp-{dead.pid}-89abcdef"
    stale.write_text("half")
    write_text(tmp_path / "other.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json"]
