"""benchmarks/memlimit.py: a block's page cache held to a budget by a memory cgroup, checked with the kernel's own
counters (the cgroup's charged page cache, the process's cgroup before and after)."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import memlimit  # noqa: E402


def _memory_cgroup() -> str:
    return next(
        ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if "memory" in ln.split(":")[1]
    )


def test_page_cache_held_to_the_budget(tmp_path):
    path = tmp_path / "table.f32"
    np.ones(24 << 20, np.float32).tofile(path)  # 96 MiB
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if memlimit._v1_group() is None:
        with memlimit.page_cache_limit(8 << 20) as held:
            assert held.group is None and held.how.startswith("not limited: ") and held.stat() == {}
            assert held.hold() is None
        pytest.skip("no cgroup v1 memory hierarchy here: the block runs unlimited and says so (checked)")
    before = _memory_cgroup()
    with memlimit.page_cache_limit(8 << 20, headroom_bytes=8 << 20) as held:
        if held.group is None:
            pytest.skip(f"the memory cgroup could not be made here: {held.how}")
        assert _memory_cgroup() != before and held.limit_bytes is None  # in the new group, not limited yet
        heap = np.ones(4 << 20, np.float32)  # 16 MiB of heap charged to the group before the limit
        anon = held.stat()["rss"]
        limit = held.hold()
        assert limit == held.limit_bytes and anon + (16 << 20) <= limit <= anon + (16 << 20) + (4 << 20)
        assert held.how.startswith("held to 8 MiB (the DRAM budget; + 8 MiB headroom)")
        mm = np.memmap(path, np.float32, "r")
        total = float(mm.sum())  # every page of the 96 MiB file read through the mapping
        st = held.stat()
        del mm
    assert total == 24 << 20 and heap.sum() == 4 << 20
    # the kernel kept the group's page cache within what the limit left it, reclaiming as the read went on
    assert (
        0 < st["cache"] <= (16 << 20) + (4 << 20) and st["max_usage_in_bytes"] <= limit and st["failcnt"] > 0
    )
    assert _memory_cgroup() == before and not held.group.exists()  # back home, the group removed
