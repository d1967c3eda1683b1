"""The allocator setting a Trainer makes (hotline._malloc): buffers a step frees are reused by the next step,
not unmapped and faulted in again. Measured as page faults (``ru_minflt``, which a busy machine does not
change), each setting in a child process of its own (the setting is process-wide and sticky)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from hotline._malloc import keep_freed_memory

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not keep_freed_memory(), reason="glibc only"
)

_STEPS = textwrap.dedent(
    """
    import resource, numpy as np
    from hotline._malloc import keep_freed_memory
    keep_freed_memory()
    MB = 1 << 20
    def step(k):  # buffers of a few sizes that change a little from step to step, as a step's do
        a = np.ones((6 + k % 3) * MB, np.uint8)
        b = np.ones((20 + k % 5) * MB, np.uint8)
        c = b[: (12 + k % 4) * MB] * 2
        del a
        d = np.ones((9 + k % 2) * MB, np.uint8)
        del b, c, d
    for k in range(5):
        step(k)
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for k in range(30):
        step(k)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 30)
    """
)


def _child(code: str, setting: str) -> str:
    env = {**os.environ, "HOTLINE_MALLOC": setting}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@glibc
def test_freed_buffers_are_reused_without_page_faults():
    """The same 30 steps of 6-24 MiB buffers: under 1% of the page faults of glibc's defaults (measured: 17
    per step against 1,868; every 4 KiB page of a buffer is one fault when it comes back from the kernel)."""
    tuned = float(_child(_STEPS, "tuned"))
    default = float(_child(_STEPS, "default"))
    assert default > 1000, f"glibc's defaults faulted only {default:.0f} pages per step: nothing to compare"
    assert tuned < default / 20, f"{tuned:.0f} page faults per step with the setting, {default:.0f} without"


@glibc
def test_a_trainer_makes_the_setting_and_it_can_be_declined(tmp_path):
    """Making a Trainer sets it (the benchmarks and the CLI train through a Trainer); HOTLINE_MALLOC=default
    declines it."""
    code = textwrap.dedent(
        """
        from hotline import TrainConfig, Trainer, _malloc
        from hotline.datasets.synthetic import generate
        data = generate(DIR, 256, seed=0, table_sizes=[50] * 26, progress=False)
        before = _malloc._done
        Trainer(TrainConfig(mode="device", mini_batch_size=64, progress=False), data).close()
        print(before, _malloc._done)
        """
    )
    for setting, made in (("tuned", "True"), ("default", "False")):
        assert _child(code.replace("DIR", repr(str(tmp_path / setting))), setting) == f"None {made}"
    assert keep_freed_memory() == keep_freed_memory()


def test_huge_zeros_is_a_zeroed_writable_array_of_the_shape_asked():
    """Large arrays get a mapping of their own; small ones are plain np.zeros; both zeroed and writable,
    and a copy keeps the values."""
    from hotline._malloc import HUGE_MIN_BYTES, huge_copy, huge_full, huge_zeros

    for shape, dtype in (((HUGE_MIN_BYTES // 256, 64), np.float32), (1000, np.int32), ((3, 5), np.int64)):
        a = huge_zeros(shape, dtype)
        assert a.shape == (shape if isinstance(shape, tuple) else (shape,)) and a.dtype == dtype
        assert a.flags.writeable and a.flags.c_contiguous and not a.any()
        a[-1] = 7
        b = huge_copy(a)
        assert np.array_equal(a, b) and b.dtype == dtype and not np.shares_memory(a, b)
        t = torch.from_numpy(a)  # the tiers wrap them as tensors, sharing the memory
        t[0] += 1
        assert a.flat[0] == 1
        full = huge_full(shape, -1, dtype)
        assert full.dtype == dtype and full.shape == a.shape and (full == -1).all()


def _huge_pages_of(a: np.ndarray) -> int:
    """KiB of transparent huge pages backing the mapping that holds ``a`` (from /proc/self/smaps)."""
    start = a.__array_interface__["data"][0]
    found = None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            found = lo <= start < hi
        elif found and line.startswith("AnonHugePages:"):
            return int(head[1])
    return 0


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
    or "[never]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read(),
    reason="no transparent huge pages on this kernel",
)
def test_large_tables_get_huge_pages():
    """An embedding table of 64 MiB, as initial_tables makes it for the tiers, is backed by 2 MiB pages once
    written (the kernel's own count in /proc/self/smaps), so random rows do not miss the TLB on every read."""
    from hotline.table_layout import TableLayout
    from hotline.tiers.base import initial_tables

    w = initial_tables(TableLayout([131_072, 131_072]), 64, seed=0)
    assert w.nbytes == 64 << 20
    assert _huge_pages_of(w) >= 32 << 10, f"{_huge_pages_of(w)} KiB of huge pages behind a 64 MiB table"
