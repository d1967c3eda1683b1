"""A rank of ``hotline train --nproc 2`` killed with ``kill -9``: stderr is the launcher's one line naming the
rank and the signal, not the surviving rank's gloo traceback (``Connection reset by peer``) or torch
elastic's log lines; a collective that loses its peer exits the survivor quietly with
``EXIT_PEER_LOST``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotline.datasets.synthetic import generate
from hotline.distributed.comm import EXIT_PEER_LOST, PeerLost, peer_guard
from tests.test_last_inputs import SMALL  # the tiny model of every CLI case

ROOT = Path(__file__).resolve().parents[1]


def _ranks(launcher: int) -> dict[int, int]:
    """Rank -> pid of the ranks the launcher ``launcher`` started."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = dict(e.split(b"=", 1) for e in (p / "environ").read_bytes().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if env.get(b"HOTLINE_LAUNCHER_PID") == str(launcher).encode() and b"LOCAL_RANK" in env:
            out[int(env[b"LOCAL_RANK"])] = int(p.name)
    return out


@pytest.mark.parametrize("mode,rank", [("hybrid", 1), ("hotline", 0)])
def test_a_killed_rank_is_the_only_line_not_the_survivors_traceback(tmp_path, mode, rank):
    ds = generate(tmp_path / "ds", 20000, seed=1, table_sizes=[40, 300, 25], progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    hot = ["--hbm-budget", "1KiB"] if mode == "hotline" else []
    cmd = [sys.executable, "-m", "hotline", "train", str(ds), *SMALL, "--mode", mode, *hot, "--nproc", "2",
           "--mini-batch-size", "16", "--num-batches", "100000", "--checkpoint-dir", str(tmp_path / "ck"),
           "--checkpoint-every", "5", "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 600
    while (
        proc.poll() is None and time.monotonic() < deadline and not list((tmp_path / "ck").glob("*.commit"))
    ):
        time.sleep(0.2)
    ranks = _ranks(proc.pid)
    assert proc.poll() is None and rank in ranks, proc.stderr.read() if proc.poll() is not None else ranks
    os.kill(ranks[rank], signal.SIGKILL)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 128 + signal.SIGKILL, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # no "[rank0]: Traceback", no torch elastic "failed (exitcode: -9)" line
    assert lines[0].startswith(f"hotline train: error: rank {rank} was killed by SIGKILL"), err
    assert "--resume continues from it" in lines[0]


@pytest.mark.parametrize(
    "text",
    ["[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:54963: Connection reset by peer.",
     "[../gloo/transport/tcp/unbound_buffer.cc:81] Connection closed by peer [127.0.0.1]:1234"],
)  # fmt: skip
def test_a_collective_that_lost_its_peer_exits_quietly_with_its_status(monkeypatch, capsys, text):
    monkeypatch.setenv("HOTLINE_LAUNCHED", "1")
    with pytest.raises(PeerLost) as e, peer_guard(0):
        raise RuntimeError(text)
    assert e.value.code == EXIT_PEER_LOST and capsys.readouterr().err == ""  # the launcher names the cause
    monkeypatch.delenv("HOTLINE_LAUNCHED")
    with pytest.raises(PeerLost), peer_guard(1):  # under torchrun: one line of its own
        raise RuntimeError(text)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "hotline: error: rank 1 lost its connection to another rank"
    ), err


def test_another_collective_error_is_left_alone():
    with pytest.raises(RuntimeError, match="tensor size mismatch"), peer_guard(0):
        raise RuntimeError("tensor size mismatch")


def test_sigterm_to_the_launcher_is_one_line_not_torch_elastics_warning(tmp_path):
    """SIGTERM to ``--nproc 2``'s launcher printed torch elastic's "Received 15 death signal, shutting down
    workers" warning before ``hotline train: terminated``."""
    ds = generate(tmp_path / "ds", 20000, seed=1, table_sizes=[40, 300, 25], progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "hotline", "train", str(ds), *SMALL, "--mode", "hybrid", "--nproc", "2",
           "--mini-batch-size", "8", "--nepochs", "50", "--threads", "1", "--metrics", str(metrics)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 600
    lines = lambda: metrics.read_bytes().count(b"\n") if metrics.exists() else 0  # noqa: E731
    while proc.poll() is None and time.monotonic() < deadline and lines() < 2:  # training, not starting
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert [x for x in err.strip().splitlines() if not x.startswith("step ")] == [
        "hotline train: terminated"
    ], err
