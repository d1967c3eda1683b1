"""Nothing a user owns is lost: every path that used to delete or replace a user's file is tried here, and the
file is checked byte for byte afterwards; plus the checks before step 1 (the top-level error handler is tried
in test_error_handler.py)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.format import Dataset, record_arrays
from hotline.datasets.synthetic import generate

SIZES = [40, 300, 25]
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
# --mode device: these tests read the run's error lines, which --mode auto's choice line would precede
SMALL = [*ARCH, "--mini-batch-size", "32", "--no-progress", "--eval-max-samples", "64", "--threads", "1"]
SMALL += ["--mode", "device"]
SYNTH = ["--rows", "300", "--table-sizes", "40,300,25", "--zipf", "1.2", "--no-progress"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    ds = generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)
    raw = root / "raw.tsv"
    generate(root / "with_raw", 200, seed=2, table_sizes=[20] * 26, raw_tsv=raw, progress=False)
    return {"root": root, "ds": ds, "raw": raw}


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself) by relative name, with its bytes."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _one_error(capsys, command: str) -> str:
    lines = capsys.readouterr().err.splitlines()
    err = [line for line in lines if line.strip() and not line.startswith("step ")]  # not the run's log lines
    assert len(err) == 1, err
    assert err[0].startswith(f"hotline {command}: error: "), err[0]
    return err[0]


# ------------------------------------------------------------------------------ dataset outputs (--out)


def _documents(d: Path) -> Path:
    (d / "sub").mkdir(parents=True)
    (d / "thesis.tex").write_bytes(b"\\documentclass{article} my life's work\n")
    (d / "sub" / "photo.jpg").write_bytes(bytes(range(256)) * 8)
    return d


def test_synthetic_out_on_a_folder_of_documents_is_refused(tmp_path, capsys):
    docs = _documents(tmp_path / "docs")
    before = _tree(docs)
    for extra in ([], ["--overwrite"]):
        assert main(["data", "synthetic", "--out", str(docs), *SYNTH, *extra]) == 2
        line = _one_error(capsys, "data synthetic")
        assert "is not a Hotline dataset directory" in line and str(docs) in line
        assert _tree(docs) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]  # no temporary directory left either


def test_out_on_a_regular_file_is_refused(data, tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_bytes(b"do not rename me\n")
    assert main(["data", "synthetic", "--out", str(f), *SYNTH, "--overwrite"]) == 2
    assert "is not a dataset directory" in _one_error(capsys, "data synthetic")
    assert main(["data", "criteo", str(data["raw"]), "--out", str(f), "--no-progress"]) == 2
    assert "is not a dataset directory" in _one_error(capsys, "data criteo")
    assert f.read_bytes() == b"do not rename me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_existing_dataset_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["data", "synthetic", "--out", str(out), *SYNTH]) == 0
    before = _tree(out)
    assert main(["data", "synthetic", "--out", str(out), *SYNTH, "--seed", "7"]) == 2
    assert "pass --force" in _one_error(capsys, "data synthetic")
    assert _tree(out) == before
    assert main(["data", "synthetic", "--out", str(out), *SYNTH, "--seed", "7", "--overwrite"]) == 0
    assert _tree(out) != before and Dataset(out).meta["source"]["seed"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # the old one is gone, nothing else left


def test_empty_out_directory_is_used(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["data", "synthetic", "--out", str(tmp_path / "empty"), *SYNTH]) == 0
    assert len(Dataset(tmp_path / "empty").train) > 0


def test_criteo_out_holding_the_raw_input_is_refused(data, tmp_path, capsys):
    folder = tmp_path / "criteo"
    folder.mkdir()
    raw = folder / "train.txt"
    raw.write_bytes(data["raw"].read_bytes())
    (folder / "README").write_text("downloaded 2024-01-01\n")
    before = _tree(folder)
    for out in (folder, tmp_path):  # the input's own folder, and one above it
        assert main(["data", "criteo", str(raw), "--out", str(out), "--no-progress", "--overwrite"]) == 2
        assert "would delete it" in _one_error(capsys, "data criteo")
        assert _tree(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["README", "train.txt"]


def test_criteo_out_holding_the_raw_input_refused_even_if_it_is_a_dataset(data, tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["data", "criteo", str(data["raw"]), "--out", str(out), "--no-progress"]) == 0
    raw = out / "day_0"  # a raw file kept inside a Hotline dataset directory
    raw.write_bytes(data["raw"].read_bytes())
    before = _tree(out)
    assert main(["data", "criteo", str(raw), "--out", str(out), "--no-progress", "--overwrite"]) == 2
    assert "would delete it" in _one_error(capsys, "data criteo")
    assert _tree(out) == before


def test_synthetic_raw_tsv_inside_out_is_refused(tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["data", "synthetic", "--out", str(out), *SYNTH]) == 0
    before = _tree(out)
    argv = ["data", "synthetic", "--out", str(out), *SYNTH, "--overwrite", "--raw-tsv", str(out / "raw.tsv")]
    assert main(argv) == 2
    assert "would delete it" in _one_error(capsys, "data synthetic")
    assert _tree(out) == before


# ------------------------------------------------------------------------------ checkpoint directories


def _train_argv(data, ck: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        str(data["ds"]),
        *SMALL,
        "--num-batches",
        str(steps),
        "--checkpoint-dir",
        str(ck),
        *extra,
    ]


def test_checkpoints_leave_other_programs_files_alone(data, tmp_path, capsys):
    ck = tmp_path / "shared"
    ck.mkdir()
    theirs = {"build.tmp": b"someone's temp", "step-000000004.pt.tmp": b"not ours", ".x.tmp-1": b"x"}
    for name, content in theirs.items():
        (ck / name).write_bytes(content)
    assert main(_train_argv(data, ck, 8, "--checkpoint-every", "2")) == 0
    for name, content in theirs.items():
        assert (ck / name).read_bytes() == content, name
    assert sorted(p.name for p in ck.glob("step-*.pt")) == ["step-000000006.pt", "step-000000008.pt"]


def test_new_run_into_a_directory_of_another_run_is_refused(data, tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(_train_argv(data, ck, 8, "--checkpoint-every", "4")) == 0
    before = _tree(ck)
    capsys.readouterr()
    assert main(_train_argv(data, ck, 8, "--checkpoint-every", "4", "--seed", "3")) == 2
    line = _one_error(capsys, "train")
    assert "holds checkpoints of another run (newest: step 8)" in line and "pass --resume" in line
    assert _tree(ck) == before


def test_resume_with_changed_flags_or_nothing_to_resume_is_refused(data, tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(_train_argv(data, ck, 8, "--checkpoint-every", "4")) == 0
    before = _tree(ck)
    capsys.readouterr()
    assert main(_train_argv(data, ck, 12, "--resume", "--mini-batch-size", "16")) == 2
    line = _one_error(capsys, "train")
    assert "belongs to another run (--mini-batch-size: checkpoint 32, this run 16)" in line
    assert main(_train_argv(data, ck, 12, "--resume", "--optimizer", "rowwise-adagrad")) == 2
    assert "--optimizer: checkpoint 'sgd', this run 'rowwise-adagrad'" in _one_error(capsys, "train")
    assert _tree(ck) == before
    empty = tmp_path / "empty"
    assert main(_train_argv(data, empty, 4, "--resume")) == 2
    assert "holds no complete checkpoint to resume" in _one_error(capsys, "train")
    assert main(_train_argv(data, empty, 4, "--resume-if-present", "--checkpoint-every", "4")) == 0
    assert main(_train_argv(data, empty, 8, "--resume-if-present", "--checkpoint-every", "4")) == 0
    assert "resumed from" in capsys.readouterr().err


def test_a_second_live_run_is_refused(data, tmp_path, capsys):
    from hotline.training.checkpoint_dir import CheckpointManager

    ck = tmp_path / "ck"
    live = CheckpointManager(ck)
    live._lock()  # what a running `hotline train --checkpoint-dir ck` holds
    try:
        assert main(_train_argv(data, ck, 4, "--checkpoint-every", "2")) == 2
        assert "is in use by another run that is still going" in _one_error(capsys, "train")
        assert list(ck.iterdir()) == []
    finally:
        live.close()
    assert main(_train_argv(data, ck, 4, "--checkpoint-every", "2")) == 0  # free again


def test_rotation_removes_only_this_runs_checkpoints(data, tmp_path, capsys):
    ck, other = tmp_path / "ck", tmp_path / "other"
    assert main(_train_argv(data, ck, 8, "--checkpoint-every", "4")) == 0
    assert main(_train_argv(data, other, 2, "--checkpoint-every", "2", "--mini-batch-size", "16")) == 0
    for name in ("step-000000002.pt", "step-000000002.pt.sha256"):  # another run's checkpoint, older
        (ck / name).write_bytes((other / name).read_bytes())
    foreign = _tree(ck / "step-000000002.pt")
    assert main(_train_argv(data, ck, 16, "--checkpoint-every", "4", "--resume")) == 0
    names = sorted(p.name for p in ck.glob("step-*.pt"))
    assert names == ["step-000000002.pt", "step-000000012.pt", "step-000000016.pt"]  # 4 and 8 were ours
    assert _tree(ck / "step-000000002.pt") == foreign


# ------------------------------------------------------------------------------ --dump-params


def _limited(limit_bytes: int):
    def setup() -> None:  # in the child before exec: writes past the limit fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return setup


def test_dump_params_on_a_full_disk_keeps_the_previous_file(data, tmp_path, capsys):
    dump = tmp_path / "params"  # no .npz suffix: written under exactly this name
    argv = ["train", str(data["ds"]), *SMALL, "--num-batches", "4", "--dump-params", str(dump)]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params"]
    before = dump.read_bytes()
    assert set(np.load(dump).files) >= {"embedding.table_0"}
    r = subprocess.run(
        [sys.executable, "-m", "hotline", *argv, "--seed", "5", "--force"],  # --force: allowed, then it fails
        preexec_fn=_limited(len(before) // 2),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    # (the run's own log lines, one per report without a terminal, are not errors)
    err = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("step ")]
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert err[0].startswith("hotline train: error: [Errno 27] File too large: cannot write ")
    assert dump.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params"]  # no temporary file left


# ------------------------------------------------------------------------------ before the first step


@pytest.mark.parametrize("flag", ["--metrics", "--dump-params", "--save", "--checkpoint-dir"])
def test_every_unwritable_output_fails_before_step_1(data, tmp_path, capsys, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    bad = str(blocker / "out")  # below a regular file: nothing can be written there
    metrics = tmp_path / "m.jsonl"
    argv = ["train", str(data["ds"]), *SMALL, "--num-batches", "4", flag, bad]
    if flag != "--metrics":
        argv += ["--metrics", str(metrics)]
    assert main(argv) == 2
    line = _one_error(capsys, "train")
    assert line.startswith(f"hotline train: error: {flag} {bad}: cannot write there"), line
    assert not metrics.exists()  # refused before training: not one record written
    assert blocker.read_text() == "x"


def test_output_that_is_a_directory_is_refused(data, tmp_path, capsys):
    assert main(["train", str(data["ds"]), *SMALL, "--num-batches", "4", "--dump-params", str(tmp_path)]) == 2
    assert "is a directory: give a file name" in _one_error(capsys, "train")


@pytest.mark.parametrize(
    "flags,text",
    [
        (["--eval-max-samples", "-1"], "--eval-max-samples must be >= 0"),
        (["--seed", "-1"], "--seed must be in [0, 2**32)"),
        (["--seed", str(2**40)], "--seed must be in [0, 2**32)"),
        (["--nproc", "0"], "--nproc must be >= 1, got 0"),
        (
            ["--mode", "device", "--placement", "p.npz"],
            "--placement has an effect with --mode hotline or auto only; --mode device would ignore",
        ),
        (["--mode", "device", "--hardware", "H100"], "--hardware has an effect with --mode auto only"),
        (
            ["--mode", "hybrid", "--hbm-budget", "1MiB"],
            "--hbm-budget has an effect with --mode hotline or auto only",
        ),
    ],
)
def test_nonsense_train_flags_name_the_flag(data, capsys, flags, text):
    assert main(["train", str(data["ds"]), *SMALL, "--num-batches", "2", *flags]) == 2
    assert text in _one_error(capsys, "train")


@pytest.mark.parametrize(
    "flags,text",
    [
        (["--max-ind-range", "0"], "--max-ind-range must be in [1, 2**63)"),
        (["--max-ind-range", str(2**64)], "--max-ind-range must be in [1, 2**63)"),
        (["--min-count", "0"], "--min-count must be >= 1"),
    ],
)
def test_nonsense_criteo_flags_name_the_flag(data, tmp_path, capsys, flags, text):
    out = tmp_path / "c"
    assert main(["data", "criteo", str(data["raw"]), "--out", str(out), "--no-progress", *flags]) == 2
    assert text in _one_error(capsys, "data criteo")
    assert not out.exists()


def test_synthetic_seed_out_of_range(tmp_path, capsys):
    assert main(["data", "synthetic", "--out", str(tmp_path / "s"), *SYNTH, "--seed", "-3"]) == 2
    assert "--seed must be in [0, 2**32)" in _one_error(capsys, "data synthetic")


@pytest.mark.parametrize("split,row", [("train", 37), ("val", 3)])
def test_nan_in_the_input_is_a_data_error_naming_file_and_row(data, tmp_path, capsys, split, row):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(data["ds"], ds)
    dense = np.load(ds / f"{split}_dense.npy", mmap_mode="r+")
    dense[row, 4] = np.nan
    dense.flush()
    del dense
    record_arrays(ds)  # an edit on purpose: meta.json's digests follow it
    assert main(["train", str(ds), *SMALL, "--num-batches", "4"]) == 2
    line = _one_error(capsys, "train")
    assert f"{ds / f'{split}_dense.npy'}, row {row}, column 4: the value is" in line and "nan" in line
    assert "learning-rate" not in line


def test_metrics_and_summary_are_strict_json_without_nan(tmp_path, capsys):
    ds = generate(tmp_path / "tiny", 6, seed=1, table_sizes=SIZES, progress=False)  # no val, no test rows
    assert len(Dataset(ds).val) == 0
    metrics = tmp_path / "m.jsonl"
    assert main(["train", str(ds), *SMALL, "--metrics", str(metrics)]) == 0

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))

    records = [strict(line) for line in metrics.read_text().splitlines()]
    assert records[-1]["kind"] == "summary" and records[-1]["val_auc"] is None
    summary = strict(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["val_auc"] is None and summary["steps"] == 1


# ------------------------------------------------------------------------------ distributed shutdown

_GLOO_THREADS_LEFT = """
import gc, os, sys, socket
import torch
import torch.distributed as dist
from hotline.distributed.launcher import _init_process_group

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
init = _init_process_group if sys.argv[1] == "hotline" else dist.init_process_group
init("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
p = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.Adagrad([p], lr=0.1)  # the first optimizer imports torch._dynamo, as a Trainer's does
p.grad = torch.ones(3)
opt.step()
t = torch.ones(4)
dist.all_reduce(t)
dist.destroy_process_group()
gc.collect()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(sum("gloo" in n for n in names))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_destroy_process_group_leaves_no_gloo_thread_into_interpreter_shutdown():
    """The cause of the SIGABRT at shutdown: a process group that outlives destroy_process_group() keeps its
    gloo threads into interpreter finalization (see hotline.distributed.launcher._init_process_group)."""

    def left(how: str) -> int:
        r = subprocess.run([sys.executable, "-c", _GLOO_THREADS_LEFT, how], capture_output=True, text=True,
                           timeout=180)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split()[-1])

    assert left("hotline") == 0
    assert left("plain") > 0  # torch's own init order pins the group: the regression this guards against


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_while_writing_a_dataset_removes_the_temporary_directory(tmp_path, sig, code):
    import time

    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "hotline", "data", "synthetic", "--out", str(out), "--rows", "3000000",
           "--table-sizes", "40,300,25", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not list(tmp_path.glob(".ds.hotline-tmp-*")):  # the event: the writer made its directory
            assert proc.poll() is None, f"the writer ended before it began: {proc.communicate()[1]}"
            time.sleep(0.01)
        os.killpg(proc.pid, sig)
        err = proc.communicate(timeout=600)[1]  # (a hang guard, not a time bound)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert (
        len([line for line in err.strip().splitlines() if not line.startswith("compiling kernels")]) == 1
    ), err
    assert list(tmp_path.iterdir()) == []  # no dataset, no temporary directory


def test_a_bad_id_in_any_split_is_named_before_step_1(data, tmp_path, capsys):
    """An id outside its table in the val split (read only at the end of training) stops the run before its
    first step, naming the file, the sample, the table and the id."""
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(data["ds"], ds)
    sparse = np.load(ds / "val_sparse.npy", mmap_mode="r+")
    sparse[7, 1, 0] = SIZES[1]
    sparse.flush()
    del sparse
    record_arrays(ds)
    metrics = tmp_path / "m.jsonl"
    assert main(["train", str(ds), *SMALL, "--metrics", str(metrics)]) == 2
    line = _one_error(capsys, "train")
    assert f"val_sparse.npy, sample 7, table 1: id {SIZES[1]} out of range [0, {SIZES[1]})" in line
    assert not metrics.exists() or not metrics.read_text()  # not one step was taken


def test_a_run_that_cannot_fit_in_memory_is_refused_with_the_figure(data):
    from hotline import TrainConfig
    from hotline.datasets.format import Dataset
    from hotline.training.preflight import check_memory, memory_needed

    ds = Dataset(data["ds"])
    cfg = TrainConfig(mode="hotline", embedding_dim=8, bottom_mlp=[13, 8], top_mlp=[8, 1], hbm_budget=1024,
                      mini_batch_size=32, lookahead=2, optimizer="rowwise-adagrad", progress=False)  # fmt: skip
    rows, row_bytes = sum(SIZES), 4 * (8 + 1)
    ring_lookups = 5 * 32 * len(SIZES)  # look-ahead 2: a ring of 5 slots of 32 samples x 3 tables
    assert memory_needed(cfg, ds) == rows * row_bytes + ring_lookups * (row_bytes + 64)
    check_memory(cfg, ds, available=10**9)
    with pytest.raises(MemoryError, match=r"needs about .* available"):
        check_memory(cfg, ds, available=1000)
    # a batch larger than the data is clipped (buffers sized from the data, not the flag), in every mode
    huge = TrainConfig(**{**cfg.__dict__, "mini_batch_size": 10**8})
    assert memory_needed(huge, ds) == memory_needed(
        TrainConfig(**{**cfg.__dict__, "mini_batch_size": len(ds.train)}), ds
    )


def test_a_batch_larger_than_the_data_trains_alike_in_every_mode(data):
    from hotline import TrainConfig, Trainer
    from hotline.datasets.format import Dataset

    ds = Dataset(data["ds"])
    out = {}
    for mode in ("device", "hybrid", "hotline"):
        cfg = TrainConfig(mode=mode, embedding_dim=8, bottom_mlp=[13, 8], top_mlp=[8, 1], mini_batch_size=10**7,
                          num_batches=2, progress=False, hbm_budget=4096 if mode == "hotline" else None,
                          learning_rate=0.05)  # fmt: skip
        tr = Trainer(cfg, ds)
        try:
            if mode != "device":
                assert tr.mode.dispatcher.max_batch_size == len(ds.train)
            list(tr.progress(tr.batches()))
            out[mode] = tr.named_arrays()
        finally:
            tr.close()
    for mode in ("hybrid", "hotline"):
        for name, a in out["device"].items():
            np.testing.assert_allclose(out[mode][name], a, rtol=1e-5, atol=1e-7, err_msg=f"{mode} {name}")
