"""run_all waits for the machine to settle before each benchmark (``settle``): golden sequences of ``/proc``
snapshots on a fake clock (no wall-clock bounds), and the real ``/proc`` read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import run_all  # noqa: E402 - benchmarks/ on the path first
from run_all import Snapshot, quiet, settle  # noqa: E402


class Machine:
    """Snapshots one second apart: ``busy`` ticks of 200 per second (2 cores), blocked tasks, requests."""

    def __init__(self, seconds: list[tuple[int, int, int]]):
        self.seconds, self.t, self.busy, self.total = list(seconds), 0.0, 0, 0

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s

    def sample(self) -> Snapshot:
        busy, blocked, in_flight = self.seconds.pop(0) if self.seconds else (0, 0, 0)
        self.busy += busy
        self.total += 200
        return Snapshot(self.busy, self.total, blocked, in_flight)


def test_quiet_needs_idle_cores_and_an_idle_disk():
    a = Snapshot(0, 0, 0, 0)
    assert quiet(a, Snapshot(20, 200, 0, 0))  # 10% busy: quiet
    assert not quiet(a, Snapshot(21, 200, 0, 0))
    assert not quiet(a, Snapshot(0, 200, 1, 0))  # a task waits on the disk
    assert not quiet(a, Snapshot(0, 200, 0, 3))  # requests in flight
    assert quiet(a, Snapshot(0, 0, 0, 0))  # no ticks counted: nothing was busy


def test_settle_waits_for_quiet_seconds_in_a_row():
    # busy disk for 3 s, one quiet second, one noisy, then quiet: the run of 5 starts after the noisy one
    m = Machine([(0, 0, 0), (150, 4, 9), (100, 2, 3), (50, 1, 1), (0, 0, 0), (90, 0, 0)])
    got = settle(quiet_s=5, limit_s=300, sample=m.sample, sleep=m.sleep, clock=m.clock)
    assert got == {"settled": True, "waited_s": 10.0, "quiet_s": 5}


def test_settle_gives_up_at_its_limit_and_says_so():
    m = Machine([(0, 0, 0)] + [(0, 1, 0)] * 100)
    got = settle(quiet_s=5, limit_s=30, sample=m.sample, sleep=m.sleep, clock=m.clock)
    assert got == {"settled": False, "waited_s": 30.0, "quiet_s": 5}


def test_settle_without_proc_does_not_wait():
    got = settle(sample=lambda: None, sleep=pytest.fail, clock=lambda: 0.0)
    assert got["settled"] is None and got["waited_s"] == 0.0


def test_snapshot_reads_this_machine():
    s = run_all.snapshot()
    if s is None:
        pytest.skip("no /proc here")
    assert s.total >= s.busy >= 0 and s.blocked >= 0 and s.in_flight >= 0


def test_the_page_says_how_the_machine_was_before_a_run():
    assert run_all._settled(None) == "" and run_all._settled({"settled": None, "waited_s": 0.0}) == ""
    assert run_all._settled({"settled": True, "waited_s": 42.4, "quiet_s": 5}) == (
        " (quiet for 5 s after 42 s of waiting)"
    )
    assert "not quiet" in run_all._settled({"settled": False, "waited_s": 300.0, "quiet_s": 5})
