"""Bad input, tried and listed: what a user gets for each (the table is in the README, "Bad input").

Each case either runs here or is named in ``REFERENCED`` (covered by a test elsewhere, checked to exist).
CLI cases go through ``hotline.cli.main`` in-process: an uncaught exception would fail the test, so "one
error line, exit 2" is checked for real. Disk-full cases run ``python -m hotline`` in a subprocess with
``RLIMIT_FSIZE`` lowered and SIGXFSZ ignored, so writes past the limit fail with OSError EFBIG.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hotline.cli import main
from hotline.datasets.format import Dataset, DatasetError, record_arrays
from hotline.datasets.synthetic import generate
from hotline.placement import Placement, PlacementError
from hotline.training.checkpoint import read_checkpoint
from hotline.training.checkpoint_dir import CheckpointManager

TESTS = Path(__file__).resolve().parent
ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]
# --mode device: these tests read the run's error lines, which --mode auto's choice line would precede
SMALL = [*ARCH, "--mini-batch-size", "32", "--no-progress", "--eval-max-samples", "64", "--threads", "1"]
SMALL += ["--mode", "device"]
SIZES = [40, 300, 25]

# Bad inputs covered by tests in other files (the README table names them; this file checks they exist).
REFERENCED = [
    "test_safety.py::test_a_bad_id_in_any_split_is_named_before_step_1",
    "test_safety.py::test_a_run_that_cannot_fit_in_memory_is_refused_with_the_figure",
    "test_safety.py::test_a_batch_larger_than_the_data_trains_alike_in_every_mode",
    "test_criteo.py::test_bad_line_error_names_file_line_field",  # too few/many fields, non-hex, overflow, NUL
    "test_criteo.py::test_bad_lines_skipped_and_counted",  # --on-bad-line skip
    "test_criteo.py::test_gzip_crlf_and_no_final_newline",  # CRLF endings are accepted
    "test_criteo.py::test_truncated_gzip_names_file",
    "test_criteo.py::test_empty_input_is_an_error",
    "test_criteo.py::test_line_too_long_error",
    "test_criteo.py::test_random_bytes_raise_only_criteo_format_error",  # hypothesis: random bytes
    "test_criteo.py::test_failed_rewrite_keeps_existing_dataset",
    "test_criteo.py::test_cli",
    "test_dispatcher.py::test_out_of_range_names_table_and_id",
    "test_executor.py::test_out_of_range_id_in_worker_names_table",
    "test_profiler.py::test_bad_ids_and_empty_splits_are_reported_with_the_dataset",
    "test_placement.py::test_corrupt_truncated_and_foreign_files_are_refused",
    "test_placement.py::test_budgets_of_zero_one_row_and_more_than_all_rows",
    "test_checkpoint.py::test_nan_loss_stops_and_keeps_last_checkpoint",
    "test_checkpoint.py::test_partial_write_is_ignored_and_corruption_refused",
    "test_checkpoint.py::test_crafted_pickle_is_refused",
    "test_checkpoint.py::test_mismatched_checkpoint_refused",
    "test_checkpoint.py::test_sigkill_then_resume_equals_straight_run",
    "test_safety.py::test_a_second_live_run_is_refused",
    "test_safety.py::test_checkpoints_leave_other_programs_files_alone",
    "test_safety.py::test_criteo_out_holding_the_raw_input_is_refused",
    "test_safety.py::test_criteo_out_holding_the_raw_input_refused_even_if_it_is_a_dataset",
    "test_error_handler.py::test_ctrl_c_is_one_line_and_exit_130",
    "test_error_handler.py::test_debug_shows_the_traceback_behind_the_line",
    "test_safety.py::test_destroy_process_group_leaves_no_gloo_thread_into_interpreter_shutdown",
    "test_safety.py::test_dump_params_on_a_full_disk_keeps_the_previous_file",
    "test_safety.py::test_empty_out_directory_is_used",
    "test_safety.py::test_every_unwritable_output_fails_before_step_1",
    "test_safety.py::test_existing_dataset_needs_overwrite",
    "test_error_handler.py::test_memory_error_is_one_line",
    "test_safety.py::test_metrics_and_summary_are_strict_json_without_nan",
    "test_error_handler.py::test_missing_optional_package_names_the_install_command",
    "test_safety.py::test_nan_in_the_input_is_a_data_error_naming_file_and_row",
    "test_safety.py::test_new_run_into_a_directory_of_another_run_is_refused",
    "test_safety.py::test_nonsense_criteo_flags_name_the_flag",
    "test_safety.py::test_nonsense_train_flags_name_the_flag",
    "test_safety.py::test_out_on_a_regular_file_is_refused",
    "test_safety.py::test_output_that_is_a_directory_is_refused",
    "test_safety.py::test_resume_with_changed_flags_or_nothing_to_resume_is_refused",
    "test_safety.py::test_rotation_removes_only_this_runs_checkpoints",
    "test_safety.py::test_signal_while_writing_a_dataset_removes_the_temporary_directory",
    "test_safety.py::test_synthetic_out_on_a_folder_of_documents_is_refused",
    "test_safety.py::test_synthetic_raw_tsv_inside_out_is_refused",
    "test_safety.py::test_synthetic_seed_out_of_range",
]


def test_referenced_tests_exist():
    for ref in REFERENCED:
        file, name = ref.split("::")
        tree = ast.parse((TESTS / file).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"{ref} is named in the bad-input table but does not exist"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    ds = generate(root / "ds", 2000, seed=1, table_sizes=SIZES, zipf=1.2, progress=False)
    other = generate(root / "other", 2000, seed=2, table_sizes=SIZES, zipf=1.2, progress=False)
    empty = generate(root / "empty", 0, seed=1, table_sizes=SIZES, progress=False)
    other_ds = Dataset(other)
    Placement.from_hot_ids(
        SIZES, [np.arange(n // 4) for n in SIZES], dataset_fingerprint=other_ds.fingerprint, embedding_dim=8
    ).save(root / "other_placement.npz")
    return {"root": root, "ds": ds, "other": other, "empty": empty}


def _error_line(capsys, command: str) -> str:
    """The one line a CLI user error prints (and nothing else on stderr: no traceback)."""
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"hotline {command}: error: "), err[0]
    return err[0]


def _damaged_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


class _Exploit:
    """A pickle payload that would leave a marker file if it ever ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ---------------------------------------------------------------------------------- dataset directories


def _remove(d: Path) -> None:
    (d / "val_labels.npy").unlink()


def _wrong_shape(d: Path) -> None:
    np.save(d / "train_dense.npy", np.zeros((5, 13), np.float32))


def _wrong_dtype(d: Path) -> None:
    np.save(d / "train_sparse.npy", np.load(d / "train_sparse.npy").astype(np.int64))


def _truncated(d: Path) -> None:
    f = d / "train_sparse.npy"
    f.write_bytes(f.read_bytes()[:100])


def _not_npy(d: Path) -> None:
    (d / "test_dense.npy").write_bytes(b"garbage\n")


def _no_meta(d: Path) -> None:
    (d / "meta.json").unlink()


def _meta_not_json(d: Path) -> None:
    (d / "meta.json").write_text("{bad")


def _meta_missing_field(d: Path) -> None:
    meta = json.loads((d / "meta.json").read_text())
    del meta["table_sizes"]
    (d / "meta.json").write_text(json.dumps(meta))


def _meta_malformed_field(d: Path) -> None:
    meta = json.loads((d / "meta.json").read_text())
    meta["splits"] = ["train"]
    (d / "meta.json").write_text(json.dumps(meta))


def _meta_wrong_format(d: Path) -> None:
    meta = json.loads((d / "meta.json").read_text())
    meta["format"] = "something-else/9"
    (d / "meta.json").write_text(json.dumps(meta))


DAMAGE = [
    (_remove, r"val_labels\.npy is missing \(meta\.json says split 'val' has \d+ rows\)"),
    (_wrong_shape, r"train_dense\.npy has shape \(5, 13\) and dtype float32; meta\.json expects \(\d+, 13\)"),
    (_wrong_dtype, r"train_sparse\.npy has shape .* and dtype int64; meta\.json expects .* int32"),
    (_truncated, r"train_sparse\.npy cannot be read as a \.npy array"),
    (_not_npy, r"test_dense\.npy cannot be read as a \.npy array"),
    (_no_meta, r"meta\.json is missing: .* is not a Hotline dataset directory"),
    (_meta_not_json, r"meta\.json is not valid JSON"),
    (_meta_missing_field, r"meta\.json lacks the field 'table_sizes'"),
    (_meta_malformed_field, r"meta\.json has a malformed field"),
    (_meta_wrong_format, r"format is 'something-else/9', expected 'hotline-dataset/1'"),
]


@pytest.mark.parametrize("damage,message", DAMAGE, ids=[d.__name__.strip("_") for d, _ in DAMAGE])
def test_damaged_dataset_directory_is_refused(data, tmp_path, damage, message):
    d = _damaged_copy(data["ds"], tmp_path / "d")
    damage(d)
    with pytest.raises(DatasetError, match=message):
        Dataset(d)


def test_missing_dataset_directory(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        Dataset(tmp_path / "nothing")


def test_damaged_dataset_through_each_cli(data, tmp_path, capsys):
    d = _damaged_copy(data["ds"], tmp_path / "d")
    _wrong_dtype(d)
    for argv, command in [
        (["train", str(d), *SMALL], "train"),
        (["profile", str(d), "--no-progress"], "profile"),
    ]:
        assert main(argv) == 2
        assert "train_sparse.npy has shape" in _error_line(capsys, command)


def test_pickled_object_in_a_dataset_array_never_runs(data, tmp_path):
    d = _damaged_copy(data["ds"], tmp_path / "d")
    marker = tmp_path / "pwned-by-dataset"
    np.save(d / "train_labels.npy", np.array([_Exploit(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(DatasetError, match=r"train_labels\.npy cannot be read as a \.npy array"):
        Dataset(d)
    assert not marker.exists()


# ---------------------------------------------------------------------------------- empty data


def test_empty_training_split(data, capsys):
    assert main(["train", str(data["empty"]), *SMALL]) == 2
    assert "the training split of" in _error_line(capsys, "train")
    assert main(["profile", str(data["empty"]), "--hbm-budget", "1KiB", "--no-progress"]) == 2
    assert "has no samples to profile" in _error_line(capsys, "profile")


# ---------------------------------------------------------------------------------- ids and placements


@pytest.mark.parametrize("mode", ["device", "hybrid", "hotline"])
def test_out_of_range_id_names_table_and_id(data, tmp_path, capsys, mode):
    d = _damaged_copy(data["ds"], tmp_path / "d")
    sparse = np.load(d / "train_sparse.npy", mmap_mode="r+")
    sparse[100, 1, 0] = 300  # table 1 has 300 rows
    sparse.flush()
    del sparse
    record_arrays(d)  # an edit on purpose: meta.json's digests follow it
    budget = ["--hbm-budget", "1KiB"] if mode == "hotline" else []  # the other modes refuse the flag
    argv = ["train", str(d), *SMALL, "--mode", mode, *budget, "--num-batches", "10"]
    assert main(argv) == 2
    assert r"table 1: id 300 out of range [0, 300)" in _error_line(capsys, "train")


def test_placement_made_for_another_dataset(data, capsys):
    placement = str(data["root"] / "other_placement.npz")
    argv = ["train", str(data["ds"]), *SMALL, "--mode", "hotline", "--placement", placement]
    assert main(argv) == 2
    line = _error_line(capsys, "train")
    assert (
        "other_placement.npz) was made for dataset fingerprint" in line
        and "profile this dataset again" in line
    )


def test_pickled_object_in_a_placement_never_runs(data, tmp_path, capsys):
    good = Placement.load(data["root"] / "other_placement.npz")
    arrays = {
        "format": np.array("hotline-placement/1"),
        "table_sizes": np.array(good.table_sizes, np.int64),
        "embedding_dim": np.array(8),
        "bytes_per_row": np.array(32),
        "hbm_budget_bytes": np.array(0),
        "dataset_fingerprint": np.array(Dataset(data["ds"]).fingerprint),
    }
    marker = tmp_path / "pwned-by-placement"
    for t in range(3):
        arrays[f"hot_ids_{t}"] = np.array([_Exploit(marker)], dtype=object)
        arrays[f"remap_{t}"] = good.remap[t]
    evil = tmp_path / "evil.npz"
    np.savez(evil, **arrays)  # savez pickles object arrays
    with pytest.raises(
        PlacementError, match=r"evil\.npz is corrupt or not a Hotline placement.*[Oo]bject arrays"
    ):
        Placement.load(evil)
    assert main(["train", str(data["ds"]), *SMALL, "--mode", "hotline", "--placement", str(evil)]) == 2
    assert "evil.npz is corrupt" in _error_line(capsys, "train")
    assert not marker.exists()


# ---------------------------------------------------------------------------------- HBM budgets


def _profile_json(data, tmp_path, budget: str) -> tuple[dict, Placement]:
    out, js = tmp_path / f"p{budget}.npz", tmp_path / f"p{budget}.json"
    argv = ["profile", str(data["ds"]), "--hbm-budget", budget, "--embedding-dim", "8", "--no-progress"]
    assert main([*argv, "--sample-fraction", "1", "--out", str(out), "--json", str(js)]) == 0
    return json.loads(js.read_text()), Placement.load(out, dataset=Dataset(data["ds"]))


def _dump(data, tmp_path, name: str, *flags: str) -> dict[str, np.ndarray]:
    path = tmp_path / f"{name}.npz"
    assert (
        main(["train", str(data["ds"]), *SMALL, "--num-batches", "20", *flags, "--dump-params", str(path)])
        == 0
    )
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_budget_zero_places_nothing_and_hotline_still_trains_exactly(data, tmp_path, capsys):
    summary, placement = _profile_json(data, tmp_path, "0")
    assert placement.num_hot == 0 and summary["hot_rows"] == 0 and summary["access_coverage"] == 0.0
    hybrid = _dump(data, tmp_path, "hybrid", "--mode", "hybrid")
    device = _dump(data, tmp_path, "device", "--mode", "device")
    for i, flags in enumerate((["--hbm-budget", "0"], ["--placement", str(tmp_path / "p0.npz")])):
        hot = _dump(data, tmp_path, f"hot0-{i}", "--mode", "hotline", *flags)  # an output name per run
        for k, v in hybrid.items():
            np.testing.assert_array_equal(hot[k], v, err_msg=k)  # all rows cold: the hybrid step exactly
            np.testing.assert_allclose(hot[k], device[k], rtol=1e-5, atol=1e-6, err_msg=k)
    capsys.readouterr()


def test_budget_larger_than_all_tables_makes_every_seen_row_hot(data, tmp_path):
    summary, placement = _profile_json(data, tmp_path, "1TiB")
    accessed = summary["sample"]["accessed_rows"]
    # Rows the sample never touched stay cold, however large the budget: hot bytes = accessed rows only.
    assert placement.num_hot == accessed < sum(SIZES)
    assert placement.hot_bytes == accessed * 32 and placement.hbm_budget_bytes == 2**40
    assert summary["access_coverage"] == 1.0
    device = _dump(data, tmp_path, "device", "--mode", "device")
    hot = _dump(data, tmp_path, "hot", "--mode", "hotline", "--placement", str(tmp_path / "p1TiB.npz"))
    for k, v in device.items():
        np.testing.assert_allclose(hot[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


# ---------------------------------------------------------------------------------- disk full


def _limited(limit_bytes: int):
    def setup() -> None:  # runs in the child before exec: writes past the limit fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return setup


def _run_limited(argv: list[str], limit_bytes: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotline", *argv],
        preexec_fn=_limited(limit_bytes),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_disk_full_while_writing_a_dataset(data, tmp_path):
    out = tmp_path / "new"
    # The module fixture generated the same table layout: the Numba kernels are cached, nothing to compile.
    argv = [
        "data",
        "synthetic",
        "--out",
        str(out),
        "--rows",
        "2000",
        "--table-sizes",
        "40,300,25",
        "--zipf",
        "1.2",
    ]
    r = _run_limited([*argv, "--no-progress"], 16 << 10)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hotline data synthetic: error: [Errno 27] File too large"), (
        err
    )
    assert "cannot write train_dense.npy" in err[0] and str(out) in err[0]
    assert list(tmp_path.iterdir()) == []  # no dataset and no DIR.tmp-PID left


def test_disk_full_while_writing_a_checkpoint(data, tmp_path, capsys):
    ck = tmp_path / "ck"
    common = ["train", str(data["ds"]), *SMALL, "--checkpoint-dir", str(ck), "--checkpoint-every", "4"]
    assert main([*common, "--num-batches", "8"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    assert sorted(before) == [
        "step-000000004.pt",
        "step-000000004.pt.sha256",
        "step-000000008.pt",
        "step-000000008.pt.sha256",
    ]
    size = len(before["step-000000008.pt"])
    r = _run_limited([*common, "--num-batches", "16", "--resume"], size // 2)
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("hotline train")]
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert err[0].startswith("hotline train: error: [Errno 27] File too large: cannot write ")
    assert "step-000000012.pt (no partial file was left)" in err[0]
    after = {p.name: p.read_bytes() for p in ck.iterdir()}
    assert after == before  # no partial checkpoint, no temporary file, the previous ones intact
    assert read_checkpoint(CheckpointManager(ck).latest())["step"] == 8


# ---------------------------------------------------------------------------------- CLI user errors


def _cli_cases(data, tmp_path) -> list[tuple[list[str], str, str]]:
    ds, other = str(data["ds"]), str(data["root"] / "other_placement.npz")
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    unwritable = str(not_a_dir / "out")  # a path below a regular file: any write fails with an OSError
    bad_raw = tmp_path / "bad.txt"
    bad_raw.write_bytes(b"1\t2\n")
    return [
        (
            ["train", ds, *SMALL, "--mini-batch-size", "0"],
            "train",
            "mini_batch_size (--mini-batch-size) must be positive",
        ),
        (["train", ds, *SMALL, "--arch-mlp-bot", "abc"], "train", "--arch-mlp-bot 'abc'"),
        (["train", ds, *SMALL, "--arch-mlp-bot", "12-16-8"], "train", "dataset has 13 dense features"),
        (["train", ds, *SMALL, "--mode", "hotline", "--hbm-budget", "lots"], "train", "cannot read 'lots'"),
        (["train", ds, *SMALL, "--mode", "hotline"], "train", "needs --placement FILE"),
        (["train", ds, *SMALL, "--mode", "hotline", "--placement", "nope.npz"], "train", "does not exist"),
        (["train", ds, *SMALL, "--load", "nope.pt"], "train", "checkpoint nope.pt does not exist"),
        (["train", ds, *SMALL, "--checkpoint-every", "2"], "train", "need --checkpoint-dir"),
        (["train", ds, *SMALL, "--threads", "-1"], "train", "--threads must be >= 0"),
        (["train", ds, *SMALL, "--device", "nodevice"], "train", "--device 'nodevice' is not a device"),
        (["train", ds, *SMALL, "--num-batches", "2", "--metrics", unwritable + ".jsonl"], "train", "a-file"),
        (["profile", str(tmp_path / "none"), "--no-progress"], "profile", "does not exist"),
        (["profile", ds, "--sample-fraction", "2", "--no-progress"], "profile", "sample_fraction"),
        (["profile", ds, "--out", "p.npz", "--no-progress"], "profile", "need --hbm-budget"),
        (["profile", ds, "--hbm-budget", "1KiB", "--out", unwritable, "--no-progress"], "profile", "a-file"),
        (["data", "synthetic", "--out", "x", "--rows", "-1"], "data synthetic", "rows must be"),
        (
            ["data", "synthetic", "--out", unwritable, "--rows", "10", "--no-progress"],
            "data synthetic",
            "a-file",
        ),
        (["data", "criteo", "nope.txt", "--out", "x"], "data criteo", "nope.txt does not exist"),
        (
            ["data", "criteo", str(bad_raw), "--out", str(tmp_path / "c"), "--no-progress"],
            "data criteo",
            "line 1",
        ),
        (["plan", ds, "--placement", other, "--no-progress"], "plan", "was made for dataset fingerprint"),
        (["plan", ds, "--world-size", "0", "--no-progress"], "plan", "world_size must be at least 1"),
    ]


def test_cli_user_errors_are_one_line_exit_2(data, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, command, text in _cli_cases(data, tmp_path):
        assert main(argv) == 2, argv
        line = _error_line(capsys, command)
        assert text in line, (argv, line)
    assert not (tmp_path / "x").exists() and not (tmp_path / "c").exists()
