"""The streamed ``--metrics`` file (hotline/outputs.py's LineFile): whole lines only, a resumed run continues it
without doubling records, and two real runs on one file do not mix (split from test_outputs.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_outputs import SIZES, SMALL, USER, _refused

from hotline.cli import main
from hotline.datasets.synthetic import generate
from hotline.outputs import LineFile, records_up_to


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The dataset the runs train on (test_outputs.py's ``env`` also holds the other commands' inputs)."""
    root = tmp_path_factory.mktemp("metrics")
    return {"ds": generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)}


# ---------------------------------------------------------------------------- the streamed --metrics file
def _records(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n")  # whole lines only
    return [json.loads(line) for line in text.splitlines()]


def _comparable(rec: dict) -> dict:
    """A record without what depends on the clock."""
    drop = ("samples_per_s", "ms_per_step", "time_s", "phase_ms_per_step", "train_seconds", "seconds")
    return {k: v for k, v in rec.items() if k not in drop and not k.endswith("_s")}


def test_a_resumed_run_replaces_the_records_of_replayed_steps(env, tmp_path, capsys):
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    common = ["train", str(env["ds"]), *SMALL, "--print-freq", "1", "--test-freq", "3", "--checkpoint-dir", str(ck),
              "--checkpoint-every", "4", "--metrics", str(m)]  # fmt: skip
    assert main([*common, "--num-batches", "6"]) == 0  # stopped at 6: steps 5 and 6 are replayed from 4
    assert main([*common, "--num-batches", "9", "--resume"]) == 0
    straight = tmp_path / "straight.jsonl"
    argv = [a if a != str(m) else str(straight) for a in common]
    assert main([*argv, "--num-batches", "9", "--checkpoint-dir", str(tmp_path / "ck2")]) == 0
    capsys.readouterr()
    got, want = _records(m), _records(straight)
    steps = [r["step"] for r in got if r["kind"] == "train"]
    assert steps == list(range(1, 10))  # each step once, in order
    assert [r["kind"] for r in got] == [r["kind"] for r in want]  # one summary: the resumed run's, last
    assert [_comparable(r) for r in got if r["kind"] != "summary"] == [
        _comparable(r) for r in want if r["kind"] != "summary"
    ]


def test_metrics_of_a_resumed_run_must_be_records_to_be_continued(env, tmp_path, capsys):
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    common = ["train", str(env["ds"]), *SMALL, "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]
    assert main([*common, "--num-batches", "2"]) == 0
    capsys.readouterr()
    m.write_bytes(USER)  # not Hotline's records: --resume does not make it continuable
    _refused(
        capsys, "train", [*common, "--num-batches", "4", "--resume", "--metrics", str(m)], "pass --force"
    )
    assert m.read_bytes() == USER


def test_a_line_file_never_holds_a_cut_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(USER)
    f = LineFile(path)
    assert path.read_bytes() == USER  # an existing file is replaced only by a first whole record
    f.write_line('{"step": 1}')
    assert path.read_text() == '{"step": 1}\n'
    f.close()
    # A crash that cut the last line: a resumed run keeps the whole records up to its step, drops the rest.
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "step": 2}\n{"kind": "summary", "st')
    g = LineFile(path, keep=records_up_to(1))
    g.close()
    assert _records(path) == [{"kind": "train", "step": 1}]
    h = LineFile(tmp_path / "new.jsonl")
    h.abort()  # a run that failed before its first record leaves nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]


def test_a_line_that_does_not_fit_is_cut_back_and_names_the_file(tmp_path):
    code = f"""
import signal, resource
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
from hotline.outputs import LineFile
f = LineFile({str(tmp_path / "m.jsonl")!r})
f.write_line("x" * 60)
try:
    f.write_line("y" * 60)
except OSError as e:
    print(e)
f.close()
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[Errno 27] File too large: cannot write ") and "m.jsonl" in r.stdout
    assert (tmp_path / "m.jsonl").read_text() == "x" * 60 + "\n"  # the failed line left no part behind


def test_two_real_runs_on_one_metrics_file_do_not_mix(env, tmp_path):
    m = tmp_path / "m.jsonl"
    first = subprocess.Popen(
        [sys.executable, "-m", "hotline", "train", str(env["ds"]), *SMALL, "--nepochs", "1000", "--print-freq",
         "1", "--metrics", str(m)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not m.exists() and first.poll() is None:  # the first run's first record is written
            time.sleep(0.2)
        assert first.poll() is None, first.stderr.read()
        r = subprocess.run(
            [sys.executable, "-m", "hotline", "train", str(env["ds"]), *SMALL, "--num-batches", "2", "--metrics",
             str(m)], capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert first.poll() is None  # still running: the refusal was not a race lost to its end
    finally:
        first.terminate()
        first.wait(timeout=120)
    assert r.returncode == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "another Hotline run that is still going" in lines[0], lines
    records = _records(m)
    assert [x["step"] for x in records if x["kind"] == "train"] == list(range(1, len(records) + 1))
