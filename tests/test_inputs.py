"""Every input a user gives is checked before any work, and a run never crashes, hangs or leaks on one: values
and flags with bounds, dataset files validated at open and guarded while they are read, hardware descriptions
checked field by field, paths of the wrong kind named as what they are, ranks that die with their launcher,
gloo start-up that retries, and temporaries of killed processes removed (issue 23's input half)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.format import Dataset, DatasetError, record_arrays
from hotline.datasets.synthetic import generate

SIZES = [40, 300, 25]
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
SMALL = [*ARCH, "--mini-batch-size", "32", "--no-progress", "--eval-max-samples", "64", "--threads", "1"]
LINUX = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")


def datasets(root: Path) -> dict:
    """The module fixture's two small datasets under ``root`` (test_input_environment.py makes them too)."""
    ds = generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)
    other = generate(root / "other", 2000, seed=2, table_sizes=SIZES, zipf=1.2, progress=False)
    return {"root": root, "ds": ds, "other": other}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return datasets(tmp_path_factory.mktemp("inputs"))


def _one_error(capsys, command: str) -> str:
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("step ")
    ]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"hotline {command}: error: "), lines[0]
    return lines[0]


def _copy(data, tmp_path) -> Path:
    return Path(shutil.copytree(data["ds"], tmp_path / "ds"))


def _hotline(*argv: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotline", *argv], capture_output=True, text=True, env=env, **kw
    )


# ----------------------------------------------------------------------------------- counts and bounds


def test_threads_far_beyond_the_cores_is_one_line_not_a_segfault(data):
    """``--threads 100000`` used to segfault (exit 139) in torch's thread pool: now every command refuses a
    count above a small multiple of the cores, before any work (a subprocess: a crash must not take pytest)."""
    r = _hotline("train", str(data["ds"]), *SMALL[:-2], "--num-batches", "2", "--threads", "100000")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"hotline train: error: --threads must be at most {4 * os.cpu_count()} (4 x this machine's "
        f"{os.cpu_count()} cores), got 100000"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "{ds}", "--threads", "100000", "--no-progress"],
        ["plan", "{ds}", "--threads", "100000", "--no-progress"],
        ["evaluate", "{ds}", "--load", "c.pt", "--threads", "100000"],
        ["calibrate", "--out", "hw.json", "--threads", "100000"],
        ["train", "{ds}", "--num-batches", "1", "--worker-threads", "100000", "--mode", "hotline"],
        ["train", "{ds}", "--num-batches", "1", "--nproc", "100000"],
    ],
)
def test_every_count_flag_of_every_command_is_bounded(data, capsys, argv):
    argv = [a.format(ds=data["ds"]) for a in argv]
    assert main(argv) == 2
    flag = next(a for a in argv if a in ("--threads", "--worker-threads", "--nproc"))
    assert f"{flag} must be at most" in _one_error(capsys, argv[0])


def test_world_size_of_a_million_is_refused_before_profiling(data, capsys):
    """``plan --world-size 1000000`` printed nothing for minutes (torchrec's planner); now one line, at once."""
    assert main(["plan", str(data["ds"]), "--world-size", "1000000"]) == 2
    line = _one_error(capsys, "plan")
    assert "world_size (--world-size) must be at most 1024, got 1000000" in line
    assert "samples of split" not in capsys.readouterr().out  # nothing was profiled


def test_learning_rate_that_overflows_float32_is_one_line(data, capsys):
    """``--learning-rate 1e308`` ended in a torch traceback ("cannot be converted to type float")."""
    for lr in ("1e308", "nan", "0"):
        assert main(["train", str(data["ds"]), *SMALL, "--num-batches", "2", "--learning-rate", lr]) == 2
        assert (
            "learning rate (--learning-rate) must be positive and at most 3.403e+38 (float32's largest)"
            in _one_error(capsys, "train")
        )


# ----------------------------------------------------------------------------------- flags and modes

HOTLINE_ONLY = [
    ["--lookahead", "0"],
    ["--micro-batches", "split"],
    ["--count-decay", "0.5"],
    ["--worker-threads", "1"],
    ["--replace-every", "5"],
    ["--replace", "auto"],
    ["--replace-threshold", "0.1"],
    ["--save-placement", "p.npz"],
]


@pytest.mark.parametrize("mode", ["device", "hybrid"])
@pytest.mark.parametrize("flag", HOTLINE_ONLY, ids=lambda f: f[0])
def test_a_flag_without_effect_in_the_mode_is_refused_the_same_way(data, tmp_path, capsys, mode, flag):
    """``--lookahead``, ``--micro-batches``, ``--count-decay`` were silently ignored in device and hybrid mode
    (while ``--placement`` was refused), and ``--save-placement`` failed only after training: one table
    (``MODE_FLAGS``) now refuses each the same way, before step 1."""
    metrics = tmp_path / "m.jsonl"
    argv = ["train", str(data["ds"]), *SMALL, "--num-batches", "2", "--mode", mode, "--metrics", str(metrics)]
    assert main([*argv, *flag]) == 2
    line = _one_error(capsys, "train")
    modes = (
        "hotline" if flag[0] in ("--replace-every", "--replace") else "hotline or auto"
    )  # auto may not re-place
    assert f"{flag[0]} has an effect with --mode {modes} only; --mode {mode} would ignore it" in line
    assert not metrics.exists()  # refused before the first step
    assert not (tmp_path / "p.npz").exists()


def test_every_hotline_only_flag_is_in_the_table():
    from hotline.cli.train import MODE_FLAGS

    by_mode = {f for f, effect in MODE_FLAGS.items() if effect.on == "--mode"}
    assert {f[0] for f in HOTLINE_ONLY} | {"--placement", "--hbm-budget", "--hardware"} == by_mode


def test_hotline_flags_still_apply_in_hotline_mode(data, capsys):
    argv = [
        "train",
        str(data["ds"]),
        *SMALL,
        "--num-batches",
        "2",
        "--mode",
        "hotline",
        "--hbm-budget",
        "1KiB",
    ]
    assert main([*argv, "--lookahead", "0", "--micro-batches", "split", "--count-decay", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 2


def test_load_with_resume_is_refused(data, tmp_path, capsys):
    """``--load C.pt --resume`` let the resume win silently: two starting points are one line now."""
    ck = tmp_path / "c.pt"
    assert main(["train", str(data["ds"]), *SMALL, "--num-batches", "2", "--save", str(ck)]) == 0
    capsys.readouterr()
    for flag in ("--resume", "--resume-if-present"):
        argv = [
            "train",
            str(data["ds"]),
            *SMALL,
            "--load",
            str(ck),
            flag,
            "--checkpoint-dir",
            str(tmp_path / "k"),
        ]
        assert main(argv) == 2
        assert f"--load {ck} and {flag} are two starting points" in _one_error(capsys, "train")


def test_profile_json_without_a_budget_is_refused(data, tmp_path, capsys):
    """``profile --json X`` without ``--hbm-budget`` wrote nothing and exited 0."""
    out = tmp_path / "s.json"
    assert main(["profile", str(data["ds"]), "--json", str(out), "--no-progress"]) == 2
    assert "--out, --json, --always-hot and --predict need --hbm-budget" in _one_error(capsys, "profile")
    assert not out.exists()


def test_terabyte_layout_on_one_file_is_refused(data, tmp_path, capsys):
    """``data criteo --layout terabyte`` on one file wrote a dataset with 0 training rows and exited 0."""
    raw = tmp_path / "day_0"
    generate(tmp_path / "with_raw", 200, seed=2, table_sizes=[20] * 26, raw_tsv=raw, progress=False)
    out = tmp_path / "out"
    assert main(["data", "criteo", str(raw), "--out", str(out), "--layout", "terabyte", "--no-progress"]) == 2
    assert "there would be 0 training rows" in _one_error(capsys, "data criteo")
    assert not out.exists()


# ----------------------------------------------------------------------------------- values in the data


def _edit(d: Path, name: str, row: int, column: int | None, value: float) -> None:
    a = np.load(d / name, mmap_mode="r+")
    a[(row, column) if column is not None else row] = value
    a.flush()
    del a
    record_arrays(d)  # a deliberate edit: the digests follow it, so the value check is what speaks


@pytest.mark.parametrize(
    "name,row,value",
    [("train_labels.npy", 11, 2.0), ("train_labels.npy", 12, -1.0), ("val_labels.npy", 5, 3.0)],
)
def test_labels_outside_0_1_are_named_before_step_1(data, tmp_path, capsys, name, row, value):
    """Train labels 2.0 / -1.0 and val labels 3.0 were accepted (val AUC ``null``)."""
    d = _copy(data, tmp_path)
    _edit(d, name, row, None, value)
    metrics = tmp_path / "m.jsonl"
    assert main(["train", str(d), *SMALL, "--metrics", str(metrics)]) == 2
    line = _one_error(capsys, "train")
    assert f"{d / name}, row {row}: the value is {value}; labels must lie in [0, 1]" in line
    assert not metrics.exists() or not metrics.read_text().strip()  # before the first step


def test_dense_value_beyond_the_bound_is_named_not_blamed_on_the_learning_rate(data, tmp_path, capsys):
    """A finite 3e38 dense value overflowed the first layer and was reported as a NaN loss (lower the
    learning rate?); now its file, row and column and the stated bound."""
    d = _copy(data, tmp_path)
    _edit(d, "test_dense.npy", 3, 7, 3e38)
    assert main(["train", str(d), *SMALL, "--num-batches", "2"]) == 2
    line = _one_error(capsys, "train")
    assert f"{d / 'test_dense.npy'}, row 3, column 7: the value is 3" in line
    assert "dense features must lie within [-1e+06, 1e+06]" in line and "learning-rate" not in line


def test_soft_labels_and_values_at_the_bound_are_accepted():
    from hotline.training.preflight import DENSE_LIMIT, check_values

    class S:
        name = "train"

    dense = np.full((4, 13), DENSE_LIMIT, np.float32)
    dense[1] = -DENSE_LIMIT
    check_values("D", S, 0, dense, np.array([0.0, 1.0, 0.5, 0.25], np.float32))
    dense[2, 5] = 2 * DENSE_LIMIT
    with pytest.raises(DatasetError, match=r"D/train_dense\.npy, row 102, column 5: the value is 2000000\.0"):
        check_values("D", S, 100, dense, np.zeros(4, np.float32))


# ----------------------------------------------------------------------------------- dataset files


def test_a_file_swapped_for_another_datasets_is_refused(data, tmp_path, capsys):
    """``val_labels.npy`` symlinked to another dataset's (same shapes) was scored silently: meta.json records
    every array's size and sampled digest, checked at open."""
    d = _copy(data, tmp_path)
    (d / "val_labels.npy").unlink()
    (d / "val_labels.npy").symlink_to(data["other"] / "val_labels.npy")
    with pytest.raises(DatasetError, match=r"val_labels\.npy is not the file this dataset was written with"):
        Dataset(d)
    assert main(["train", str(d), *SMALL, "--num-batches", "2"]) == 2
    assert "swapped for, or linked to, another dataset's file" in _one_error(capsys, "train")


def test_the_run_fingerprint_covers_every_array(data, tmp_path):
    """A dataset written before digests were recorded has none to check; its run fingerprint (what a resume
    compares) still changes when any array file is swapped."""
    d = _copy(data, tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    del meta["arrays"]
    (d / "meta.json").write_text(json.dumps(meta))
    before = Dataset(d).content_fingerprint
    shutil.copy(data["other"] / "test_sparse.npy", d / "test_sparse.npy")
    swapped = Dataset(d)  # nothing recorded to compare with: opens
    assert swapped.fingerprint == Dataset(data["ds"]).fingerprint and swapped.content_fingerprint != before


_TRUNCATE_WHILE_READING = """
import os, sys
from hotline.datasets.format import Dataset, DatasetError
ds = Dataset(sys.argv[1])
ds.train.batch(0, 64)
os.truncate(os.path.join(sys.argv[1], "train_dense.npy"), 4096)
try:
    ds.train.batch(1500, 1600)
except DatasetError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


def test_a_file_truncated_under_a_running_reader_is_an_error_not_sigbus(data, tmp_path):
    """Truncating a dataset file while a run read it ended in a bus error (exit 135, no message)."""
    d = _copy(data, tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_WHILE_READING, str(d)], capture_output=True, text=True
    )
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert f"{d / 'train_dense.npy'} changed while this run was reading it (its size went from" in r.stderr


def test_a_file_rewritten_or_replaced_under_a_reader_is_an_error(data, tmp_path):
    d = _copy(data, tmp_path)
    ds = Dataset(d)
    with open(d / "val_labels.npy", "r+b") as f:  # same size, new bytes
        f.seek(-4, os.SEEK_END)
        f.write(np.float32(1).tobytes())
    os.utime(d / "val_labels.npy", ns=(1, 1))  # a new modification time, whatever the clock's resolution
    with pytest.raises(DatasetError, match="changed while this run was reading it .it was written to"):
        ds.val.labels[:10]
    d2 = _copy(data, tmp_path / "again")
    ds = Dataset(d2)
    shutil.copy(data["other"] / "val_dense.npy", d2 / "val_dense.new")
    os.replace(d2 / "val_dense.new", d2 / "val_dense.npy")  # replaced by a rename: the old file is still read
    with pytest.raises(DatasetError, match="it was replaced or removed"):
        ds.val.batch(0, 4)


def test_a_truncated_or_extended_file_is_refused_at_open(data, tmp_path, capsys):
    d = _copy(data, tmp_path)
    size = (d / "train_dense.npy").stat().st_size
    os.truncate(d / "train_dense.npy", size - 52)
    assert main(["train", str(d), *SMALL]) == 2
    assert f"train_dense.npy is truncated: it has {size - 52:,} bytes" in _one_error(capsys, "train")
    os.truncate(d / "train_dense.npy", size + 4)
    with pytest.raises(DatasetError, match="has extra bytes at its end"):
        Dataset(d)


def test_meta_json_array_and_an_npz_in_place_of_an_npy_are_one_line(data, tmp_path, capsys):
    """meta.json holding a JSON array, and an .npz where an .npy belongs, ended in tracebacks."""
    d = _copy(data, tmp_path)
    meta = d / "meta.json"
    text = meta.read_text()
    meta.write_text("[1, 2, 3]")
    assert main(["train", str(d), *SMALL]) == 2
    assert "meta.json holds a JSON list, not an object" in _one_error(capsys, "train")
    meta.write_text(text)
    labels = np.load(d / "train_labels.npy")
    with open(d / "train_labels.npy", "wb") as f:
        np.savez(f, labels=labels)
    assert main(["profile", str(d), "--no-progress"]) == 2
    line = _one_error(capsys, "profile")
    assert "train_labels.npy cannot be read as a .npy array: it is a zip archive (an .npz file?)" in line


def test_array_file_reads_as_numpy_does(data):
    """ArrayFile (pread, no memory map) returns what numpy's reader returns, for every way the code indexes."""
    ds = Dataset(data["ds"])
    ref = np.load(data["ds"] / "train_sparse.npy")
    a = ds.train.sparse
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(a), 300)
    for index in (slice(None), slice(5, 77), slice(-40, None), slice(3, 900, 7), 17, -1, rows, np.sort(rows),
                  np.arange(100, 180), (slice(0, 50), 1), (slice(None), 0, slice(None)), np.zeros(0, int)):  # fmt: skip
        np.testing.assert_array_equal(a[index], ref[index], err_msg=str(index))
    np.testing.assert_array_equal(np.asarray(a), ref)
    assert a.shape == ref.shape and a.dtype == ref.dtype and len(a) == len(ref)
    with pytest.raises(IndexError):
        a[len(a)]


# ----------------------------------------------------------------------------------- paths of the wrong kind


def _wrong_kinds(tmp_path) -> dict[str, tuple[Path, str]]:
    d = tmp_path / "a-directory"
    d.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "a-loop"
    loop.symlink_to(loop)
    return {
        "directory": (d, "is a directory, not a file"),
        "fifo": (fifo, "is a FIFO (named pipe), not a file"),
        "devnull": (Path(os.devnull), "is /dev/null (a character device that reads as empty), not a file"),
        "loop": (loop, "is a symlink loop (a link that leads back to itself), not a file"),
    }


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("kind", ["directory", "fifo", "devnull", "loop"])
@pytest.mark.parametrize(
    "argv,command,what",
    [
        (["train", "{ds}", *SMALL, "--load", "{path}"], "train", "checkpoint"),
        (["train", "{ds}", *SMALL, "--init-params", "{path}"], "train", "--init-params"),
        (["train", "{ds}", *SMALL, "--mode", "hotline", "--placement", "{path}"], "train", "placement file"),
        (["evaluate", "{ds}", "--load", "{path}"], "evaluate", "checkpoint"),
        (
            ["profile", "{ds}", "--hbm-budget", "1KiB", "--predict", "--hardware", "{path}"],
            "profile",
            "hardware file",
        ),
        (["data", "criteo", "{path}", "--out", "{tmp}/out"], "data criteo", "raw Criteo file"),
        (["report", "{path}", "--out", "{tmp}/r.png"], "report", "metrics file"),
    ],
    ids=["load", "init-params", "placement", "evaluate", "hardware", "criteo", "report"],
)
def test_a_path_of_the_wrong_kind_is_named_as_what_it_is(data, tmp_path, capsys, kind, argv, command, what):
    """A directory, a FIFO, /dev/null or a symlink loop given as a file was reported as "does not exist" (or
    hung reading a FIFO, or ended in a traceback)."""
    path, text = _wrong_kinds(tmp_path)[kind]
    argv = [a.format(ds=data["ds"], path=path, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    line = _one_error(capsys, command)
    assert f"{what} {path} {text}" in line, line


def test_a_dataset_path_that_is_a_file_is_named(data, tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    assert main(["train", str(f), *SMALL]) == 2
    assert f"dataset directory {f} is not a directory (a regular file)" in _one_error(capsys, "train")


@pytest.mark.parametrize("share", [0.001, 0.05, 0.5, 1.0])
def test_array_file_gathers_samples_of_any_density(data, monkeypatch, share):
    """Rows by index (the profiler's sample), dense stretches read whole and sparse ones run by run."""
    import hotline.datasets.files as files

    monkeypatch.setattr(files, "GATHER_BLOCK_BYTES", 1000)  # many stretches even on a small file
    a, ref = Dataset(data["ds"]).train.sparse, np.load(data["ds"] / "train_sparse.npy")
    rng = np.random.default_rng(1)
    rows = rng.choice(len(ref), max(1, int(len(ref) * share)), replace=False)
    for index in (rows, np.sort(rows), np.concatenate([rows, rows[:5]])):
        np.testing.assert_array_equal(a[index], ref[index])
