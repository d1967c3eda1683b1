"""The memory a run may take: the machine's MemAvailable and the cgroup limit the process lives under (v2
memory.max, v1 memory.limit_in_bytes), read from fixture cgroup trees, and once under a real cgroup v1 limit
where this machine lets a test make one."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hotline.training.host_memory import CgroupLimit, HostMemory, cgroup_limit, host_memory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import memlimit  # noqa: E402 - the cgroup helpers the benchmarks use

GIB, MIB = 1 << 30, 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def _write(path: Path, text) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")


def _v2(tmp_path, limits: dict[str, object], current: int, inactive_file: int = 0, hybrid: bool = False):
    """A cgroup v2 tree (``limits``: path -> memory.max) and a /proc/self/cgroup placing us in its deepest path."""
    root = tmp_path / "sys"
    unified = root / "unified" if hybrid else root
    _write(unified / "cgroup.controllers", "cpu memory")
    leaf = max(limits, key=len)
    for path, limit in limits.items():
        _write(unified / path.lstrip("/") / "memory.max", limit)
    _write(unified / leaf.lstrip("/") / "memory.current", current)
    _write(unified / leaf.lstrip("/") / "memory.stat", f"anon {current}\ninactive_file {inactive_file}")
    proc = tmp_path / "cgroup"
    _write(proc, f"0::{leaf}")
    return root, proc


def test_v2_limit_is_the_smallest_up_the_tree_less_what_is_in_use(tmp_path):
    root, proc = _v2(tmp_path, {"/": "max", "/jobs": 6 * GIB, "/jobs/run": "max"}, 2 * GIB, 512 * MIB)
    c = cgroup_limit(root, proc)
    assert c == CgroupLimit(6 * GIB, 2 * GIB - 512 * MIB, f"cgroup v2 {root / 'jobs' / 'memory.max'}")
    assert c.free == 6 * GIB - (2 * GIB - 512 * MIB)  # the reclaimable file pages count as free
    tighter, proc = _v2(tmp_path / "b", {"/jobs": 8 * GIB, "/jobs/run": 3 * GIB}, 0)
    assert cgroup_limit(tighter, proc).limit == 3 * GIB


def test_v2_below_a_hybrid_mount_and_no_limit(tmp_path):
    root, proc = _v2(tmp_path, {"/a": 4 * GIB}, GIB, hybrid=True)
    assert cgroup_limit(root, proc).limit == 4 * GIB
    root, proc = _v2(tmp_path / "none", {"/a": "max"}, GIB)
    assert cgroup_limit(root, proc) is None


def test_v1_limit_with_the_hierarchy_and_a_container_view(tmp_path):
    root = tmp_path / "sys"
    group = root / "memory" / "batch" / "job7"
    _write(group / "memory.limit_in_bytes", 9223372036854771712)  # unlimited here...
    _write(group / "memory.usage_in_bytes", 3 * GIB)
    _write(group / "memory.stat", f"cache 5\nhierarchical_memory_limit {6 * GIB}\ntotal_inactive_file {GIB}")
    proc = tmp_path / "cgroup"
    _write(proc, "9:name=systemd:/\n4:memory:/batch/job7\n0::/")
    c = cgroup_limit(root, proc)  # ...but an ancestor's 6 GiB binds
    assert (c.limit, c.used, c.free) == (6 * GIB, 2 * GIB, 4 * GIB)
    assert c.where == f"cgroup v1 {group / 'memory.limit_in_bytes'}"
    # inside a container the process's own cgroup is the hierarchy's root: the path is not visible there
    _write(root / "memory" / "memory.limit_in_bytes", 2 * GIB)
    _write(proc, "4:memory:/docker/abc123")
    assert cgroup_limit(root, proc).limit == 2 * GIB
    _write(root / "memory" / "memory.limit_in_bytes", 9223372036854771712)
    assert cgroup_limit(root, proc) is None  # unlimited
    assert cgroup_limit(tmp_path / "absent", tmp_path / "absent-proc") is None


def test_host_memory_takes_the_smaller_figure_and_names_both(tmp_path):
    meminfo = tmp_path / "meminfo"
    _write(meminfo, f"MemTotal: {32 * GIB // 1024} kB\nMemAvailable: {20 * GIB // 1024} kB")
    root, proc = _v2(tmp_path, {"/job": 6 * GIB}, GIB)
    m = host_memory(root, proc, meminfo)
    assert (m.machine, m.available, m.limited_by_cgroup) == (20 * GIB, 5 * GIB, True)
    assert m.describe() == (
        f"the 6 GiB memory limit of cgroup v2 {root / 'job' / 'memory.max'} (1 GiB of it in use, "
        "5 GiB free), below the machine's 20 GiB MemAvailable"
    )
    roomy = HostMemory(4 * GIB, m.cgroup)
    assert roomy.available == 4 * GIB and not roomy.limited_by_cgroup
    assert roomy.describe().startswith("4 GiB MemAvailable, below the 6 GiB memory limit of cgroup v2")
    assert (
        HostMemory(None).available is None
        and HostMemory(3).describe() == "3 B MemAvailable; no cgroup memory limit"
    )


def _tables(path, rows: int):
    from hotline.datasets.format import Dataset, DatasetWriter

    rng = np.random.default_rng(0)
    with DatasetWriter(path, [rows]) as w:
        for name, n in (("train", 256), ("val", 64), ("test", 64)):
            dense, sparse, labels = w.create_split(name, n)
            dense[:] = rng.random(dense.shape, np.float32)
            sparse[:] = rng.integers(0, rows, sparse.shape)
            labels[:] = rng.integers(0, 2, n)
        w.finish(source={"kind": "test", "seed": 0})
    return Dataset(path)


def test_check_memory_names_the_cgroup_and_what_to_change(tmp_path):
    from hotline import TrainConfig
    from hotline.training.preflight import MemoryShortfall, check_memory, memory_needed

    tables = _tables(tmp_path / "ds", 10_000_000)  # 2.38 GiB of rows at dim 64 with SGD
    cfg = TrainConfig(
        mode="hybrid", embedding_dim=64, bottom_mlp=[13, 64], top_mlp=[64, 1], mini_batch_size=128
    )
    limit = CgroupLimit(GIB, 100 * MIB, "cgroup v1 /sys/fs/cgroup/memory/job/memory.limit_in_bytes")
    check_memory(cfg, tables, available=HostMemory(64 * GIB, CgroupLimit(64 * GIB, 0, "cgroup v2 x")))
    with pytest.raises(MemoryShortfall) as e:
        check_memory(cfg, tables, available=HostMemory(64 * GIB, limit))
    line = str(e.value)
    assert "\n" not in line and line.startswith("this run needs about 2.38 GiB")
    assert memory_needed(cfg, tables) > GIB
    assert "the 1 GiB memory limit of cgroup v1 /sys/fs/cgroup/memory/job/memory.limit_in_bytes" in line
    assert "below the machine's 64 GiB MemAvailable" in line
    assert line.endswith("or one with more memory, or raise the cgroup's memory limit")


def test_train_under_a_real_cgroup_v1_limit_is_refused_before_writing(tmp_path):
    """``hotline train`` in a child memory cgroup limited to 1 GiB, with 2.4 GiB of rows: exit 2, one line naming
    the cgroup's limit and the machine's memory, before any output is written (the machine has room)."""
    with _child_cgroup("hotline-test", GIB) as group:
        ds = _tables(tmp_path / "ds", 10_000_000).path
        metrics = tmp_path / "metrics.jsonl"
        run = _run_in(group, ["-m", "hotline", "train", str(ds), "--arch-sparse-feature-size", "64",
                              "--arch-mlp-bot", "13-64", "--arch-mlp-top", "64-1", "--mode", "hybrid",
                              "--num-batches", "2", "--no-progress", "--metrics", str(metrics)])  # fmt: skip
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and lines[0].startswith("hotline train: error: this run needs about 2.38 GiB")
    assert f"the 1 GiB memory limit of cgroup v1 {group / 'memory.limit_in_bytes'}" in lines[0]
    assert "below the machine's" in lines[0] and "raise the cgroup's memory limit" in lines[0]
    assert not metrics.exists() or not metrics.read_text()


def test_clean_file_pages_on_either_lru_list_count_as_free(tmp_path):
    """A file read twice sits on the active list; the kernel still drops it before it kills anything, so it is
    free for the preflight; dirty and writeback pages are not (v1 and v2 names)."""
    root = tmp_path / "sys"
    group = root / "memory" / "job"
    _write(group / "memory.limit_in_bytes", 4 * GIB)
    _write(group / "memory.usage_in_bytes", 3 * GIB)
    _write(group / "memory.stat", f"total_active_file {2 * GIB}\ntotal_inactive_file {256 * MIB}\n"
                                  f"total_dirty {64 * MIB}\ntotal_writeback {64 * MIB}")  # fmt: skip
    proc = tmp_path / "cgroup"
    _write(proc, "4:memory:/job")
    assert cgroup_limit(root, proc).used == 3 * GIB - (2 * GIB + 256 * MIB - 128 * MIB)
    v2, proc2 = _v2(tmp_path / "b", {"/job": 4 * GIB}, 3 * GIB)
    _write(v2 / "job" / "memory.stat", f"active_file {GIB}\ninactive_file {GIB}\nfile_dirty {GIB // 2}")
    assert cgroup_limit(v2, proc2).used == 3 * GIB - (2 * GIB - GIB // 2)


def test_a_file_read_twice_under_a_real_cgroup_v1_limit_is_counted_free_and_is(tmp_path):
    """In a 512 MiB cgroup, a 320 MiB file written and read twice is charged to it on the active list: the
    preflight's free figure counts it, and an allocation of that much then succeeds (the kernel drops the file)."""
    with _child_cgroup("hotline-test-active", 512 * MIB) as group:
        run = _run_in(
            group, ["-c", _READ_TWICE.format(path=str(tmp_path / "f"), stat=str(group / "memory.stat"))]
        )
    assert run.returncode == 0, run.stderr
    (free, active), allocated = map(int, run.stdout.split()[:2]), int(run.stdout.split()[-1])
    assert active >= 256, run.stdout  # the file is on the active list, charged to this cgroup
    assert free >= 384, run.stdout  # counted free: not 512 - 320
    assert allocated == free - 64


@contextlib.contextmanager
def _child_cgroup(name: str, limit: int):
    """A child cgroup v1 memory group of ours limited to ``limit`` bytes, removed after; the test skips where
    none can be made (no v1 hierarchy, not root)."""
    parent = memlimit._v1_group()
    if parent is None or os.geteuid() != 0:
        pytest.skip("no cgroup v1 memory hierarchy this test may write to")
    group = parent / f"{name}-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup under {parent}: {e}")
    try:
        yield group
    finally:
        group.rmdir()


def _run_in(group: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """``python *argv`` inside ``group``."""
    procs = group / "cgroup.procs"
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=lambda: procs.write_text(str(os.getpid())),
    )  # fmt: skip


_READ_TWICE = """import os, numpy as np
from hotline.training.host_memory import cgroup_limit
path = {path!r}
with open(path, "wb") as f:
    for _ in range(20):
        f.write(os.urandom(16 << 20))
    f.flush(); os.fsync(f.fileno())
for _ in range(2):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
c = cgroup_limit()
stat = dict(line.split() for line in open({stat!r}))
print(c.free >> 20, int(stat["total_active_file"]) >> 20)
a = np.ones((c.free - (64 << 20)) // 8)
print("allocated", a.nbytes >> 20)
"""


def test_cold_cache_auto_takes_what_the_preflight_leaves(tmp_path):
    """``--cold-cache auto``: the memory the preflight lets the run take, less the hot budget, its hot table, the
    per-row structures, the look-ahead buffers and the dense model; the run so sized passes the preflight, a byte
    more of DRAM tier does not; 0 where nothing is left, or for the memory store; a size given stays."""
    from dataclasses import replace

    from hotline import TrainConfig
    from hotline.training.preflight import (
        AUTO_CACHE_SLACK,
        MemoryShortfall,
        check_dense_memory,
        memory_needed,
        positions_bytes,
        resolve_cold_cache,
    )

    ds = _tables(tmp_path / "ds", 1_000_000)
    cold = tmp_path / "cold"
    cold.mkdir()
    cfg = TrainConfig(mode="hotline", embedding_dim=8, bottom_mlp=[13, 8], top_mlp=[8, 1], mini_batch_size=64,
                      optimizer="rowwise-adagrad", hbm_budget=4 * MIB, cold_store="disk", cold_dir=str(cold),
                      cold_cache="auto")  # fmt: skip
    got = resolve_cold_cache(cfg, ds, memory=HostMemory(64 * GIB, CgroupLimit(2 * GIB, 0, "cgroup v1 x")))
    usable = int(0.9 * 2 * GIB) - 512 * MIB
    hot = 4 * MIB + 4 * MIB // 36 * 32  # the hot rows and their hot table
    # the positions: 8 bytes for each row outside the file's ascending run (hot, or counted by the profile)
    kept = 4 * MIB // 36 + 13  # the profile's sample: 5% of the 256 training samples, one lookup each
    assert positions_bytes(cfg, ds) == 8 * kept
    assert memory_needed(replace(cfg, cold_cache=0), ds) >= 8 * kept + hot
    assert 0 < got.cold_cache <= usable - 8 * kept - hot - AUTO_CACHE_SLACK
    assert (
        positions_bytes(replace(cfg, hbm_budget=64 * MIB), ds) == 4_000_000
    )  # a quarter of the rows: 4 a row
    check_dense_memory(got, ds, available=2 * GIB)  # what the Trainer checks next: passes
    with pytest.raises(MemoryShortfall):
        check_dense_memory(
            replace(got, cold_cache=got.cold_cache + AUTO_CACHE_SLACK + 1), ds, available=2 * GIB
        )
    assert resolve_cold_cache(cfg, ds, memory=600 * MIB).cold_cache == 0
    two = resolve_cold_cache(cfg, ds, memory=2 * GIB, local_ranks=2)  # two ranks of a machine share it
    assert 0 < two.cold_cache <= usable // 2 - 8 * kept - hot - AUTO_CACHE_SLACK
    assert resolve_cold_cache(replace(cfg, cold_cache=5), ds).cold_cache == 5
    mem = TrainConfig(mode="hotline", embedding_dim=8, bottom_mlp=[13, 8], top_mlp=[8, 1], cold_cache="auto")
    assert resolve_cold_cache(mem, ds).cold_cache == 0


def test_train_says_the_tier_cold_cache_auto_sized(tmp_path, capsys):
    """``hotline train --cold-cache auto`` prints one line: the DRAM tier's rows and bytes and the memory it was
    sized from; a size given prints none."""
    import re

    from hotline.cli import main
    from hotline.datasets.synthetic import generate
    from hotline.units import format_size

    ds = generate(tmp_path / "ds", 600, seed=2, table_sizes=[40_000, 300, 25], progress=False)
    argv = ["train", str(ds), "--mode", "hybrid", "--num-batches", "2", "--no-progress", "--cold-store", "disk",
            "--cold-dir", str(tmp_path)]  # fmt: skip
    assert main([*argv, "--cold-cache", "auto"]) == 0
    said = [ln for ln in capsys.readouterr().err.splitlines() if "--cold-cache auto" in ln]
    assert len(said) == 1, said
    record = 4 * (8 + 8)  # dim 8, Adagrad's state
    assert f"a DRAM tier of 40,325 rows ({format_size(40_325 * record)})" in said[0], said  # every row fits
    assert re.search(r"sized from [\d.]+ [KMG]iB available \(.*MemAvailable", said[0]), said
    assert main([*argv, "--cold-cache", "1MiB", "--force"]) == 0
    assert "--cold-cache auto" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["lots", -1, 1.5, True])
def test_a_bad_cold_cache_is_one_line(value):
    from hotline import TrainConfig

    with pytest.raises(
        ValueError, match=r"^--cold-cache must be a size >= 0 \(bytes, e.g. 2GiB\) or auto, got"
    ):
        TrainConfig(cold_cache=value)


_AUTO_RUN = """
import json
from dataclasses import replace
from hotline import TrainConfig
from hotline.datasets.synthetic import generate
from hotline.training.host_memory import host_memory
from hotline.training.preflight import dense_model_bytes, memory_needed
from hotline.training.trainer import Trainer
from hotline.datasets.format import Dataset
ds = Dataset(generate({data!r}, 1_000, seed=1, table_sizes=[3_000_000, 3_000_000], zipf=1.2, progress=False))
cfg = TrainConfig(mode="hotline", embedding_dim=8, bottom_mlp=[13, 8], top_mlp=[8, 1], mini_batch_size=64,
                  optimizer="rowwise-adagrad", hbm_budget=1 << 20, cold_store="disk", cold_dir={cold!r},
                  cold_cache="auto", num_batches=4, lookahead=2, progress=False, quiet=True)
memory = host_memory()
rest = memory_needed(replace(cfg, cold_cache=0), ds) + sum(dense_model_bytes(cfg, ds))
tr = Trainer(cfg, ds)
f = tr.mode.cold.host.file
before = f.cache.nbytes
for _ in tr.progress(tr.batches()):
    pass
print(json.dumps({{"limit": memory.cgroup.limit, "available": memory.available, "rest": rest,
                  "cache_bytes": tr.config.cold_cache, "cache_rows": f.cache_rows, "record": f.record,
                  "before": before, "after": f.cache.nbytes, "rows": f.num_rows}}))
tr.close()
"""


def test_cold_cache_auto_under_a_real_cgroup_v1_limit(tmp_path):
    """A disk-store run with ``cold_cache="auto"`` in a 1 GiB cgroup, 6 million rows (216 MB of rows and state):
    the tier it picks is what the cgroup leaves (its room read from the real cgroup, less the margin and what
    else the run holds), part of the file, its memory taken only at the first step (none after start-up), and
    the run trains inside the limit."""
    from hotline.training.preflight import AUTO_CACHE_SLACK, usable_memory

    cold = tmp_path / "cold"
    cold.mkdir()
    script = _AUTO_RUN.format(data=str(tmp_path / "ds"), cold=str(cold))
    with _child_cgroup("hotline-test-auto", GIB) as group:
        run = _run_in(group, ["-c", script])
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["limit"] == GIB and got["available"] < GIB - 64 * MIB, got  # the cgroup binds, python in use
    assert got["rest"] >= 2 * (1 << 20), got  # the hot budget, its hot table, the positions counted
    picked = usable_memory(got["available"]) - got["rest"] - AUTO_CACHE_SLACK
    assert 64 * MIB < got["cache_bytes"] and abs(got["cache_bytes"] - picked) < 32 * MIB, got
    assert got["cache_rows"] == got["cache_bytes"] // got["record"] < got["rows"], got
    assert got["before"] == 0 and got["after"] == got["cache_rows"] * got["record"], got
