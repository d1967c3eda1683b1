"""What survives a power loss: the order of the system calls that make a write durable.

Every atomic output (``hotline._io.atomic_write``: datasets' metadata, placements, checkpoints and their
digests, plans, dumps) fsyncs its temporary file, renames it over the target, then fsyncs the directory; the
streamed metrics file (``outputs.LineFile``) fsyncs before it takes its place; the disk store's file is fsynced
after its DRAM tier is written to it (``RowFile.flush`` and ``close``). A crash of the process alone loses
nothing either way (the page cache survives it): only the order of ``fsync`` and ``rename`` protects against a
power loss. So these tests record the real calls (``os.fsync``, ``os.replace``, ``os.rename``, the file's
writes), each passed on to the real one, and check their order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hotline import _io
from hotline.cli import main
from hotline.datasets.synthetic import generate
from hotline.tiers.disk_file import RowFile
from hotline.training.checkpoint_dir import CheckpointManager

CLI_ARCH = ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8", "--arch-mlp-top", "16-1"]


def _path_of(fd: int) -> Path:
    """Where the open file ``fd`` stands now (a renamed file: its new name)."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


class Calls:
    """The durability-relevant system calls of this process, in order, each made for real: ``("fsync", path)``,
    ``("replace", src, dst)`` (``os.replace``, ``os.rename``, :func:`hotline._io.replace_whole`'s swap), ``("write", path)`` (``os.pwrite`` /
    ``os.pwritev``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.log: list[tuple] = []
        real = {name: getattr(os, name) for name in ("fsync", "replace", "rename", "pwrite", "pwritev")}

        def fsync(fd):
            path = _path_of(fd)  # before the call: where the bytes are that it makes durable
            real["fsync"](fd)
            self.log.append(("fsync", path))

        def renamer(name):
            def rename(src, dst, *args, **kwargs):
                real[name](src, dst, *args, **kwargs)
                self.log.append(("replace", Path(os.path.realpath(src)), Path(os.path.realpath(dst))))

            return rename

        def writer(name):
            def write(fd, *args):
                n = real[name](fd, *args)
                self.log.append(("write", _path_of(fd)))
                return n

            return write

        real_exchange = _io._exchange

        def exchange(
            a, b
        ):  # replace_whole's swap over an existing output: a rename as far as durability goes
            swapped = real_exchange(a, b)
            if swapped:
                self.log.append(("replace", Path(os.path.realpath(a)), Path(os.path.realpath(b))))
            return swapped

        monkeypatch.setattr(_io, "_exchange", exchange)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", renamer("replace"))
        monkeypatch.setattr(os, "rename", renamer("rename"))
        monkeypatch.setattr(os, "pwrite", writer("pwrite"))
        monkeypatch.setattr(os, "pwritev", writer("pwritev"))

    def replaces(self) -> list[tuple[int, Path, Path]]:
        return [(i, e[1], e[2]) for i, e in enumerate(self.log) if e[0] == "replace"]


@pytest.fixture
def calls(monkeypatch):
    return Calls(monkeypatch)


def assert_atomic(log: list[tuple], i: int) -> None:
    """The rename ``log[i]`` of a temporary file over its target: the temporary file fsynced before it (after
    any rename before it, so these are its final bytes), the directory fsynced after it."""
    _, src, dst = log[i]
    before = [e for e in log[:i] if e[0] in ("fsync", "replace")]
    last_rename = max((k for k, e in enumerate(before) if e[0] == "replace"), default=-1)
    assert ("fsync", src) in before[last_rename + 1 :], (
        f"{dst.name}: its temporary file {src.name} is not fsynced before the rename ({log[: i + 1]})"
    )
    assert ("fsync", dst.parent) in log[i + 1 :], f"{dst.name}: its directory is not fsynced after the rename"


def test_atomic_write_fsyncs_the_file_then_renames_it_then_fsyncs_the_directory(tmp_path, calls):
    target = tmp_path / "out.json"
    target.write_text("the previous version\n")
    calls.log.clear()
    _io.write_json(target, {"a": 1})
    assert [e[0] for e in calls.log] == ["fsync", "replace", "fsync"], calls.log
    (_, synced), (_, src, dst), (_, directory) = calls.log
    here = tmp_path.resolve()
    assert synced == src and src.parent == here and _io.TMP_MARKER in src.name
    assert dst == target.resolve() and directory == here
    assert json.loads(target.read_text()) == {"a": 1}


def test_the_disk_files_flush_and_close_fsync_after_writing_the_dram_tier(tmp_path, calls):
    n, dim, rng = 300, 8, np.random.default_rng(2)
    f = RowFile(tmp_path / "rows.bin", n, dim, 1, rng.permutation(n), io_depth=2, cache_bytes=50 * 36)
    try:
        f.put_rows(np.arange(n), rng.standard_normal((n, dim + 1)).astype(np.float32))
        rows = rng.choice(n, 100, replace=False)
        f.write_rows(rows, rng.standard_normal((100, dim + 1)).astype(np.float32))
        for finish in (f.flush, f.close):
            calls.log.clear()
            finish()
            path = f.path.resolve()
            mine = [e for e in calls.log if e[1] == path]
            assert mine[0] == ("write", path) and mine[-1] == ("fsync", path), (finish.__name__, mine)
    finally:
        f.close()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return str(generate(tmp_path_factory.mktemp("dur") / "ds", 2000, seed=5, table_sizes=[30, 200, 12, 500],
                        zipf=1.2, progress=False))  # fmt: skip


def test_every_output_of_a_run_is_durable_before_it_replaces_anything(dataset, tmp_path, calls):
    """A run with every output (checkpoints and their digests, the disk store, the metrics stream, the
    placement, parameter dump and final model): each file that takes a name was fsynced first, and its
    directory after; a checkpoint's digest (what makes it count) is renamed only once the checkpoint is
    durable; the cold file is fsynced after its last write."""
    cold = tmp_path / "cold"
    cold.mkdir()
    ck = tmp_path / "ck"
    outputs = {
        "--metrics": tmp_path / "m.jsonl",
        "--save-placement": tmp_path / "p.npz",
        "--dump-params": tmp_path / "params.npz",
        "--save": tmp_path / "model.pt",
    }
    (tmp_path / "m.jsonl").write_text('{"an": "old metrics file"}\n')
    argv = ["train", dataset, *CLI_ARCH, "--mode", "hotline", "--hbm-budget", "2KiB", "--mini-batch-size", "32",
            "--num-batches", "6", "--no-progress", "--lookahead", "1", "--cold-store", "disk", "--cold-dir",
            str(cold), "--cold-cache", "4KiB", "--checkpoint-dir", str(ck), "--checkpoint-every", "2", "--force",
            *(x for flag, path in outputs.items() for x in (flag, str(path)))]  # fmt: skip
    assert main(argv) == 0
    log = calls.log
    here = tmp_path.resolve()  # not numba's cache
    ours = [(i, dst) for i, _, dst in calls.replaces() if here in dst.parents]
    renamed = {dst: i for i, dst in ours}
    for path in outputs.values():
        assert path.resolve() in renamed, f"{path.name} did not take its name by a rename"
    for i, _ in ours:
        assert_atomic(log, i)
    checkpoints = [p.resolve() for p in ck.iterdir() if p.suffix == ".pt"]
    assert len(CheckpointManager(ck).complete()) >= 1 and checkpoints
    for p in checkpoints:
        digest = renamed[_io.digest_path(p)]
        assert renamed[p] < digest and ("fsync", ck.resolve()) in log[renamed[p] + 1 : digest]
    cold_file = next(p for p in cold.iterdir() if p.suffix == ".bin").resolve()
    mine = [k for k, e in enumerate(log) if e[0] in ("write", "fsync") and e[1] == cold_file]
    assert mine and log[mine[-1]] == ("fsync", cold_file)


def test_a_dataset_directory_is_durable_before_and_after_it_takes_its_name(tmp_path, calls):
    """The dataset writer builds the directory under a temporary name: its files and entries are fsynced before
    it is renamed into place, and the parent directory after (also when it replaces an earlier dataset)."""
    out = tmp_path / "ds"
    for overwrite in (False, True):
        calls.log.clear()
        generate(out, 300, seed=1, table_sizes=[20, 50], progress=False, overwrite=overwrite)
        i, src, dst = next(r for r in calls.replaces() if r[2] == out.resolve())
        meta = max(k for k, e in enumerate(calls.log[:i]) if e[0] == "replace" and e[2].parent == src)
        assert ("fsync", src) in calls.log[meta + 1 : i], "the directory's entries are not fsynced before"
        assert ("fsync", dst.parent) in calls.log[i + 1 :], "the parent is not fsynced after the rename"
        synced = {e[1] for e in calls.log[:i] if e[0] == "fsync"}
        assert {src / f.name for f in out.glob("*.npy")} <= synced  # (meta.json: an atomic write of its own)


def test_the_raw_criteo_text_of_a_synthetic_set_is_durable_before_it_takes_its_name(tmp_path, calls):
    """``generate(raw_tsv=...)`` writes the Criteo text under a temporary name: fsynced before the rename, the
    directory after."""
    tsv = tmp_path / "day_0.tsv"
    generate(tmp_path / "ds", 300, seed=1, table_sizes=[20] * 26, progress=False, raw_tsv=tsv)
    i = next(i for i, src, dst in calls.replaces() if dst == tsv.resolve())
    assert_atomic(calls.log, i)
