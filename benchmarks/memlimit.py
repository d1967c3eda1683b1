"""Holds a benchmark's page cache to a DRAM budget: the process runs a block of code in a memory cgroup of its own.

The disk tier benchmark gives the disk store a DRAM budget (``--dram-budget``: the tables are many times what
the run may cache) and bypasses the page cache. A memory-mapped baseline with the whole machine's memory for
its page cache is another experiment: a table smaller than memory ends up cached and the baseline runs from
DRAM after its first pass. :func:`page_cache_limit` gives the baseline the same budget the way an operator
would: a cgroup's memory limit, which the kernel enforces by reclaiming the cgroup's page-cache pages.

cgroup v1 (the ``memory`` hierarchy, as on this machine): the process moves into a new child of its own memory
cgroup, unlimited at first, and runs its warm-up there, so the heap its steps grow is charged to the child. Pages
charged before the move stay with the old cgroup (v1 moves no charges by default). :meth:`Limit.hold` then sets
the child's limit to the anonymous memory charged to it so far plus the budget plus a small ``headroom``: what
the kernel can still give the block's new page cache is the budget (and the headroom the steps do not use).
On leaving, the process moves back and the child is removed (its remaining pages go to the parent). Needs write
access to the hierarchy (root here); elsewhere the block runs unlimited and the context manager says why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")


def _v1_group() -> Path | None:
    """This process's cgroup v1 memory directory, or None where there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            group = V1_ROOT / path.lstrip("/")
            return group if (group / "memory.limit_in_bytes").is_file() else None
    return None


class Limit:
    """What :func:`page_cache_limit` did: ``how`` (one line for the benchmark's JSON and table), the group, and
    once :meth:`hold` has set it, ``limit_bytes``; :meth:`stat` reads the group's figures."""

    def __init__(self, how: str, group: Path | None = None, budget: int = 0, headroom: int = 0):
        self.how = how
        self.group = group
        self.budget, self.headroom = int(budget), int(headroom)
        self.limit_bytes: int | None = None

    def stat(self) -> dict[str, int]:
        """The group's ``memory.stat`` (bytes of ``cache``, ``rss``: anonymous, ...), ``max_usage_in_bytes`` and
        ``failcnt`` (how often the limit made the kernel reclaim); empty without a group."""
        if self.group is None:
            return {}
        try:
            lines = (self.group / "memory.stat").read_text().splitlines()
            out = {k: int(v) for k, v in (ln.split() for ln in lines)}
            for name in ("max_usage_in_bytes", "failcnt"):
                out[name] = int((self.group / f"memory.{name}").read_text())
        except (OSError, ValueError):
            return {}
        return out

    def hold(self) -> int | None:
        """Limits the group to its anonymous memory now plus the budget plus the headroom (the page cache it
        holds now is reclaimed first); returns the limit in bytes, None without a group."""
        if self.group is None:
            return None
        st = self.stat()
        anon = st.get("rss", 0) + st.get("shmem", 0)
        self.limit_bytes = anon + self.budget + self.headroom
        (self.group / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
        self.how = (
            f"held to {self.budget / 2**20:,.0f} MiB (the DRAM budget; + {self.headroom / 2**20:,.0f} MiB "
            f"headroom) beside its {anon / 2**20:,.0f} MiB of heap, by a memory cgroup"
        )
        return self.limit_bytes


@contextlib.contextmanager
def page_cache_limit(budget_bytes: int, headroom_bytes: int = 64 << 20) -> Iterator[Limit]:
    """Runs the block in a memory cgroup of its own (see the module's docstring), unlimited until the block
    calls :meth:`Limit.hold`; yields the :class:`Limit` (its ``how`` says what held, or why nothing could)."""
    group = _v1_group()
    if group is None:
        yield Limit("not limited: no cgroup v1 memory hierarchy for this process")
        return
    child = group / f"hotline-bench-{os.getpid()}"
    try:
        child.mkdir()
    except OSError as e:
        yield Limit(f"not limited: cannot make a memory cgroup under {group} ({e.strerror or e})")
        return
    try:
        (child / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        child.rmdir()
        yield Limit(f"not limited: cannot join {child} ({e.strerror or e})")
        return
    try:
        yield Limit("not limited yet (Limit.hold not called)", child, budget_bytes, headroom_bytes)
    finally:
        (group / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):  # a page still charged to it keeps it a moment; the kernel retries
            child.rmdir()
